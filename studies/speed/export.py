"""``txl bench --export``: the exported decoder (``txl export``) run by ONNX Runtime against txl's eager
decoding, side by side in one run (docs/export.md).

One model (bench-small by default, random weights) is exported to ONNX in a temporary folder; then,
for each batch size, greedy decoding after a prompt of ``mem_len`` tokens (so the memory is full and
the ring rotates) is timed step by step, the implementations taking turns run by run (as
:mod:`txl_studies.speed.generation` does):

- ``txl``: txl's own loop (:func:`txl.generation.generate_steps`, the ring buffers of a decoding state);
- ``onnxruntime``: :class:`txl_recipes.export.runner.ExportedDecoder` (the step graph in ONNX Runtime, the new
  key and value written into the ring in place by the runner), with as many threads as torch;
- ``onnxruntime int8``: the same export with ``--quantize int8`` (ONNX Runtime's dynamic int8 products,
  :func:`txl_recipes.export.files.quantize_onnx_graph`), and how many of its greedy tokens equal txl's;
- ``graphs eager``: the same step module run by PyTorch without export, after the model's own reading of
  the prompt (:class:`~txl.generation.compiled.RingDecoder`: what the step graph computes, with PyTorch's kernels).

The prompt fills S - 2 of the ring's S = ``mem_len + 1`` slots; from the second timed step on the ring
is full and rotates. Each implementation's time per token is the median of all its timed steps
(``gen_tokens`` × ``repeats``).

Units: generated tokens per second of wall time (all rows of the batch); ratios against ``txl``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from txl_studies.speed.generation import _per_token_seconds, _txl_steps
from txl_recipes.export.files import export_decoder
from txl.kernels.cpu import check_reading_fits
from txl.generation.compiled import RingDecoder
from txl_recipes.export.runner import ExportedDecoder
from txl.generation import generate
from txl.model import TransformerXLConfig, TransformerXLLM


def _runner_steps(decoder) -> Callable[[torch.Tensor, int], Iterator]:
    """Greedy steps of an :class:`ExportedDecoder`-like object; yields after the prompt's first token, then per step."""
    def steps(prompt: torch.Tensor, n: int) -> Iterator[None]:
        ring = decoder.read_prompt(prompt.numpy())
        ring.last = decoder.step(ring).argmax(-1).astype(np.int64)[:, None]
        yield
        for _ in range(n):
            ring.last = decoder.step(ring).argmax(-1).astype(np.int64)[:, None]
            yield
    return steps


def _ring_steps(model: TransformerXLLM, span) -> Callable[[torch.Tensor, int], Iterator]:
    """Greedy steps of the same step module run by PyTorch (:class:`~txl.generation.compiled.RingDecoder`, no export)."""
    def steps(prompt: torch.Tensor, n: int) -> Iterator[None]:
        check_reading_fits(model, prompt[:, :-1], span)
        ring = RingDecoder(model, span)
        ring.read_prompt(prompt[:, :-1])
        last = ring.step(prompt[:, -1:]).argmax(-1, keepdim=True)
        yield
        for _ in range(n):
            last = ring.step(last).argmax(-1, keepdim=True)
            yield
    return steps


def export_table(config: dict, *, batches=(1, 8), gen_tokens: int = 32, repeats: int = 5,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """ONNX Runtime against txl eager, greedy decoding at each batch size (see the module doc), float32, CPU.

    Returns ``{"config", "gen_tokens", "repeats", "versions", "export_seconds", "decoding": [rows]}``; a row ``{"batch", "context",
    "txl_tokens_per_s", "onnxruntime_tokens_per_s", "onnxruntime_int8_tokens_per_s", "graphs_eager_tokens_per_s",
    "ratio_onnxruntime", "ratio_onnxruntime_int8", "ratio_graphs_eager", "int8_greedy_agreement"}`` (ratios
    against txl; the agreement: the fraction of ``gen_tokens`` greedy tokens per row equal to txl's float32 ones
    after the same prompt, random weights).

    Raises:
        ImportError: onnx/onnxscript/onnxruntime missing (the ``export`` extra; ``txl bench --export`` says so
            in one line before it starts).
    """
    import time

    import onnxruntime

    config = {**config, "dropout": 0.0, "dropatt": 0.0}
    cfg = TransformerXLConfig(**config)
    torch.manual_seed(0)
    model = TransformerXLLM(cfg).eval()
    span = cfg.span
    out: dict[str, Any] = {"config": config, "gen_tokens": gen_tokens, "repeats": repeats,
                           "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
                           "decoding": []}
    with tempfile.TemporaryDirectory() as tmp:
        vocab = Path(tmp) / "vocab.json"
        vocab.write_text("{}")
        start = time.perf_counter()
        export_decoder(model, vocab, Path(tmp) / "onnx", span, "onnx")
        out["export_seconds"] = time.perf_counter() - start
        export_decoder(model, vocab, Path(tmp) / "int8", span, "onnx", quantize="int8")
        decoder = ExportedDecoder(Path(tmp) / "onnx", threads=torch.get_num_threads())
        int8 = ExportedDecoder(Path(tmp) / "int8", threads=torch.get_num_threads())
        for batch in batches:
            prompt = torch.randint(0, cfg.vocab_size, (batch, span.mem_len))
            runs = {"txl": _txl_steps(model, span.mem_len, "greedy"), "onnxruntime": _runner_steps(decoder),
                    "onnxruntime_int8": _runner_steps(int8), "graphs_eager": _ring_steps(model, span)}
            sec = _per_token_seconds(runs, prompt, gen_tokens, repeats, lambda: None)
            row: dict[str, Any] = {"batch": batch, "context": span.mem_len}
            for name in runs:
                row[f"{name}_tokens_per_s"] = batch / sec[name]
            for name in ("onnxruntime", "onnxruntime_int8", "graphs_eager"):
                row[f"ratio_{name}"] = sec["txl"] / sec[name]
            want = generate(model, prompt, gen_tokens, temperature=0)[:, span.mem_len:].numpy()
            row["int8_greedy_agreement"] = float((int8.greedy(prompt.numpy(), gen_tokens)[:, span.mem_len:] == want).mean())
            out["decoding"].append(row)
            log(f"decode batch {batch:2d} (mem_len {span.mem_len}): txl {row['txl_tokens_per_s']:8,.0f} tokens/s, "
                f"ONNX Runtime {row['onnxruntime_tokens_per_s']:8,.0f} ({row['ratio_onnxruntime']:.2f}x), "
                f"int8 {row['onnxruntime_int8_tokens_per_s']:8,.0f} ({row['ratio_onnxruntime_int8']:.2f}x, "
                f"{row['int8_greedy_agreement']:.0%} of greedy tokens as float32), "
                f"graphs eager {row['graphs_eager_tokens_per_s']:8,.0f} ({row['ratio_graphs_eager']:.2f}x)")
    return out
