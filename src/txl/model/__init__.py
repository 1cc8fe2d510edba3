"""Transformer-XL model: config, attention, memory and the language model."""

from txl.model.config import TransformerXLConfig
from txl.model.transformer import LMOutput, TransformerXLLM

__all__ = ["LMOutput", "TransformerXLConfig", "TransformerXLLM"]
