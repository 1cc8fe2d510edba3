"""txl: Transformer-XL language models with segment-level memory (Dai et al. 2019).

``from txl import TransformerXLConfig, TransformerXLLM, load_checkpoint, generate, score`` — these
load torch on first use, so that the command line starts (and reports usage errors) without it.
"""

from txl.errors import TxlError as TxlError  # re-exported (the rest load lazily, below)

__version__ = "0.1.0"

_LAZY = {
    "AttentionSpan": "txl.model",
    "DecodingState": "txl.model",
    "LMOutput": "txl.model",
    "TransformerXLConfig": "txl.model",
    "TransformerXLLM": "txl.model",
    "load_checkpoint": "txl.training.checkpoint",
    "quantize_int8": "txl.kernels.int8",
    "generate": "txl.generation",
    "evaluate": "txl.evaluation.stream",
    "score": "txl.evaluation.scoring",
    "score_texts": "txl.evaluation.scoring",
    "score_tokens": "txl.evaluation.scoring",
}

__all__ = sorted([*_LAZY, "TxlError", "__version__"])


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'txl' has no attribute {name!r}")
