"""``txl bench``: throughput and memory of txl, side by side with the transformers TransfoXL reference.

Everything is measured in one run, alternating implementations, as the median of several repeats
after warm-up, so that ratios stay meaningful on a shared, noisy machine. Units: tokens/s (target
tokens processed per second of wall time), MB of peak memory (resident set size on CPU, max
allocated on GPU), FLOP/s from an analytic count of the matmul work.
"""

from __future__ import annotations

import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import torch

from txl.config import DTYPES
from txl.errors import TxlError
from txl_studies.speed.generation import GEN_BATCHES, GEN_CONTEXTS, format_generation, generation_table
from txl.segments import decoding_state
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.runtime import cpu_flags, resident_bytes

BENCH_SMALL = dict(vocab_size=256, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024, tgt_len=128,
                   mem_len=128, dropout=0.1)
BENCH_BATCH = 16
# the paper's enwik8/text8 large model (configs/enwik8-large.toml), evaluated at attention length 3,800 (tgt_len 128,
# same_length): 24 layers, d_model 1024, 8 heads of 128, d_inner 3072; byte vocabulary
ENWIK8_LARGE = dict(vocab_size=256, n_layer=24, d_model=1024, n_head=8, d_head=128, d_inner=3072, tgt_len=128,
                    mem_len=128, dropout=0.15)
# --eval-speedup models: config and batch (rows per measured call, for both models)
EVAL_PRESETS = {"bench-small": (BENCH_SMALL, 8), "enwik8-large": (ENWIK8_LARGE, 1)}


def median_time(fn: Callable[[], Any], *, warmup: int, repeats: int, sync: Callable[[], None]) -> list[float]:
    """Run ``fn`` ``warmup`` times, then time ``repeats`` runs; returns the sorted durations in seconds."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, sync: Callable[[], None],
                      budget_s: float = 1.0) -> float:
    """FLOP/s of a large square matmul on this device and dtype (the reference for the achieved fraction).

    The side is 2048 on a CPU, 8192 on an accelerator, or, where the dtype's products are that slow (a
    half precision emulated by a CPU without its instructions), the largest power of two from 256 whose
    product is expected within ``budget_s`` seconds (8 times the time of half its side).
    """
    most, n = (2048 if device.type == "cpu" else 8192), 256
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        times = median_time(lambda: a @ b, warmup=1 if n < most else 2, repeats=1 if n < most else 5, sync=sync)
        if n >= most or 8 * times[0] > budget_s:
            break
        n *= 2
    if n < most:  # the size whose time was measured once: measure it as the full size is
        times = median_time(lambda: a @ b, warmup=1, repeats=5, sync=sync)
    return 2 * n ** 3 / statistics.median(times)


def train_flops_per_token(c: TransformerXLConfig, qlen: int, mlen: int) -> float:
    """Matmul FLOPs per target token of one training step (forward + backward = 3x forward).

    Forward per token and layer: q (2·d·HD), k and v over the klen/qlen keys per query token
    (2·2·d·HD·klen/qlen), W_kR R (2·d·HD·klen/qlen), output (2·HD·d), feed-forward (4·d·d_inner), and
    attention (q·k, position term, probabilities·v: 3·2·HD·klen); plus the softmax layer 2·d·V.
    """
    hd, d, klen = c.n_head * c.d_head, c.d_model, qlen + mlen
    per_layer = 2 * d * hd + 4 * d * hd * klen / qlen + 2 * d * hd * klen / qlen + 2 * hd * d + 4 * d * c.d_inner
    per_layer += 6 * hd * klen
    return 3 * (c.n_layer * per_layer + 2 * d * c.vocab_size)


def eval_flops_per_token(c: TransformerXLConfig, length: int, tgt_len: int) -> tuple[float, float]:
    """Matmul FLOPs per predicted token at attention length ``length``: (vanilla window, txl memory).

    Vanilla: a window of ``length`` tokens per prediction, each with the position-wise products
    (q, k, v: 6·d·HD, output 2·HD·d, feed-forward 4·d·d_inner) and the softmax layer (2·d·V), plus
    causal attention (q·k and probabilities·v over ``length * (length + 1) / 2`` pairs: 4·HD each,
    the blocks a causal kernel computes). txl: one token's position-wise products and softmax layer,
    attention over the ``length + tgt_len`` keys of its segment's scores (q·k, position term,
    probabilities·v: 6·HD·klen); the memory's keys and values were projected once, when stored.
    """
    hd, d = c.n_head * c.d_head, c.d_model
    per_position = c.n_layer * (6 * d * hd + 2 * hd * d + 4 * d * c.d_inner) + 2 * d * c.vocab_size
    vanilla = length * per_position + c.n_layer * 2 * hd * length * (length + 1)
    txl = per_position + c.n_layer * 6 * hd * (length + tgt_len)
    return float(vanilla), float(txl)


class TxlRunner:
    """Training step, evaluation step and generation for a txl model."""

    name = "txl"

    def __init__(self, model: TransformerXLLM, device: torch.device, autocast: torch.dtype | None,
                 name: str | None = None):
        self.model, self.device, self.autocast = model.to(device), device, autocast
        self.name = name or self.name
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.mems = None
        self.state = None

    def _ctx(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        with self._ctx():
            loss, self.mems = self._loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.25)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def _loss(self, x: torch.Tensor, y: torch.Tensor):
        out = self.model(x, mems=self.mems, labels=y)
        return out.loss, out.mems

    @torch.no_grad()
    def eval_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One evaluation segment as ``txl eval`` reads it: the memory kept in a decoding state."""
        self.model.eval()
        if self.state is None:
            self.state = decoding_state(self.model, self.model.config.span)
        with self._ctx():
            self.model(x, labels=y, caches=self.state)


