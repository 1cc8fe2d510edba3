"""Greedy decoding of bench-small with int8 weights under torch.compile, against txl's float32 and int8
decoding loops, taking turns in one run (docs/quantization.md, "Why bench-small's batch-1 step does not gain").

Rows: txl's cached decoding loop (``generate_steps``, what ``txl generate`` runs) with float32 and with
int8 weights, and the ring decoder (:class:`txl.generation.compiled.RingDecoder`: fixed-shape state, the step
compiled once) with each, eager and compiled (inductor, ``fullgraph=True``; ``txl generate --compile
--quantize int8`` decodes with the last of these). The ring rows pick each token by argmax, without the
decoding-rules object ``txl generate`` adds per step (``txl bench --quantize int8`` times the command's
own path). Prints and writes (``--json``) tokens/s (median over ``--repeats`` runs of ``--tokens``
steps after a 127-token prompt) and whether each row's greedy tokens equal float32 eager's.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/int8_compiled_decoding.py --batch-size 1 8 \\
        --json benchmarks/results/int8-compiled-decoding.json

Timings are only comparable within one run on an idle machine; compiling takes about a minute per
int8 model.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    import torch

    from txl_studies.speed.bench import BENCH_SMALL
    from txl.generation.stream import generate_steps
    from txl.model import TransformerXLConfig, TransformerXLLM
    from txl.kernels.int8 import quantize_int8
    from txl.generation.compiled import RingDecoder
    from txl.runtime import cpu_flags

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    config = TransformerXLConfig(**BENCH_SMALL)
    torch.manual_seed(0)
    models = {"float32": TransformerXLLM(config).eval()}
    models["int8"] = quantize_int8(copy.deepcopy(models["float32"]))
    span = config.span.replace(mem_len=128)
    results = {"model": "bench-small", "tokens": args.tokens, "repeats": args.repeats, "threads": torch.get_num_threads(),
               "cpu_flags": sorted(cpu_flags() or ()), "torch": torch.__version__, "rows": []}

    def loop(model, prompt):  # txl's cached decoding loop; returns (seconds per step, tokens)
        steps = generate_steps(model, prompt, args.tokens + 1, span=span, temperature=0.0)
        out = [next(steps).token]  # the token after the prompt (the ring's first step below)
        start = time.perf_counter()
        out += [step.token for step in steps]
        return (time.perf_counter() - start) / args.tokens, torch.stack(out[:args.tokens], 1)

    def ring(decoder, prompt):  # the ring decoder; the same prompt and steps
        decoder.read_prompt(prompt[:, :-1])
        token, out = prompt[:, -1:], []
        start = time.perf_counter()
        for _ in range(args.tokens):
            token = decoder.step(token).argmax(-1, keepdim=True)
            out.append(token)
        return (time.perf_counter() - start) / args.tokens, torch.cat(out, 1)

    for batch in args.batch_size:
        prompt = torch.randint(0, config.vocab_size, (batch, 128))
        runs = {}
        for name, model in models.items():
            runs[f"{name} loop"] = lambda p, m=model: loop(m, p)
            for compiled in (False, True):
                decoder = RingDecoder(model, span, compile=compiled)
                start = time.perf_counter()
                ring(decoder, prompt[:, :8])  # warm-up (compiles the step; each run reads its prompt afresh)
                print(f"batch {batch}: {name} ring{' compiled' if compiled else ''} ready in "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
                runs[f"{name} ring{' compiled' if compiled else ''}"] = lambda p, d=decoder: ring(d, p)
        seconds: dict = {k: [] for k in runs}
        tokens: dict = {}
        for _ in range(args.repeats):
            for name, run in runs.items():
                dt, tokens[name] = run(prompt)
                seconds[name].append(dt)
        base = statistics.median(seconds["float32 loop"])
        for name in runs:
            median = statistics.median(seconds[name])
            row = {"batch": batch, "row": name, "tokens_per_s": batch / median, "vs_float32_loop": base / median,
                   "greedy_equal_float32_loop": bool(torch.equal(tokens[name], tokens["float32 loop"]))}
            results["rows"].append(row)
            print(f"batch {batch}: {name:22s} {row['tokens_per_s']:7.0f} tokens/s  {row['vs_float32_loop']:.2f}x  "
                  f"greedy = float32 loop: {row['greedy_equal_float32_loop']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
