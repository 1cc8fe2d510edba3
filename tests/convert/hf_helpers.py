"""What the tests against transformers' TransfoXL share."""

from txl.convert.hf_transfo_xl import config_from_hf, model_from_hf_state
from txl.model import TransformerXLLM


def hf_model_to_txl(model) -> TransformerXLLM:
    """Convert an in-memory ``transformers`` TransfoXLLMHeadModel."""
    return model_from_hf_state(config_from_hf(model.config.to_dict()), dict(model.state_dict()))
