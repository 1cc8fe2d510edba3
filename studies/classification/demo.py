"""Long-document classification demo: which standard-library package does a piece of source belong to?

Builds a JSON Lines dataset from this Python's standard library (one document per ``.py`` file of a
package, test folders left out: the ``--doc-bytes`` bytes around the middle of the file, cut at line
starts, so that the module docstring at the top, which often names the package, is usually not in the
document), pretrains two small byte-level language models on the top-level standard-library modules
(``txl train``'s default corpus, which contains none of these package files) -- one Transformer-XL, one
vanilla absolute-position model, same size and steps -- and fine-tunes three classifiers with the same
budget (steps, batch size, learning rate, held-out split):

  (a) Transformer-XL reading the whole document segment by segment with its memory,
  (b) Transformer-XL reading only the first segment (tgt_len tokens),
  (c) the vanilla model reading one window of tgt_len tokens.

Usage (OMP_NUM_THREADS=1 avoids thread oversubscription on a shared machine)::

    OMP_NUM_THREADS=1 python -m txl_studies.classification.demo --work runs/classify-demo

Prints every command it runs and a Markdown table of held-out accuracy and macro-F1.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

PACKAGES = ("asyncio", "distutils", "email", "importlib", "multiprocessing", "tkinter", "unittest", "xml")
LM_ARGS = ["max_steps=150", "sample_tokens=0", "eval_interval=150", "model.n_layer=2", "model.d_model=128",
           "model.n_head=4", "model.d_head=32", "model.d_inner=256", "eval.max_tokens=20000"]


def middle_window(data: bytes, size: int) -> bytes:
    """``size`` bytes around the middle of ``data``, starting and ending at line starts when possible."""
    if len(data) <= size:
        return data
    start = (len(data) - size) // 2
    line = data.find(b"\n", start)
    start = line + 1 if 0 <= line < start + size // 4 else start
    window = data[start:start + size]
    end = window.rfind(b"\n")
    return window[:end + 1] if end > size // 2 else window


def build_dataset(out: Path, doc_bytes: int) -> dict:
    """Write ``out`` (JSONL, one document per package source file); returns documents per label."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    counts, lines = {}, []
    for package in PACKAGES:
        files = sorted(p for p in (stdlib / package).rglob("*.py")
                       if not any(part.startswith("test") or part == "idle_test" for part in p.relative_to(stdlib).parts))
        for path in files:
            text = middle_window(path.read_bytes(), doc_bytes).decode("utf-8", errors="replace")
            if text.strip():
                lines.append(json.dumps({"text": text, "label": package, "file": str(path.relative_to(stdlib))}))
                counts[package] = counts.get(package, 0) + 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return counts


def run(cmd: list[str]) -> str:
    """Run a command (printed first), echo and return its stdout; stop on failure."""
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"command failed with exit status {result.returncode}")
    return result.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/classify-demo", help="folder for the dataset, LMs and classifiers")
    p.add_argument("--doc-bytes", type=int, default=1024, help="bytes per document (default 1024)")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pooling", choices=["last", "mean"], default="mean")
    p.add_argument("--lm-rel", help="use this Transformer-XL LM instead of pretraining one")
    p.add_argument("--lm-abs", help="use this vanilla LM instead of pretraining one")
    args = p.parse_args()
    work = Path(args.work)
    txl = [sys.executable, "-m", "txl"]
    data = work / "stdlib-packages.jsonl"
    counts = build_dataset(data, args.doc_bytes)
    print(f"dataset {data}: {sum(counts.values())} documents: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    lms = {}
    for name, extra in (("rel", []), ("abs", ["model.attn_type=abs", "model.mem_len=0"])):
        given = getattr(args, f"lm_{name}")
        lms[name] = Path(given) if given else work / f"lm-{name}"
        if not given and not (lms[name] / "best").is_dir():
            run(txl + ["train", "--out", str(lms[name]), "-q", *LM_ARGS, *extra])
    common = ["--data", str(data), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
              "--lr", str(args.lr), "--seed", str(args.seed), "--pooling", args.pooling, "--head-init", "random", "--quiet"]
    rows = []
    for label, lm, mode in (("(a) Transformer-XL, whole document with memory", "rel", "memory"),
                            ("(b) Transformer-XL, first segment only", "rel", "first"),
                            ("(c) vanilla Transformer (abs), one window", "abs", "first")):
        out = work / f"clf-{lm}-{mode}"
        start = time.perf_counter()
        run(txl + ["classify", "train", "--checkpoint", str(lms[lm]), "--out", str(out), "--mode", mode, *common])
        wall = time.perf_counter() - start
        saved = json.loads((out / "best" / "classifier.json").read_text())
        extra = json.loads((out / "heldout.json").read_text())  # the run's held-out report
        rows.append((label, extra["heldout"]["accuracy"], extra["heldout"]["macro_f1"], extra["heldout"]["n"],
                     extra["train"]["tokens"], wall, saved["max_tokens"], extra["settings"]["tgt_len"],
                     extra["settings"]["mem_len"] if mode == "memory" else 0))
    print(f"\nsteps {args.steps}, batch {args.batch_size}, lr {args.lr}, pooling {args.pooling}, seed {args.seed}, "
          f"documents of <= {args.doc_bytes} bytes")
    print("\n| setting | held-out accuracy | macro-F1 | held-out docs | tokens read in training | wall s |")
    print("|---|---|---|---|---|---|")
    for label, acc, f1, n, tokens, wall, _, tgt, mem in rows:
        print(f"| {label} (tgt_len {tgt}, mem_len {mem}) | {acc:.3f} | {f1:.3f} | {n} | {tokens:,} | {wall:.0f} |")


if __name__ == "__main__":
    main()
