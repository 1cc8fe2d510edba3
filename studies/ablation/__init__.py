"""The paper's Table 6 ablation (recurrence x positional encoding) at small scale: ``txl ablate``
(:mod:`.command`), the variants, training, evaluation and plot in :mod:`.table` (docs/research.md)."""
