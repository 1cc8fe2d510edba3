"""``txl bench --compile``: the model under ``torch.compile`` against eager, side by side in one run
(docs/compile.md).

One model (bench-small by default, random weights: speed does not depend on them) is timed eager and
compiled (inductor, the default backend, ``fullgraph=True``: the model is one graph), call by call in
turn over ``repeats`` rounds, after the compiled one has been compiled and warmed up:

- training: one segment of ``tgt_len`` tokens after a full memory of ``mem_len``, forward and backward
  (train mode: dropout on), the gradients cleared between calls;
- evaluation: the same segment without autograd, eager as ``txl eval`` reads it (keys and values of
  the memory kept in a decoding state) and eager with the hidden-state memory (what the compiled model
  reads), against the compiled hidden-state reading;
- decoding: greedy tokens after a prompt of ``mem_len`` tokens at batch 1 and 8, txl's eager loop against
  ``generate(..., compile=True)`` (the fixed-shape ring step of :mod:`txl.model.graphs`), step by step.

Each row reports tokens/s and the ratio compiled / eager; the compilation's own seconds are reported
too (paid once per segment shape).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from txl.model import TransformerXLConfig, TransformerXLLM
from txl.segments import decoding_state
from txl.runtime import compile_module


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _alternate(calls: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each call, taking them in turn for ``repeats`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            _sync(device)
            start = time.perf_counter()
            call()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def compile_table(config: dict, *, batch: int = 8, repeats: int = 5, device: torch.device | str = "cpu",
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Eager against compiled on ``device`` (float32): training, evaluation and decoding rows (see the module docstring).

    Returns ``{"config", "batch", "compile_seconds": {"training", "evaluation"}, "training": row,
    "evaluation": row, "decoding": rows}`` (rows of :func:`decoding_rows`); the training row ``{"eager_tokens_per_s", "compiled_tokens_per_s", "ratio"}``,
    the evaluation row the same plus ``"eager_hidden_tokens_per_s"`` (eager reading the memory as hidden
    states) and ``"ratio_vs_hidden"``.

    Raises:
        TxlError: an impossible ``config``; RuntimeError (torch's) when compilation fails, e.g. no C++
            compiler for inductor on a CPU (the CLI turns it into one line).
    """
    device = torch.device(device)
    cfg = TransformerXLConfig(**config)
    torch.manual_seed(0)
    model = TransformerXLLM(cfg).to(device)
    compiled = compile_module(model, fullgraph=True)
    seg = torch.randint(0, cfg.vocab_size, (batch, cfg.tgt_len), device=device)
    labels = torch.randint(0, cfg.vocab_size, (batch, cfg.tgt_len), device=device)
    tokens = batch * cfg.tgt_len
    out: dict[str, Any] = {"config": dict(config), "batch": batch, "compile_seconds": {}}

    with torch.no_grad():
        mems = [torch.randn(batch, cfg.mem_len, cfg.d_model, device=device) for _ in range(cfg.n_layer)]

    def train_call(module) -> Callable[[], object]:
        def call():
            module(seg, mems=mems, labels=labels).loss.mean().backward()
            model.zero_grad(set_to_none=True)
        return call

    model.train()
    start = time.perf_counter()
    train_call(compiled)()
    _sync(device)
    out["compile_seconds"]["training"] = time.perf_counter() - start
    train_call(compiled)()
    sec = _alternate({"eager": train_call(model), "compiled": train_call(compiled)}, repeats, device)
    out["training"] = {"eager_tokens_per_s": tokens / sec["eager"], "compiled_tokens_per_s": tokens / sec["compiled"],
                       "ratio": sec["eager"] / sec["compiled"]}
    row = out["training"]
    log(f"train    batch {batch} (tgt_len {cfg.tgt_len}, mem_len {cfg.mem_len}): eager {row['eager_tokens_per_s']:8,.0f} "
        f"tokens/s, compiled {row['compiled_tokens_per_s']:8,.0f}: {row['ratio']:.2f}x "
        f"(compiling: {out['compile_seconds']['training']:.0f} s)")

    model.eval()
    with torch.no_grad():
        state = decoding_state(model, cfg.span)
        model(torch.randint(0, cfg.vocab_size, (batch, cfg.mem_len), device=device), caches=state)  # full memory
        start = time.perf_counter()
        compiled(seg, mems=mems)
        _sync(device)
        out["compile_seconds"]["evaluation"] = time.perf_counter() - start
        model(seg, caches=state)

        def with_state():
            model(seg, caches=state)

        sec = _alternate({"eager": with_state, "eager_hidden": lambda: model(seg, mems=mems),
                          "compiled": lambda: compiled(seg, mems=mems)}, repeats, device)
    out["evaluation"] = {"eager_tokens_per_s": tokens / sec["eager"],
                         "eager_hidden_tokens_per_s": tokens / sec["eager_hidden"],
                         "compiled_tokens_per_s": tokens / sec["compiled"], "ratio": sec["eager"] / sec["compiled"],
                         "ratio_vs_hidden": sec["eager_hidden"] / sec["compiled"]}
    row = out["evaluation"]
    log(f"evaluate batch {batch} (tgt_len {cfg.tgt_len}, mem_len {cfg.mem_len}): eager {row['eager_tokens_per_s']:8,.0f} "
        f"tokens/s (decoding state; {row['eager_hidden_tokens_per_s']:,.0f} with the hidden-state memory), compiled "
        f"{row['compiled_tokens_per_s']:8,.0f}: {row['ratio']:.2f}x ({row['ratio_vs_hidden']:.2f}x the hidden-state "
        f"reading; compiling: {out['compile_seconds']['evaluation']:.0f} s)")
    out["decoding"] = decoding_rows(model, repeats=repeats, device=device, log=log)
    return out


