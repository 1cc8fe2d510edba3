"""Relative effective context length (the paper's section 4.3): ``txl recl`` (:mod:`.command`), the
per-context losses, gains and table in :mod:`.measure` (docs/research.md)."""