class HFRunner(TxlRunner):
    """The same three operations for transformers' TransfoXLLMHeadModel (same weights)."""

    name = "hf"

    def _loss(self, x: torch.Tensor, y: torch.Tensor):
        out = self.model(input_ids=x, mems=self.mems, labels=x)  # HF shifts labels itself
        return (out.loss if out.loss is not None else out.losses.mean()), out.mems

    @torch.no_grad()
    def eval_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.eval()
        with self._ctx():
            self.mems = self.model(input_ids=x, mems=self.mems).mems



def hf_twin(model: TransformerXLLM):
    """transformers' TransfoXLLMHeadModel with exactly ``model``'s weights."""
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    from txl.convert.hf_transfo_xl import config_to_hf, hf_initial_mems, hf_state_from_model

    cfg = config_to_hf(model.config)
    cfg.pop("architectures"), cfg.pop("model_type")
    hf = TransfoXLLMHeadModel(TransfoXLConfig(**cfg, pad_token_id=0))
    hf.config.eos_token_id = None
    hf.load_state_dict(hf_state_from_model(model), strict=False)  # tied and shared copies are re-tied
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    was = model.training
    model.eval(), hf.eval()
    with torch.no_grad():  # the same function, or the comparison means nothing
        ours = torch.log_softmax(model(ids, mems=hf_initial_mems(model.config, 2)).logits, -1)
        same = torch.allclose(ours, hf(input_ids=ids).prediction_scores, atol=1e-4)
    model.train(was)
    if not same:
        raise RuntimeError("transformers' TransfoXL with txl's weights computes something else")
    return hf


EVAL_MEM_LEN = 3800  # the paper's longest evaluation memory (Table 9)