def decoding_rows(model: TransformerXLLM, *, batches=(1, 8), gen_tokens: int = 32, repeats: int = 5,
                  device: torch.device | str = "cpu", log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Greedy decoding after a prompt of ``mem_len`` tokens: txl's eager loop (the decoding state's ring
    buffers) against ``generate(..., compile=True)`` (the ring step of :mod:`txl.model.graphs` under inductor),
    timed step by step, taking turns run by run (:func:`txl_studies.speed.generation._per_token_seconds`).

    Returns rows ``{"batch", "context", "eager_tokens_per_s", "compiled_tokens_per_s", "ratio",
    "compile_seconds"}`` (ratio = compiled / eager speed; the compilation of one batch size's graphs).
    """
    from txl_studies.speed.generation import _per_token_seconds
    from txl.generation import generate_steps

    device = torch.device(device)
    span = model.config.span
    rows = []
    for batch in batches:
        prompt = torch.randint(0, model.config.vocab_size, (batch, span.mem_len), device=device)
        start = time.perf_counter()
        for _ in generate_steps(model, prompt, 2, temperature=0, span=span, compile=True):  # compiles this batch size
            pass
        compile_s = time.perf_counter() - start
        runs = {"eager": lambda p, n: generate_steps(model, p, n + 1, temperature=0, span=span),
                "compiled": lambda p, n: generate_steps(model, p, n + 1, temperature=0, span=span, compile=True)}
        sec = _per_token_seconds(runs, prompt, gen_tokens, repeats, lambda: _sync(device))
        row = {"batch": batch, "context": span.mem_len, "eager_tokens_per_s": batch / sec["eager"],
               "compiled_tokens_per_s": batch / sec["compiled"], "ratio": sec["eager"] / sec["compiled"],
               "compile_seconds": compile_s}
        rows.append(row)
        log(f"decode   batch {batch} (mem_len {span.mem_len}): eager {row['eager_tokens_per_s']:8,.0f} tokens/s, "
            f"compiled {row['compiled_tokens_per_s']:8,.0f}: {row['ratio']:.2f}x (compiling: {compile_s:.0f} s)")
    return rows
