"""txl: Transformer-XL language models with segment-level memory (Dai et al. 2019)."""

from txl.errors import TxlError
from txl.model import LMOutput, TransformerXLConfig, TransformerXLLM

__version__ = "0.1.0"

__all__ = ["LMOutput", "TransformerXLConfig", "TransformerXLLM", "TxlError", "__version__"]
