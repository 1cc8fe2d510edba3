"""Generation with the Transformer-XL memory: the decoding rules, one object for every decoder
(:class:`DecodingRules`, :mod:`.sampling`), cached
token-by-token generation for batches of prompts (:mod:`.stream`; compiled steps: :mod:`.compiled`), beam search
(:mod:`.beam`) and text
out with stop strings and the completions of fine-tuned models (:mod:`.text`).

Everything public is importable from ``txl.generation``. The checks of the sampling and decoding
settings (``check_sampling``, ``check_decoding``) are :mod:`txl.config`'s, which the command line
imports without torch.
"""

from txl.generation.beam import BeamResult, beam_search, reorder_state
from txl.generation.sampling import (GREEDY, DecodingRules, Generators, LogitsProcessor, adjust_logits,
                                     banned_ngram_tokens, check_decoding, check_sampling, sample_next)
from txl.generation.stream import GenerationStep, generate, generate_steps, prime_memory, prime_rows, stream_text
from txl.generation.text import StopText, complete, continue_texts

__all__ = ["GREEDY", "BeamResult", "DecodingRules", "GenerationStep", "Generators", "LogitsProcessor", "StopText", "adjust_logits", "banned_ngram_tokens", "beam_search",
           "check_decoding", "check_sampling", "complete", "continue_texts", "generate", "generate_steps",
           "prime_memory", "prime_rows", "reorder_state", "sample_next", "stream_text"]
