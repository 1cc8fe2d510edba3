"""``txl bench --quantize int8``: int8 weights against float32, side by side in one run (docs/quantization.md).

Two models with the same weights (bench-small by default, random weights: speed does not depend on
them), one quantised with :func:`txl.model.quantize.quantize_int8`, and on a CPU with native bfloat16 a
third with bfloat16 weights (:func:`txl.model.quantize.to_bfloat16`), take turns:

- decoding: greedy tokens/s of txl's cached loop (the ring buffers) with ``mem_len`` = the context, at
  each batch size (the implementations alternate run by run, as :func:`txl.analysis.bench_generation`
  does, so each finds its weights where a user's loop would);
- evaluation with memory: tokens/s of one segment of ``tgt_len`` tokens read after a memory of ``mem_len``
  (``txl eval``'s segment, in a decoding state), alternating call by call over ``repeats`` rounds.

It also reports the bytes of weights a decoding step streams per token (every linear weight once per
step, the embedding's row; the scales with int8) and the bandwidth that time implies, for both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from txl.analysis.bench_generation import _per_token_seconds, _txl_steps
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.model.segments import decoding_state
from txl.model.quantize import Int8Linear, quantize_int8, to_bfloat16


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


def _segment_seconds(models: dict[str, TransformerXLLM], batch: int, repeats: int) -> dict[str, float]:
    """Median seconds of one evaluation segment (after a full memory) for each model, alternating call by call."""
    cfg = next(iter(models.values())).config
    torch.manual_seed(0)
    warm = torch.randint(0, cfg.vocab_size, (batch, cfg.mem_len))
    seg = torch.randint(0, cfg.vocab_size, (batch, cfg.tgt_len))
    states = {}
    with torch.no_grad():
        for name, model in models.items():
            states[name] = decoding_state(model, cfg.span)
            model(warm, caches=states[name])
            model(seg, caches=states[name])  # warm-up
        times: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                start = time.perf_counter()
                model(seg, caches=states[name])
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def quantize_table(config: dict, *, batches=(1, 8), gen_tokens: int = 32, repeats: int = 5, bf16: bool = False,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """int8 (and with ``bf16`` bfloat16 weights, :func:`~txl.model.quantize.to_bfloat16`) against float32 on
    this CPU: decoding and evaluation rows (see the module docstring).

    Returns ``{"config", "decoding": [rows], "evaluation": [rows], "bytes_per_step": {...}}``; a decoding
    row ``{"batch", "context", "float32_tokens_per_s", "int8_tokens_per_s", "ratio", "float32_gb_per_s",
    "int8_gb_per_s"}``, an evaluation row ``{"batch", "tgt_len", "mem_len", "float32_tokens_per_s",
    "int8_tokens_per_s", "ratio"}``; with ``bf16`` also ``bfloat16_tokens_per_s`` and ``bfloat16_ratio``
    (against float32) in every row.
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
        sec = _per_token_seconds(runs, prompt, gen_tokens, repeats, lambda: None)
        row = {"batch": batch, "context": context}
        for name in models:
            row[f"{name}_tokens_per_s"] = batch / sec[name]
            row[f"{name}_gb_per_s"] = weight_bytes[name] / sec[name] / 1e9
        _ratios(row)
        out["decoding"].append(row)
        log(f"decode batch {batch:2d} (mem_len {context}): float32 {row['float32_tokens_per_s']:8,.0f} tokens/s "
            f"({row['float32_gb_per_s']:.1f} GB/s of weights), int8 {row['int8_tokens_per_s']:8,.0f} tokens/s "
            f"({row['int8_gb_per_s']:.1f} GB/s): {row['ratio']:.2f}x" + _bf16_text(row))
    for batch in batches:
        sec = _segment_seconds(models, batch, repeats)
        tokens = batch * cfg.tgt_len
        row = {"batch": batch, "tgt_len": cfg.tgt_len, "mem_len": cfg.mem_len,
               **{f"{name}_tokens_per_s": tokens / sec[name] for name in models}}
        _ratios(row)
        out["evaluation"].append(row)
        log(f"evaluate batch {batch:2d} (tgt_len {cfg.tgt_len}, mem_len {cfg.mem_len}): float32 "
            f"{row['float32_tokens_per_s']:8,.0f} tokens/s, int8 {row['int8_tokens_per_s']:8,.0f}: {row['ratio']:.2f}x"
            + _bf16_text(row))
    return out


def _ratios(row: dict[str, Any]) -> None:
    row["ratio"] = row["int8_tokens_per_s"] / row["float32_tokens_per_s"]
    if "bfloat16_tokens_per_s" in row:
        row["bfloat16_ratio"] = row["bfloat16_tokens_per_s"] / row["float32_tokens_per_s"]


def _bf16_text(row: dict[str, Any]) -> str:
    if "bfloat16_tokens_per_s" not in row:
        return ""
    return f"; bfloat16 {row['bfloat16_tokens_per_s']:8,.0f}: {row['bfloat16_ratio']:.2f}x"
