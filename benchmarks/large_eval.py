"""Evaluating on splits larger than memory: peak resident memory of `txl eval`, `txl recl` and a full pass.

    OMP_NUM_THREADS=2 python benchmarks/large_eval.py --work /tmp/txl-large --size-gb 4 --base HEAD~1 \
        --json benchmarks/results/large-eval.json

A byte corpus of ``--size-gb`` (benchmarks/large_corpus.py's text) is cut 10/45/45, so the valid and the
test split are each 45% of it, and a default model is trained for two steps (its final evaluation
limited to ``eval.max_tokens``). Then, each as a fresh process with its own peak resident memory (``wait4``):

- ``txl eval RUN --split valid --max-tokens N``: scores N tokens of the mapped valid split;
- ``txl recl RUN RUN``: RECL on the mapped test split (two models, so their two splits are compared too);
- a full pass: every segment of the valid split's 64 streams read as the evaluation reads them (no model),
  once as txl reads it (the mapped pages handed back every 64 MiB) and once without handing them back.

With ``--base COMMIT`` the same ``txl eval`` runs on that commit's tree too (a git worktree), for the
memory it took before the split was read in place.
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

from large_corpus import make_corpus

ROOT = Path(__file__).resolve().parents[1]
SPLIT = [0.1, 0.45, 0.45]

FULL_PASS = """
import time
from txl.data import LMOrderedIterator, load_corpus
from txl.runtime import default_cache_dir
valid = load_corpus({corpus!r}, "byte", split={split!r}, cache_dir=default_cache_dir()).valid  # as txl train reads it
it = LMOrderedIterator(valid, 64, 4096)
it._pages.release_bytes = {release}
x, y = it.streams()
begin, total = time.perf_counter(), 0
for pos in range(0, it.stream_len, it.tgt_len):
    total += int((y[:, pos:pos + it.tgt_len] >= 0).sum())
print(f"{{total}} targets read in {{time.perf_counter() - begin:.1f}} s, pages handed back {{it._pages.releases}} times")
"""


def timed(argv: list[str], env: dict, label: str, cwd: Path = ROOT) -> dict:
    """Run ``argv``; its wall time, the child's own peak RSS (GB, ``wait4``) and the last lines it printed."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        printed, errors = out.read(), err.read()
    if status:
        raise SystemExit(f"large_eval.py: {label} failed: {errors[-2000:]}")
    row = {"command": label, "wall_s": round(wall, 1), "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3),
           "output": [line for line in printed.strip().splitlines() if line][-2:]}
    print(json.dumps(row)[:400], flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="folder for the corpus, cache and run")
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--max-tokens", type=int, default=200_000, help="tokens `txl eval` scores")
    ap.add_argument("--base", help="also run `txl eval` on this commit")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from txl.runtime import cpu_flags

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    size = int(args.size_gb * 1e9)
    corpus = work / f"corpus-{args.size_gb:g}gb.txt"
    make_corpus(corpus, size)
    cache, out = work / "cache-eval", work / "run-eval"
    subprocess.run(["rm", "-rf", str(out), str(work / "recl-eval")], check=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT / "studies"),
           "XDG_CACHE_HOME": str(cache)}
    txl = [sys.executable, "-m", "txl"]
    rows = {}
    train = ["train", str(corpus), "--tokenizer", "byte", "--out", str(out), "train.max_steps=2",
             f"data.split={SPLIT}", "train.eval_interval=1000000", f"eval.max_tokens={args.max_tokens}"]
    rows["train"] = timed(txl + train, env, "txl " + shlex.join(train))
    evaluate = ["eval", str(out), "--split", "valid", "--max-tokens", str(args.max_tokens), "--batch-size", "8"]
    rows["eval"] = timed(txl + evaluate, env, "txl " + shlex.join(evaluate))
    recl = ["recl", str(out), str(out), "--names", "a,b", "--positions", "64", "--max-context", "64",
            "--no-plot", "--out", str(work / "recl-eval")]
    rows["recl"] = timed(txl + recl, env, "txl " + shlex.join(recl))
    for name, release in (("full_pass", 64 << 20), ("full_pass_without_release", 1 << 62)):
        code = FULL_PASS.format(corpus=str(corpus), split=SPLIT, release=release)
        rows[name] = timed([sys.executable, "-c", code], env, "every segment of the valid split in 64 streams of "
                           f"4096 tokens, {'no pages handed back' if release > 1 << 40 else 'as txl reads it'}")
    if args.base:
        tree = work / "base-tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.base], check=True,
                       capture_output=True)
        try:
            base_env = {**env, "PYTHONPATH": str(tree / "src") + os.pathsep + str(tree / "studies")}
            rows["eval_base"] = timed(txl + evaluate, base_env, "txl " + shlex.join(evaluate), cwd=tree)
            rows["eval_base"]["commit"] = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                                                         capture_output=True, text=True).stdout.strip()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python " + shlex.join(sys.argv)
    result = {"command": command, "date": time.strftime("%Y-%m-%d"), "threads": threads, "torch": torch.__version__,
              "cpu_flags": sorted(cpu_flags() or ()),
              "memory_gb": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9, 1),
              "corpus_bytes": size, "split": SPLIT, "rows": rows}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
