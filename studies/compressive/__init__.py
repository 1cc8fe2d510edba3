"""Compressed memory (Rae et al. 2019) against plain memory at equal attention span and training budget:
the variants, their runs, tables and plot in :mod:`.run` (docs/compressive.md)."""
