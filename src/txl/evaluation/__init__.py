"""Evaluation: the segment loop with memory, bits per byte/character or perplexity, sliding windows, scoring, dynamic evaluation
and memory sweeps."""
