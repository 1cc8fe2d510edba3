"""Transformer-XL model: config, attention span, attention, memory, the decoding cache and the language model
(the loop that reads text with it in segments is :mod:`txl.segments`)."""

from txl.model.decoding import DecodingState, LayerCache
from txl.config import resolve_span, AttentionSpan, TransformerXLConfig
from txl.model.transformer import LMOutput, TransformerXLLM

__all__ = ["AttentionSpan", "DecodingState", "LMOutput", "LayerCache", "TransformerXLConfig", "TransformerXLLM", "resolve_span"]
