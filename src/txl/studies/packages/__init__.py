"""Which standard-library package a piece of source comes from: the data of the long-document
classification benchmark (``txl data packages``, docs/classification.md); its runner and baselines
are ``benchmarks/classification.py``."""
