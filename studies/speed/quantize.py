"""``txl bench --quantize int8``: int8 weights against float32, side by side in one run (docs/quantization.md).

Two models with the same weights (bench-small by default, random weights: speed does not depend on
them), one quantised with :func:`txl.kernels.int8.quantize_int8`, and on a CPU with native bfloat16 a
third with bfloat16 weights (:func:`txl.kernels.int8.to_bfloat16`), take turns:

- decoding: greedy tokens/s of txl's cached loop (the ring buffers) with ``mem_len`` = the context, at
  each batch size (the implementations alternate run by run, as :func:`txl_studies.speed.generation`
  does, so each finds its weights where a user's loop would); with ``compiled``, also the int8 model
  decoded as ``txl generate --compile --quantize int8`` does (the ring decoder of :mod:`txl.generation.compiled`
  under ``torch.compile``, compiled once per batch size before the timing);
- evaluation with memory: tokens/s of one segment of ``tgt_len`` tokens read after a memory of ``mem_len``
  (``txl eval``'s segment, in a decoding state), alternating call by call over ``repeats`` rounds; with
  ``compiled``, also the int8 model under ``torch.compile`` (``txl eval --compile --quantize int8``).

It also reports the bytes of weights a decoding step streams per token (every linear weight once per
step, the embedding's row; the scales with int8) and the bandwidth that time implies, for both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from txl_studies.speed.generation import _per_token_seconds, _txl_steps
from txl.runtime import compile_module
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.segments import decoding_state
from txl.kernels.int8 import Int8Linear, quantize_int8, to_bfloat16


def step_weight_bytes(model: TransformerXLLM) -> int:
    """Bytes of weights one decoding step reads per batch: every linear layer's weight (and scales), bias
    and the LayerNorms once, and one embedding row (the position table ``r_net`` reads is computed once per
    memory, not per token, and is left out)."""
    total = 0
    for name, module in model.named_modules():
        if name.endswith("r_net"):
            continue
        if isinstance(module, Int8Linear):
            total += module.weight.numel() + 4 * module.weight_scale.numel()
            total += 0 if module.bias is None else module.bias.numel() * module.bias.element_size()
        elif isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)):
            total += sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    emb = model.word_emb.emb_layers[0].weight
    return total + emb.size(1) * emb.element_size()


def _segment_seconds(models: dict[str, TransformerXLLM], batch: int, repeats: int,
                     compiled: dict[str, Callable] | None = None) -> dict[str, float]:
    """Median seconds of one evaluation segment (after a full memory) for each model, alternating call by call;
    ``compiled``: name -> a compiled model (``torch.compile`` of one of them), read as ``txl eval --compile``
    reads (the memory as hidden states)."""
    cfg = next(iter(models.values())).config
    torch.manual_seed(0)
    warm = torch.randint(0, cfg.vocab_size, (batch, cfg.mem_len))
    seg = torch.randint(0, cfg.vocab_size, (batch, cfg.tgt_len))
    calls: dict[str, Callable] = {}
    with torch.no_grad():
        for name, model in models.items():
            state = decoding_state(model, cfg.span)
            model(warm, caches=state)
            calls[name] = lambda m=model, s=state: m(seg, caches=s)
        for name, model in (compiled or {}).items():
            mems = model(warm).mems
            calls[name] = lambda m=model, h=mems: m(seg, mems=h)
        for call in calls.values():
            call()  # warm-up (compiles a compiled model)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def quantize_table(config: dict, *, batches=(1, 8), gen_tokens: int = 32, repeats: int = 5, bf16: bool = False,
                   compiled: bool | str = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """int8 (and with ``bf16`` bfloat16 weights, :func:`~txl.kernels.int8.to_bfloat16`) against float32 on
    this CPU: decoding and evaluation rows (see the module docstring).

    Returns ``{"config", "decoding": [rows], "evaluation": [rows], "bytes_per_step": {...}}``; a decoding
    row ``{"batch", "context", "float32_tokens_per_s", "int8_tokens_per_s", "ratio", "float32_gb_per_s",
    "int8_gb_per_s"}``, an evaluation row ``{"batch", "tgt_len", "mem_len", "float32_tokens_per_s",
    "int8_tokens_per_s", "ratio"}``; with ``bf16`` also ``bfloat16_tokens_per_s`` and ``bfloat16_ratio``
    (against float32) in every row; with ``compiled`` (True, or a ``torch.compile`` backend's name, e.g.
    "aot_eager" for a quick check), decoding rows also hold ``int8_compiled_tokens_per_s``,
    ``compiled_ratio`` (against float32's loop) and ``compile_seconds``, evaluation rows
    ``int8_compiled_tokens_per_s`` (the int8 model under ``torch.compile(fullgraph=True)``, as ``txl eval
    --compile --quantize int8`` reads) and ``compiled_ratio``.

    Raises:
        RuntimeError (torch's): with ``compiled``, when compilation fails (e.g. no C++ compiler for inductor).
    """
    import copy

    cfg = TransformerXLConfig(**{**config, "dropout": 0.0, "dropatt": 0.0})
    torch.manual_seed(0)
    fp = TransformerXLLM(cfg).eval()
    q = quantize_int8(copy.deepcopy(fp))
    models = {"float32": fp, "int8": q}
    if bf16:
        models["bfloat16"] = to_bfloat16(copy.deepcopy(fp))
    weight_bytes = {name: step_weight_bytes(m) for name, m in models.items()}
    out: dict[str, Any] = {"config": {k: v for k, v in config.items()}, "bytes_per_step": weight_bytes,
                           "decoding": [], "evaluation": []}
    context = cfg.mem_len
    for batch in batches:
        prompt = torch.randint(0, cfg.vocab_size, (batch, context))
        runs = {name: _txl_steps(m, context, "greedy") for name, m in models.items()}
        row = {"batch": batch, "context": context}
        if compiled:
            runs["int8_compiled"] = _txl_steps(q, context, "greedy", compile=compiled)
            log(f"decode batch {batch:2d}: compiling the int8 ring decoder (a minute or so)")
            start = time.perf_counter()
            for _ in runs["int8_compiled"](prompt, 2):  # both graphs, for this batch size
                pass
            row["compile_seconds"] = time.perf_counter() - start
        sec = _per_token_seconds(runs, prompt, gen_tokens, repeats, lambda: None)
        for name in models:
            row[f"{name}_tokens_per_s"] = batch / sec[name]
            row[f"{name}_gb_per_s"] = weight_bytes[name] / sec[name] / 1e9
        _ratios(row)
        if compiled:
            row["int8_compiled_tokens_per_s"] = batch / sec["int8_compiled"]
            row["compiled_ratio"] = row["int8_compiled_tokens_per_s"] / row["float32_tokens_per_s"]
        out["decoding"].append(row)
        log(f"decode batch {batch:2d} (mem_len {context}): float32 {row['float32_tokens_per_s']:8,.0f} tokens/s "
            f"({row['float32_gb_per_s']:.1f} GB/s of weights), int8 {row['int8_tokens_per_s']:8,.0f} tokens/s "
            f"({row['int8_gb_per_s']:.1f} GB/s): {row['ratio']:.2f}x" + _bf16_text(row)
            + (f"; int8 compiled {row['int8_compiled_tokens_per_s']:8,.0f}: {row['compiled_ratio']:.2f}x"
               if compiled else ""))
    for batch in batches:
        extra = {}
        if compiled:
            log(f"evaluate batch {batch:2d}: compiling the int8 model (a minute or so)")
            extra["int8_compiled"] = compile_module(q, fullgraph=True, backend=compiled if isinstance(compiled, str)
                                                    else None)
        sec = _segment_seconds(models, batch, repeats, extra)
        tokens = batch * cfg.tgt_len
        row = {"batch": batch, "tgt_len": cfg.tgt_len, "mem_len": cfg.mem_len,
               **{f"{name}_tokens_per_s": tokens / sec[name] for name in sec}}
        _ratios(row)
        if compiled:
            row["compiled_ratio"] = row["int8_compiled_tokens_per_s"] / row["float32_tokens_per_s"]
        out["evaluation"].append(row)
        log(f"evaluate batch {batch:2d} (tgt_len {cfg.tgt_len}, mem_len {cfg.mem_len}): float32 "
            f"{row['float32_tokens_per_s']:8,.0f} tokens/s, int8 {row['int8_tokens_per_s']:8,.0f}: {row['ratio']:.2f}x"
            + _bf16_text(row) + (f"; int8 compiled {row['int8_compiled_tokens_per_s']:8,.0f}: "
                                 f"{row['compiled_ratio']:.2f}x" if compiled else ""))
    return out


def _ratios(row: dict[str, Any]) -> None:
    row["ratio"] = row["int8_tokens_per_s"] / row["float32_tokens_per_s"]
    if "bfloat16_tokens_per_s" in row:
        row["bfloat16_ratio"] = row["bfloat16_tokens_per_s"] / row["float32_tokens_per_s"]


def _bf16_text(row: dict[str, Any]) -> str:
    if "bfloat16_tokens_per_s" not in row:
        return ""
    return f"; bfloat16 {row['bfloat16_tokens_per_s']:8,.0f}: {row['bfloat16_ratio']:.2f}x"
