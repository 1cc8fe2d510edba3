"""Two commits side by side: ``txl bench`` rows of each, alternated in one run, as ratios.

A change that must not slow txl down (a redesign of the model floor, a new seam) is measured against
the commit before it on the same machine in the same run: each round runs every part for both trees,
in alternating order (base, head; then head, base), so drift of the machine (heat, other load) falls
on both. Each part is one ``txl bench`` invocation; every throughput it reports (the numbers named
``*tokens_per_s`` of txl's own rows, not of transformers' or GPT-2's) becomes a row: its median over the
rounds for each tree and the ratio head / base, flagged when below ``--floor``.

    OMP_NUM_THREADS=2 python benchmarks/compare_commits.py --base HEAD~1 \\
        --json benchmarks/results/compare-<change>.json

Parts (``--parts``, default all): ``bench`` (a training step and evaluation: ``txl bench --no-memory``),
``int8`` (float32 and int8 decoding at batch 1 and 8, evaluation with memory, the int8 model compiled:
``txl bench --quantize int8``; needs a C++ compiler), ``export`` (txl's decoding and ONNX Runtime's at
batch 1 and 8: ``txl bench --export``; needs the export extra). A tree's ``src`` comes first on the
child's ``PYTHONPATH``, so each runs its own txl with this environment's packages. ``--head`` defaults to this
checkout's working tree; ``--base`` is checked out into a temporary git worktree, removed at the end.
Run on an otherwise idle machine: the ratios mean nothing under other load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"bench": ["--no-memory"], "int8": ["--quantize", "int8"], "export": ["--export"]}
NOT_OURS = ("/hf/", "gpt2", "onnxruntime", "graphs_eager", "ratio")  # other implementations' rows, and ratios


def throughputs(result: object, path: str = "") -> dict[str, float]:
    """Every ``*tokens_per_s`` number of txl's own rows in a ``txl bench`` JSON, by its path
    (list items named by their ``batch``/``context``/``tgt_len`` where they have them)."""
    found: dict[str, float] = {}
    if isinstance(result, dict):
        for key, value in result.items():
            found.update(throughputs(value, f"{path}/{key}"))
    elif isinstance(result, list):
        for i, item in enumerate(result):
            name = ",".join(f"{k}={item[k]}" for k in ("batch", "context", "tgt_len") if isinstance(item, dict) and k in item)
            found.update(throughputs(item, f"{path}[{name or i}]"))
    elif (isinstance(result, (int, float)) and path.endswith("tokens_per_s")
          and not any(mark in path for mark in NOT_OURS)):
        found[path] = float(result)
    return found


def python_path(tree: Path) -> str:
    """A child's PYTHONPATH for the checkout ``tree``: its txl (``src/``) and, where it has them, its studies
    (``studies/``, imported as ``txl_studies``: reached through a link, so the tree's own ``txl bench`` runs,
    not the installed one)."""
    paths = [str(tree / "src")]
    if (tree / "studies" / "__init__.py").is_file():
        links = Path(tempfile.mkdtemp(prefix="txl-paths-"))
        (links / "txl_studies").symlink_to(tree / "studies", target_is_directory=True)
        paths.append(str(links))
    return os.pathsep.join(paths)


def run_part(tree: Path, flags: list[str], threads: str) -> dict[str, float]:
    """``txl bench FLAGS`` of the checkout ``tree`` in a child process; its throughputs."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        env = {**os.environ, "PYTHONPATH": python_path(tree), "OMP_NUM_THREADS": threads}
        command = [sys.executable, "-m", "txl", "bench", *flags, "--json", str(out)]
        done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
        if done.returncode or not out.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise SystemExit(f"compare_commits.py: txl bench {shlex.join(flags)} failed in {tree}: " + " | ".join(tail))
        return throughputs(json.loads(out.read_text()))


def git(*argv: str) -> str:
    """``git ARGV`` in this checkout; its output. A failure (e.g. a revision git does not know) is one line."""
    done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        first = (done.stderr.strip().splitlines() or ["no message"])[0]
        raise SystemExit(f"{Path(sys.argv[0]).name}: git {shlex.join(argv)} failed: {first}")
    return done.stdout.strip()


