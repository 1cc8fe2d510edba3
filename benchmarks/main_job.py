"""The README's first command, measured: ``txl train`` on the built-in default, then ``txl eval`` of its
checkpoint with memories of 0, 64 and 256 (the model was trained with 64), written as one JSON.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/main_job.py --json benchmarks/results/main-job.json

Runs in a temporary folder (nothing under ``runs/`` is touched) and takes about 4 minutes on 2 cores;
the wall times mean something only on an otherwise idle machine. With ``OMP_NUM_THREADS`` fixed the bits
per byte repeat exactly on one CPU; another CPU or thread count sums in another order.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMORIES = (0, 64, 256)


def txl(*argv: str) -> float:
    """Run ``python -m txl ARGV`` (this checkout's src first); its wall seconds. Exits on a failure."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "txl", *argv], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"main_job.py: txl {shlex.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="write the result here")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from txl.runtime import cpu_flags

    with tempfile.TemporaryDirectory(prefix="txl-main-job-") as tmp:
        run = Path(tmp) / "default"
        train_s = txl("train", "--out", str(run), "-q")
        evaluations = []
        for mem_len in MEMORIES:
            out = Path(tmp) / f"eval-{mem_len}.json"
            seconds = txl("eval", str(run), "--tgt-len", "64", "--mem-len", str(mem_len), "-q", "--json", str(out))
            result = json.loads(out.read_text())
            evaluations.append({"mem_len": mem_len, "result": result, "wall_s": round(seconds, 1)})
        config = json.loads((run / "best" / "config.json").read_text())  # the model of the evaluated checkpoint
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python " + shlex.join(sys.argv)
    results = {"command": command, "date": time.strftime("%Y-%m-%d"), "threads": threads, "torch": torch.__version__,
               "cpu_flags": sorted(cpu_flags() or ()), "train_command": "txl train", "train_wall_s": round(train_s, 1),
               "eval": evaluations, "config": config}
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    for row in evaluations:
        print(f"mem_len {row['mem_len']:4d}: {json.dumps(row['result'])[:160]}")
    print(f"txl train: {train_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
