"""Training on byte-level corpora larger than memory: peak resident memory and the time to the first step.

    OMP_NUM_THREADS=2 python benchmarks/large_corpus.py --work /tmp/txl-large --sizes-gb 4 20 \
        --json benchmarks/results/large-corpus.json

For each size, a corpus of that many bytes is written under ``--work`` (tiny Shakespeare repeated, every
seventh copy with a word numbered so that the copies differ), then ``txl train CORPUS --tokenizer byte``
runs twice with a fresh token cache: ``cold`` writes the cache (the corpus hashed and copied in chunks),
``cached`` opens it. Each run trains ``--steps`` steps of the default model and evaluates on a valid split
of ``--valid-bytes``. With ``--nproc 2`` the cached run is repeated under torchrun (two processes on the
same mapped file) and its losses compared with one process's. Peak resident memory is the child's own
(``wait4``; for torchrun, the largest rank's from its ``/proc`` status); the time to the first step is from
the start of the command to the training progress bar's first line. Needs about three times the largest
size free on disk under ``--work``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "data" / "tinyshakespeare.txt"


def make_corpus(path: Path, size: int, every: int = 7, numbers: int = 97, count: int = -1) -> None:
    """Write ``size`` bytes of text at ``path`` (kept when it is already that size): tiny Shakespeare
    repeated, in every ``every``-th copy the word "the" numbered (``count`` times, -1: all; the number
    the copy's index modulo ``numbers``, 0: the index), so that the copies differ."""
    if path.is_file() and path.stat().st_size == size:
        return
    text = SOURCE.read_bytes()
    with open(path, "wb") as f:
        left, copy = size, 0
        while left > 0:
            n = copy % numbers if numbers else copy
            chunk = text.replace(b" the ", b" the%d " % n, count) if copy % every == 0 else text
            f.write(chunk[:left])
            left -= len(chunk)
            copy += 1


def peaks_of(pid: int, peaks: dict, done: threading.Event) -> None:
    """Peak resident memory (VmHWM, bytes) of ``pid`` and its descendants (torchrun's ranks, tokenizer
    workers), sampled from /proc into ``peaks`` until ``done``."""
    while not done.is_set():
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
                me, parent = int(status.parent.name), int(fields.get("PPid", "0"))
                if me == pid or parent == pid or parent in peaks:
                    peaks[me] = max(peaks.get(me, 0), int(fields.get("VmHWM", "0 kB").split()[0]) * 1024)
            except (OSError, ValueError):
                continue
        time.sleep(0.2)


def train(corpus: Path, out: Path, cache: Path, args, nproc: int = 1) -> dict:
    """One ``txl train`` run; its wall time, time to the first step, peak RSS and losses."""
    argv = ["train", str(corpus), "--tokenizer", "byte", "--out", str(out), f"train.max_steps={args.steps}",
            f"data.split=[{1 - 2 * args.valid_bytes / corpus.stat().st_size:.12f}, "
            f"{args.valid_bytes / corpus.stat().st_size:.12f}, {args.valid_bytes / corpus.stat().st_size:.12f}]",
            "train.eval_interval=1000000", "train.log_interval=1"] + (["--nproc", str(nproc)] if nproc > 1 else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "XDG_CACHE_HOME": str(cache)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "txl", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peaks: dict = {}
    done = threading.Event()
    watcher = threading.Thread(target=peaks_of, args=(proc.pid, peaks, done), daemon=True)
    watcher.start()
    first_step = None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if first_step is None and "%|" in line:
            first_step = time.perf_counter() - start
    out_text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    wall = time.perf_counter() - start
    if status:
        raise SystemExit(f"large_corpus.py: txl {shlex.join(argv)} failed: {''.join(lines[-5:])}")
    with open(out / "metrics.csv") as f:
        losses = [float(row["train_loss"]) for row in csv.DictReader(f) if row.get("train_loss")]
    row = {"command": "txl " + shlex.join(argv), "wall_s": round(wall, 1),
           "to_first_step_s": round(first_step, 1) if first_step else None,
           "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3), "train_losses": losses,
           "final": next((x for x in out_text.splitlines() if x.startswith("final")), "")}
    if nproc > 1:
        row["rank_peak_rss_gb"] = sorted(round(v / 1e9, 3) for k, v in peaks.items() if k != proc.pid)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="folder for the corpora, caches and runs")
    ap.add_argument("--sizes-gb", type=float, nargs="+", default=[4.0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--valid-bytes", type=int, default=400_000)
    ap.add_argument("--nproc", type=int, default=1, help="also run the cached corpus in this many processes")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from txl.runtime import cpu_flags

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for gb in args.sizes_gb:
        size = int(gb * 1e9)
        corpus = work / f"corpus-{gb:g}gb.txt"
        make_corpus(corpus, size)
        cache = work / f"cache-{gb:g}gb"
        subprocess.run(["rm", "-rf", str(cache), str(work / f"runs-{gb:g}gb")], check=True)
        row = {"corpus_bytes": size}
        for name in ("cold", "cached"):
            row[name] = train(corpus, work / f"runs-{gb:g}gb" / name, cache, args)
            print(f"{gb:g} GB {name}: {json.dumps(row[name])[:300]}", flush=True)
        if args.nproc > 1:
            row["processes"] = train(corpus, work / f"runs-{gb:g}gb" / "nproc", cache, args, nproc=args.nproc)
            row["processes"]["max_loss_difference_to_one_process"] = max(
                abs(a - b) for a, b in zip(row["processes"]["train_losses"], row["cached"]["train_losses"]))
            print(f"{gb:g} GB {args.nproc} processes: {json.dumps(row['processes'])[:300]}", flush=True)
        subprocess.run(["rm", "-rf", str(cache)], check=True)  # the next size needs the room
        rows.append(row)
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python " + shlex.join(sys.argv)
    result = {"command": command, "date": time.strftime("%Y-%m-%d"), "threads": threads, "torch": torch.__version__,
              "cpu_flags": sorted(cpu_flags() or ()), "memory_gb": round(os.sysconf("SC_PHYS_PAGES")
                                                                         * os.sysconf("SC_PAGE_SIZE") / 1e9, 1),
              "steps": args.steps, "valid_bytes": args.valid_bytes, "rows": rows}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