@contextlib.contextmanager
def checkouts(base: str, head: str | None, prefix: str):
    """The two trees to compare, as ``(commits, {"base": path, "head": path})``: ``base`` (and ``head``
    when given) checked out into temporary git worktrees, removed on leaving; no ``head``: this checkout's
    working tree."""
    commits = {"base": git("rev-parse", base)}
    commits["head"] = git("rev-parse", head) if head else f"{git('rev-parse', 'HEAD')} (working tree)"
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        trees = {}
        try:
            for side, rev in (("base", base), ("head", head)):
                if rev:
                    git("worktree", "add", "--detach", str(Path(tmp) / side), rev)
                    trees[side] = Path(tmp) / side  # (removed on leaving: only a tree that was added)
            yield commits, {"head": ROOT, **trees}
        finally:
            for tree in trees.values():
                git("worktree", "remove", "--force", str(tree))


def run_at_commit(rev: str, script: str, argv: list[str], command: str) -> int:
    """Run the benchmark ``script`` with ``argv`` on the code of commit ``rev`` (a temporary git worktree, its
    ``src`` and studies first on the child's PYTHONPATH); the child reads the commit and the command line to
    record from ``TXL_FORMS_COMMIT`` and ``TXL_FORMS_COMMAND`` (:func:`forms_record`)."""
    with checkouts(rev, None, "txl-forms-") as (commits, trees):
        env = dict(os.environ, PYTHONPATH=python_path(trees["base"]), TXL_FORMS_COMMIT=commits["base"],
                   TXL_FORMS_COMMAND=command)
        return subprocess.run([sys.executable, script, *argv], env=env, cwd=trees["base"]).returncode


def forms_record(rounds: int, rows: list, start: float) -> dict:
    """The JSON record of a forms benchmark (eval_forms.py, model_forms.py) that measured ``rows`` from ``start``
    (``time.time()``): its command, date, commit, rounds, hardware and wall time."""
    import torch

    from txl_studies.speed.bench import hardware

    command = os.environ.get("TXL_FORMS_COMMAND") or "python " + shlex.join(sys.argv)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = os.environ.get("TXL_FORMS_COMMIT") or f"{head or 'unknown commit'} (working tree)"
    return {"command": command, "date": time.strftime("%Y-%m-%d"), "commit": commit, "rounds": rounds,
            "hardware": hardware(torch.device("cpu")), "wall_s": round(time.time() - start), "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit before the change (any git revision)")
    ap.add_argument("--head", help="the commit of the change (default: this checkout's working tree)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which txl bench runs, of {', '.join(PARTS)}")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every part for both trees (default 3)")
    ap.add_argument("--bench-args", default="", help="more flags for every txl bench run (e.g. --repeats 3)")
    ap.add_argument("--floor", type=float, default=0.95, help="flag a ratio head / base below this (default 0.95)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or args.rounds < 1:
        raise SystemExit(f"--parts takes {', '.join(PARTS)} (got {', '.join(unknown)}); --rounds >= 1"
                         if unknown else "--rounds must be >= 1")
    threads = os.environ.get("OMP_NUM_THREADS", "2")
    start = time.time()
    measured: dict[str, dict[str, list[float]]] = {"base": {}, "head": {}}
    with checkouts(args.base, args.head, "txl-compare-") as (commits, trees):
        for r in range(args.rounds):
            for side in ("base", "head") if r % 2 == 0 else ("head", "base"):
                for part in parts:
                    flags = PARTS[part] + shlex.split(args.bench_args)
                    print(f"round {r + 1}/{args.rounds}: {side} {part}", flush=True)
                    for name, value in run_part(trees[side], flags, threads).items():
                        measured[side].setdefault(f"{part}{name}", []).append(value)
    rows = {}
    for name in sorted(set(measured["base"]) & set(measured["head"])):
        base, head = statistics.median(measured["base"][name]), statistics.median(measured["head"][name])
        rows[name] = {"base": base, "head": head, "ratio": head / base,
                      "base_runs": measured["base"][name], "head_runs": measured["head"][name]}
        flag = "  SLOWER" if head / base < args.floor else ""
        print(f"{name:70s} {base:10.1f} {head:10.1f} {head / base:6.3f}{flag}")
    sys.path.insert(0, str(ROOT / "src"))
    from txl.runtime import cpu_flags

    results = {"command": "python " + shlex.join(sys.argv), "date": time.strftime("%Y-%m-%d"), "commits": commits,
               "rounds": args.rounds, "threads": threads, "cpu_flags": sorted(cpu_flags() or ()),
               "wall_s": round(time.time() - start), "floor": args.floor, "rows": rows,
               "slower": sorted(n for n, row in rows.items() if row["ratio"] < args.floor)}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
