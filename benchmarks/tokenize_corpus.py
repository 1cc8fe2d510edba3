"""Word and BPE tokenisation of a corpus larger than memory: throughput with 1 and 2 worker processes, and
peak resident memory.

    OMP_NUM_THREADS=2 python benchmarks/tokenize_corpus.py --work /tmp/txl-tokenize --gb 1 \
        --json benchmarks/results/tokenize-corpus.json

Writes ``--gb`` GB of text under ``--work`` (tiny Shakespeare repeated, one word numbered differently in
each copy so that the vocabulary grows to tens of thousands of words), then, in a fresh process for each
tokenizer and worker count, does what ``txl train`` does with a cache folder (txl.data.streaming): the
vocabulary from the text read chunk by chunk (word counts, or BPE training with 8,000 tokens), then the
ids encoded into a ``.npy`` file by the workers. Records the seconds of each phase, ids per second of the
encoding, and the peak resident memory of the process and of each worker (``VmHWM``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from large_corpus import make_corpus, peaks_of  # noqa: E402  (the same corpus maker and memory sampling)

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import numpy as np
from txl.data import streaming
from txl.data.corpus import token_dtype
from txl.data.token_cache import streamed_vocabulary

corpus, kind, workers, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
span = streaming.span_of([Path(corpus)], 0, Path(corpus).stat().st_size)
opts = {"lower": False, "normalize": "none", "min_freq": 1, "max_size": 8000 if kind == "bpe" else None}
start = time.perf_counter()
with tempfile.TemporaryDirectory() as fresh:  # an empty cache folder: the vocabulary is built, never read back
    tok = streamed_vocabulary(kind, span, opts, [], {}, fresh, progress=False)
vocab_s = time.perf_counter() - start
start = time.perf_counter()
streaming.encode_to_file(span, tok, out, token_dtype(tok.vocab_size), workers=workers)
encode_s = time.perf_counter() - start
ids = len(np.load(out, mmap_mode="r"))
print(json.dumps({"vocab_size": tok.vocab_size, "vocabulary_s": round(vocab_s, 1), "encode_s": round(encode_s, 1),
                  "ids": ids, "ids_per_s": round(ids / encode_s), "text_mb_per_s": round(span_bytes / 1e6 / encode_s, 2)
                  if (span_bytes := streaming.span_bytes(span)) else 0}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from txl.runtime import cpu_flags

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus-{args.gb:g}gb.txt"
    make_corpus(corpus, int(args.gb * 1e9), every=1, numbers=0, count=50)
    rows = []
    for kind in ("word", "bpe"):
        for workers in (1, 2):
            out = work / f"{kind}-{workers}.npy"
            out.unlink(missing_ok=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            proc = subprocess.Popen([sys.executable, "-c", CHILD, str(corpus), kind, str(workers), str(out)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            peaks: dict = {}
            done = threading.Event()
            threading.Thread(target=peaks_of, args=(proc.pid, peaks, done), daemon=True).start()
            stdout, stderr = proc.communicate()
            done.set()
            if proc.returncode:
                raise SystemExit(f"tokenize_corpus.py: {kind} with {workers} workers failed: {stderr[-800:]}")
            row = {"tokenizer": kind, "workers": workers, **json.loads(stdout.strip().splitlines()[-1]),
                   "peak_rss_gb": round(peaks.get(proc.pid, 0) / 1e9, 3),
                   "worker_peak_rss_gb": sorted(round(v / 1e9, 3) for k, v in peaks.items() if k != proc.pid)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            out.unlink(missing_ok=True)
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python " + shlex.join(sys.argv)
    result = {"command": command, "date": time.strftime("%Y-%m-%d"), "threads": threads, "torch": torch.__version__,
              "cpu_flags": sorted(cpu_flags() or ()), "cpus": os.cpu_count(), "corpus_bytes": corpus.stat().st_size,
              "rows": rows}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