def peak_memory_mb(impl: str, config: dict, batch: int, dtype: str, steps: int = 3, mode: str = "train") -> float:
    """Peak resident memory (MB) of a fresh process that builds ``impl`` and runs ``steps`` training
    steps (``mode="train"``) or evaluation segments with a full memory of ``config["mem_len"]``
    (``mode="eval"``)."""
    code = ("import json,sys; from txl_studies.speed.bench import _memory_child; "
            f"print(json.dumps(_memory_child({impl!r}, {config!r}, {batch}, {dtype!r}, {steps}, {mode!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise TxlError(f"memory measurement of {impl} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _memory_child(impl: str, config: dict, batch: int, dtype: str, steps: int, mode: str = "train") -> float:
    torch.manual_seed(0)
    model = TransformerXLLM(TransformerXLConfig(**config))
    if impl == "hf":
        model = hf_twin(model)
    runner = (HFRunner if impl == "hf" else TxlRunner)(model, torch.device("cpu"), _dtype(dtype))
    x = torch.randint(0, config["vocab_size"], (batch, config["tgt_len"]))
    step = runner.train_step if mode == "train" else runner.eval_step
    # evaluation: enough segments to fill the memory, then ``steps`` more with it full
    for _ in range(steps if mode == "train" else steps + -(-config["mem_len"] // config["tgt_len"])):
        step(x, x)
    # VmHWM is this process image's own peak (ru_maxrss would include the parent's, kept across exec)
    peak = resident_bytes(field="VmHWM")
    return peak / 2**20 if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dtype(name: str) -> torch.dtype | None:
    return None if name == "float32" else getattr(torch, name)


def run_bench(*, vs_hf: bool = False, device: str = "auto", dtype: str = "float32", batch: int = BENCH_BATCH,
              config: dict | None = None, repeats: int = 5, gen_tokens: int = 32, memory: bool = True,
              gen_contexts=GEN_CONTEXTS, gen_batches=GEN_BATCHES, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure txl (and with ``vs_hf`` transformers' TransfoXL and GPT-2) on one model config.

    Returns a JSON-able dict: hardware, config, per-implementation tokens/s for training and
    evaluation with memory, peak memory, achieved FLOP/s and its fraction of the measured matmul
    peak, txl/HF ratios (in a reduced-precision run the reference runs in float32, under the name
    ``"hf_float32"``, with ``"ratios_txl_over_hf_float32"``: its adaptive softmax fails under
    autocast, and the target for txl in bfloat16 is set against it), and ``"generation"``: the rows of
    :func:`txl_studies.speed.generation.generation_table` (txl against GPT-2's KV cache at equal
    context with ``vs_hf``; txl alone otherwise).

    Raises:
        TxlError: an unavailable device or an unknown dtype.
    """
    from txl.runtime import resolve_device

    dev = resolve_device(device)
    if dtype not in DTYPES:
        raise TxlError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    cfg_dict = dict(BENCH_SMALL if config is None else config)
    cfg = TransformerXLConfig(**cfg_dict)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    autocast = _dtype(dtype)
    torch.manual_seed(0)
    base = TransformerXLLM(cfg)
    runners: list[TxlRunner] = [TxlRunner(base, dev, autocast)]
    if vs_hf and autocast is None:
        runners.append(HFRunner(hf_twin(base), dev, None))
    elif vs_hf:  # the reference's adaptive softmax fails under autocast; the target is set against its float32
        runners.append(HFRunner(hf_twin(base), dev, None, name="hf_float32"))
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.tgt_len), device=dev)
    results: dict[str, Any] = {"hardware": hardware(dev), "config": cfg_dict, "batch": batch, "dtype": dtype,
                               "repeats": repeats, "impls": {}}
    peak = matmul_peak_flops(dev, autocast or torch.float32, sync)
    results["matmul_peak_flops"] = peak
    tokens = batch * cfg.tgt_len
    for mode in ("train", "eval"):
        for _ in range(2):  # alternate implementations, twice, keep each one's median over all repeats
            for r in runners:
                step = r.train_step if mode == "train" else r.eval_step
                times = median_time(lambda: step(x, x), warmup=2, repeats=repeats, sync=sync)
                results["impls"].setdefault(r.name, {}).setdefault(f"{mode}_times", []).extend(times)
        for r in runners:
            times = results["impls"][r.name][f"{mode}_times"]
            results["impls"][r.name][f"{mode}_tokens_per_s"] = tokens / statistics.median(times)
            log(f"{r.name:5s} {mode:5s} {results['impls'][r.name][f'{mode}_tokens_per_s']:10,.0f} tokens/s")
    flops = train_flops_per_token(cfg, cfg.tgt_len, cfg.mem_len)
    peaks = {autocast: peak}
    for r in runners:
        if r.autocast not in peaks:  # the float32 reference of a reduced-precision run: its own peak
            peaks[r.autocast] = results["matmul_peak_flops_float32"] = matmul_peak_flops(dev, torch.float32, sync)
        achieved = flops * results["impls"][r.name]["train_tokens_per_s"]
        results["impls"][r.name]["train_flops_per_s"] = achieved
        results["impls"][r.name]["train_fraction_of_matmul_peak"] = achieved / peaks[r.autocast]

    results["generation"] = generation_table(cfg_dict, device=dev, contexts=gen_contexts, batches=gen_batches,
                                             gen_tokens=gen_tokens, repeats=max(3, repeats), with_gpt2=vs_hf,
                                             sync=sync, log=log)
    if memory and dev.type == "cpu":
        for r in runners:
            impl, kind = ("hf", "float32") if r.name == "hf_float32" else (r.name, dtype)
            results["impls"][r.name]["peak_rss_mb"] = peak_memory_mb(impl, cfg_dict, batch, kind)
            log(f"{r.name:5s} peak RSS {results['impls'][r.name]['peak_rss_mb']:8.0f} MB (training)")
        # evaluation with the paper's longest memory, txl only (the reference takes many minutes there)
        eval_peak = peak_memory_mb("txl", {**cfg_dict, "mem_len": EVAL_MEM_LEN}, batch, dtype, mode="eval")
        results["impls"]["txl"][f"eval_mem{EVAL_MEM_LEN}_peak_rss_mb"] = eval_peak
        log(f"txl   peak RSS {eval_peak:8.0f} MB (evaluation, mem_len {EVAL_MEM_LEN})")
    elif memory:
        for r in runners:
            torch.cuda.reset_peak_memory_stats(dev)
            r.train_step(x, x)
            sync()
            results["impls"][r.name]["peak_allocated_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    if vs_hf:
        ours, theirs = results["impls"]["txl"], results["impls"][runners[1].name]
        ratios = {k: ours[k] / theirs[k] for k in ours if k.endswith("tokens_per_s") and k in theirs}
        for key in ("peak_rss_mb", "peak_allocated_mb"):
            if key in ours and key in theirs:
                ratios[key] = ours[key] / theirs[key]
        results["ratios_txl_over_hf" if autocast is None else "ratios_txl_over_hf_float32"] = ratios
    return results


def eval_speedup(lengths: list[int], *, device: str = "auto", batch: int = 8, repeats: int = 3,
                 config: dict | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Per-token evaluation time of a vanilla sliding window against Transformer-XL memory (paper Table 9).

    For attention length L, the vanilla model recomputes a window of L tokens for every predicted
    token (``attn_type="abs"``, one prediction per window); txl scores segments of ``tgt_len`` tokens
    with a memory of L and ``same_length``, so that every query also attends to exactly L keys, the
    memory kept in a decoding state as ``txl eval`` keeps it. Both costs are measured at every L.
    Per token the vanilla model does O(L) position-wise work plus O(L^2) attention, txl O(1)
    position-wise work plus O(L) attention, so the ratio grows at least linearly with L. Each row
    also gives the ratio of matmul FLOPs (:func:`eval_flops_per_token`): the speed-up txl would
    show if both ran at the same FLOP/s. The vanilla model's causal kernel skips the blocks above
    the diagonal; a vanilla model with a dense masked softmax (as in 2019) does twice its attention
    FLOPs, which is where ratios above the FLOP ratio come from.
    """
    from txl.runtime import resolve_device

    dev = resolve_device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    cfg = dict(BENCH_SMALL if config is None else config, dropout=0.0)
    out: dict[str, Any] = {"hardware": hardware(dev), "config": cfg, "batch": batch, "rows": []}
    rel = TransformerXLLM(TransformerXLConfig(**cfg)).to(dev).eval()
    vanilla = TransformerXLLM(TransformerXLConfig(**{**cfg, "attn_type": "abs"})).to(dev).eval()
    vocab = cfg["vocab_size"]
    paper = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}
    for length in lengths:
        tgt = min(128, length)
        span = rel.config.span.replace(tgt_len=tgt, mem_len=length, same_length=True)
        window = torch.randint(0, vocab, (batch, length), device=dev)
        seg = torch.randint(0, vocab, (batch, tgt), device=dev)
        state = decoding_state(rel, span)  # how txl eval reads: the memory's keys/values kept between segments
        with torch.no_grad():
            rel(torch.randint(0, vocab, (batch, length), device=dev), caches=state)  # a full memory
            t_van = statistics.median(median_time(lambda: vanilla(window), warmup=1, repeats=repeats, sync=sync))
            t_xl = statistics.median(median_time(lambda: rel(seg, caches=state), warmup=1, repeats=repeats,
                                                 sync=sync))
        per_van = t_van / batch  # one predicted token per window
        per_xl = t_xl / (batch * tgt)
        flops_van, flops_xl = eval_flops_per_token(rel.config, length, tgt)
        row = {"attention_length": length, "tgt_len": tgt, "vanilla_s_per_token": per_van, "txl_s_per_token": per_xl,
               "speedup": per_van / per_xl, "flop_ratio": flops_van / flops_xl, "paper_speedup": paper.get(length)}
        out["rows"].append(row)
        log(f"L={length:5d}  vanilla {per_van * 1e3:9.3f} ms/token  txl {per_xl * 1e3:8.4f} ms/token  "
            f"speed-up {row['speedup']:8.1f}x  FLOP ratio {row['flop_ratio']:7.1f}x"
            + (f"  (paper {paper[length]}x)" if length in paper else ""))
    return out


def hardware(device: torch.device) -> dict[str, Any]:
    """Names of the processor/GPU, thread count and torch version; on a CPU also the vector-instruction
    flags that change its speed (AVX2, AVX-512 and its bf16, AMX), as the kernel reports them."""
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        with contextlib.suppress(OSError):
            for line in open("/proc/cpuinfo", encoding="utf-8"):
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        flags = cpu_flags()
        if flags is not None:
            info["cpu_flags"] = sorted(f for f in flags if f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni",
                                                                  "amx_bf16", "amx_tile", "bf16"))
    return info


def format_table(results: dict[str, Any]) -> str:
    """A Markdown table of a :func:`run_bench` result."""
    impls = results["impls"]
    keys = ["train_tokens_per_s", "eval_tokens_per_s", "peak_rss_mb", f"eval_mem{EVAL_MEM_LEN}_peak_rss_mb",
            "peak_allocated_mb", "train_fraction_of_matmul_peak"]
    names = list(impls)
    ratios = results.get("ratios_txl_over_hf") or results.get("ratios_txl_over_hf_float32")
    label = " | txl/HF |" if "ratios_txl_over_hf" in results else " | txl/HF float32 |"
    lines = ["| measure | " + " | ".join(names) + (label if ratios is not None else " |"),
             "|---" * (len(names) + 1 + (ratios is not None)) + "|"]
    for key in keys:
        if not any(key in impls[n] for n in names):
            continue
        cells = [_fmt(impls[n].get(key)) for n in names]
        ratio = (ratios or {}).get(key)
        lines.append(f"| {key} | " + " | ".join(cells) + (f" | {ratio:.2f}x |" if ratio else
                                                          (" | |" if ratios is not None else " |")))
    if results.get("generation"):
        lines += ["", format_generation(results["generation"])]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and value < 1:
        return f"{value:.3f}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
