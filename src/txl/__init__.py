"""txl: Transformer-XL language models with segment-level memory (Dai et al. 2019).

``from txl import TransformerXLConfig, TransformerXLLM`` — the model classes load torch on first use,
so that the command line starts (and reports usage errors) without it.
"""

from txl.errors import TxlError

__version__ = "0.1.0"

__all__ = ["LMOutput", "TransformerXLConfig", "TransformerXLLM", "TxlError", "__version__"]


def __getattr__(name: str):
    if name in ("LMOutput", "TransformerXLConfig", "TransformerXLLM"):
        from txl import model

        return getattr(model, name)
    raise AttributeError(f"module 'txl' has no attribute {name!r}")
