"""Transformer-XL model: config, attention span, attention, memory and the language model."""

from txl.model.attention import LayerCache
from txl.model.config import TransformerXLConfig
from txl.model.span import AttentionSpan, resolve_span
from txl.model.transformer import LMOutput, TransformerXLLM

__all__ = ["AttentionSpan", "LMOutput", "LayerCache", "TransformerXLConfig", "TransformerXLLM", "resolve_span"]
