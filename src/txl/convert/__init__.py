"""Conversion between txl checkpoints and other Transformer-XL formats."""
