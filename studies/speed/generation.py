"""``txl bench`` generation: txl's memory against a GPT-2 KV cache holding the same context.

txl decodes with ``mem_len = C`` (its :class:`~txl.model.DecodingState`); GPT-2 (transformers
4.35.2, same depth, width, heads and vocabulary, ``n_positions`` large enough) decodes after a
prompt of C tokens with its key/value cache, so both attend to about C earlier tokens per step.
Per-token cost is isolated from the prompt and from the machine's other load: each model first
reads the prompt (untimed), then decodes n tokens, every step timed on its own; the models take
turns run by run (so each keeps its weights in cache between its steps, as a user's loop does), and
the median step over all repeats is kept, so the odd disturbed step moves neither. GPT-2 decodes with
its ``past_key_values`` cache in a plain loop (one forward of the newest token per step, no
``generate`` bookkeeping) and both pick tokens with the same function
(:func:`txl.generation.sample_next`), so the ratio compares the models' steps.
Units: generated tokens per second of wall time (all rows of the batch).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any, Callable

import torch

from txl.generation import generate_steps, sample_next
from txl.model import TransformerXLConfig, TransformerXLLM

GEN_CONTEXTS = (128, 512)
GEN_BATCHES = (1, 8, 32)
GEN_MODES = ("greedy", "top_p")
TOP_P = 0.9


def gpt2_twin(c: TransformerXLConfig, n_positions: int = 2048):
    """A transformers GPT-2 with ``c``'s number of layers, width, heads, inner size and vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=c.vocab_size, n_positions=n_positions, n_embd=c.d_model, n_layer=c.n_layer,
                     n_head=c.n_head, n_inner=c.d_inner, eos_token_id=None, pad_token_id=None)
    return GPT2LMHeadModel(cfg)


def _sampling(mode: str, device: torch.device) -> dict[str, Any]:
    if mode == "greedy":
        return dict(temperature=0)
    return dict(temperature=1.0, top_p=TOP_P, generator=torch.Generator(device).manual_seed(0))


def _txl_steps(model: TransformerXLLM, context: int, mode: str,
               compile: bool | str = False) -> Callable[[torch.Tensor, int], Iterator]:
    """Yields once after reading the prompt and its first token, then once per decoding step (``compile``:
    as ``generate_steps`` takes it, the compiled ring decoder)."""
    span = model.config.span.replace(mem_len=context)
    return lambda prompt, n: generate_steps(model, prompt, n + 1, span=span, compile=compile,
                                            **_sampling(mode, prompt.device))


def _gpt2_steps(model, mode: str) -> Callable[[torch.Tensor, int], Iterator]:
    """GPT-2's cached decoding loop; yields as :func:`_txl_steps` does."""
    @torch.no_grad()
    def steps(prompt: torch.Tensor, n: int) -> Iterator[None]:
        sampling = _sampling(mode, prompt.device)
        out = model(input_ids=prompt, use_cache=True)
        token = sample_next(out.logits[:, -1], **sampling)
        yield
        for _ in range(n):
            out = model(input_ids=token[:, None], past_key_values=out.past_key_values, use_cache=True)
            token = sample_next(out.logits[:, -1], **sampling)
            yield
    return steps


def _per_token_seconds(runs: dict[str, Callable], prompt: torch.Tensor, n: int, repeats: int,
                       sync: Callable[[], None]) -> dict[str, float]:
    """Median seconds per decoding step (all rows) of each implementation over ``repeats`` runs of n
    steps. The implementations take turns run by run, not step by step: a decoding loop runs one
    model, whose weights stay in the CPU's cache between its steps; a step after the other model's
    step would find them evicted and measure a cold cache neither user sees."""
    import time

    steps: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, make in runs.items():
            it = make(prompt, n)
            next(it)  # the prompt and the first token: not timed
            for _ in range(n):
                sync()
                start = time.perf_counter()
                next(it)
                sync()
                steps[name].append(time.perf_counter() - start)
            it.close()
    return {name: max(1e-9, statistics.median(t)) for name, t in steps.items()}


