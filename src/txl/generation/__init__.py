"""Generation with the Transformer-XL memory: sampling and decoding rules (:mod:`.sampling`), cached
token-by-token generation for batches of prompts (:mod:`.stream`), beam search (:mod:`.beam`) and text
out with stop strings and the completions of fine-tuned models (:mod:`.text`).

Everything public is importable from ``txl.generation``; the names load their module (and torch) on
first use, so that the torch-free argument checks of :mod:`.checks` can run before torch is imported.
"""

_LAZY = {
    "BeamResult": "beam", "beam_search": "beam", "reorder_state": "beam",
    "Generators": "sampling", "adjust_logits": "sampling", "banned_ngram_tokens": "sampling", "sample_next": "sampling",
    "check_decoding": "checks", "check_sampling": "checks",
    "GenerationStep": "stream", "generate": "stream", "generate_stream": "stream", "generate_steps": "stream",
    "prime_memory": "stream", "prime_rows": "stream", "stream_text": "stream",
    "StopText": "text", "complete": "text", "continue_texts": "text",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    """Import the module of a public name on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names too, before they are loaded."""
    return sorted(set(globals()) | set(_LAZY))
