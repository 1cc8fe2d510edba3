"""Evaluation: reading text with memory (through :mod:`txl.segments`), bits per byte/character or
perplexity, sliding windows, scoring, dynamic evaluation, memory sweeps, and classification metrics with bootstrap intervals (:mod:`txl.evaluation.intervals`)."""