def generation_table(config: dict, *, device: torch.device, contexts=GEN_CONTEXTS, batches=GEN_BATCHES,
                     modes=GEN_MODES, gen_tokens: int = 32, repeats: int = 3, with_gpt2: bool = True,
                     sync: Callable[[], None] = lambda: None, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """txl against GPT-2's KV cache at equal context C, for every (C, batch, mode).

    Returns rows ``{"context", "batch", "mode", "txl_tokens_per_s", "gpt2_tokens_per_s", "ratio"}``
    (ratio = txl / GPT-2; mode "greedy" or "top_p" with p = 0.9 at temperature 1). Without
    ``with_gpt2`` only txl is measured (no transformers needed) and the GPT-2 fields are None.
    """
    cfg = TransformerXLConfig(**{**config, "dropout": 0.0, "dropatt": 0.0})
    torch.manual_seed(0)
    ours = TransformerXLLM(cfg).to(device).eval()
    theirs = None
    if with_gpt2:
        torch.manual_seed(0)
        theirs = gpt2_twin(cfg, n_positions=max(2048, max(contexts) + gen_tokens + 8)).to(device).eval()
    rows = []
    for context in contexts:
        for batch in batches:
            prompt = torch.randint(0, cfg.vocab_size, (batch, context), device=device)
            for mode in modes:
                runs = {"txl": _txl_steps(ours, context, mode)}
                if theirs is not None:
                    runs["gpt2"] = _gpt2_steps(theirs, mode)
                sec = _per_token_seconds(runs, prompt, gen_tokens, repeats, sync)
                row = {"context": context, "batch": batch, "mode": mode, "txl_tokens_per_s": batch / sec["txl"],
                       "gpt2_tokens_per_s": batch / sec["gpt2"] if "gpt2" in sec else None}
                row["ratio"] = row["txl_tokens_per_s"] / row["gpt2_tokens_per_s"] if "gpt2" in sec else None
                rows.append(row)
                versus = (f"  gpt2 {row['gpt2_tokens_per_s']:8,.0f} tokens/s  ({row['ratio']:.2f}x)"
                          if "gpt2" in sec else " tokens/s")
                log(f"generate C={context:4d} batch {batch:2d} {mode:6s}: txl {row['txl_tokens_per_s']:8,.0f}{versus}")
    return rows


def generation_lengths(config: dict, lengths: list[int], *, device: torch.device, batch: int = 1,
                       gen_tokens: int = 32, repeats: int = 3, with_gpt2: bool = True, sync: Callable[[], None] = lambda: None,
                       log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Greedy tokens/s against the length L attended to: txl with ``mem_len = L``, GPT-2 after L tokens.

    txl's cost per token depends on ``mem_len`` only (never on how much text came before); GPT-2's
    on the length of its cache, which grows with the text. Returns rows ``{"length", "batch",
    "txl_tokens_per_s", "gpt2_tokens_per_s", "ratio"}``.
    """
    rows = []
    for length in lengths:
        (row,) = generation_table(config, device=device, contexts=(length,), batches=(batch,), modes=("greedy",),
                                  gen_tokens=gen_tokens, repeats=repeats, with_gpt2=with_gpt2, sync=sync,
                                  log=lambda _: None)
        rows.append({"length": length, "batch": batch, "txl_tokens_per_s": row["txl_tokens_per_s"],
                     "gpt2_tokens_per_s": row["gpt2_tokens_per_s"], "ratio": row["ratio"]})
        versus = (f"  gpt2 {row['gpt2_tokens_per_s']:8,.1f} tokens/s  ({row['ratio']:.2f}x)" if row["ratio"]
                  else " tokens/s")
        log(f"generate L={length:5d} batch {batch}: txl {row['txl_tokens_per_s']:8,.1f}{versus}")
    return rows


def format_generation(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`generation_table` rows."""
    lines = ["| context C | batch | mode | txl tokens/s | GPT-2 tokens/s | txl/GPT-2 |", "|---|---|---|---|---|---|"]
    for r in rows:
        theirs, ratio = r["gpt2_tokens_per_s"], r["ratio"]
        lines.append(f"| {r['context']} | {r['batch']} | {r['mode']} | {r['txl_tokens_per_s']:,.0f} | "
                     + (f"{theirs:,.0f} | {ratio:.2f}x |" if ratio else "— | — |"))
    return "\n".join(lines)
