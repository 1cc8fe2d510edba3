"""Evaluation: the segment loop with memory, bpc/perplexity, sliding windows, scoring, dynamic evaluation
and memory sweeps."""
