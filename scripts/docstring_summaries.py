"""Summaries of long documents, measured on the standard library: ROUGE of (a) / (b) / (c) on the test split.

Runs, printing each command (skipping the ones whose output already exists):

  1. ``txl data docstrings --out WORK/data``: functions and classes of the top-level standard-library
     modules with their docstring removed (documents), the first docstring sentence (summaries), split
     by module, and ``WORK/data/pretrain``: the default corpus without the valid and test modules;
  2. ``txl train WORK/data/pretrain --out WORK/lm``: a byte-level language model that has not seen the
     held-out modules (``--lm RUN`` uses an existing one instead);
  3. ``txl finetune --init WORK/lm --out WORK/ft``: fine-tuned on the train pairs, validated on valid;
  4. ``txl summarize WORK/ft WORK/data/test.jsonl``: (b) reading only the last ``tgt_len`` tokens of
     each document (``--prompt-tokens``), (c) reading the whole document with the memory;

then prints a Markdown table of ROUGE-1/2/L F1 (rouge-score, stemmed) for (a) the words of the
function or class name, (b) and (c), and a few example summaries. Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=src python scripts/docstring_summaries.py --work runs/docstrings
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

LM_ARGS = ["-q"]
FT_ARGS = ["-q", "train.max_steps=120", "train.batch_size=4", "train.eval_interval=60", "train.lr=5e-4",
           "train.warmup_steps=10", "finetune.max_prompt_tokens=512"]


def txl(*argv: str) -> float:
    """Run ``txl ARGV`` (this checkout's), echoing the command; returns its wall time in seconds."""
    print("$ txl " + " ".join(shlex.quote(a) for a in argv), flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "txl", *argv], check=True)
    return time.perf_counter() - start


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from txl.data.docstrings import name_words
    from txl.evaluation.rouge import rouge_scores

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="runs/docstrings", help="folder for the data, runs and summaries")
    ap.add_argument("--lm", help="an existing language-model run to fine-tune (default: pre-train WORK/lm)")
    ap.add_argument("--lm-args", default=" ".join(LM_ARGS), help="txl train arguments (pre-training)")
    ap.add_argument("--ft-args", default=" ".join(FT_ARGS), help="txl finetune arguments")
    ap.add_argument("--summarize-args", default="", help="more txl summarize arguments (both readings)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    work = Path(args.work)
    data, lm, ft = work / "data", Path(args.lm) if args.lm else work / "lm", work / "ft"
    times = {}
    if not (data / "test.jsonl").is_file():
        times["data"] = txl("data", "docstrings", "--out", str(data))
    if not (lm / "best").is_dir():
        times["pretrain"] = txl("train", str(data / "pretrain"), "--out", str(lm), *shlex.split(args.lm_args))
    if not (ft / "best").is_dir():
        times["finetune"] = txl("finetune", "--init", str(lm), "--out", str(ft), f"data.train={data / 'train.jsonl'}",
                                f"data.valid={data / 'valid.jsonl'}", *shlex.split(args.ft_args))
    tgt_len = json.loads((ft / "best" / "config.json").read_text())["tgt_len"]
    outputs = {"b": work / f"summaries-last{tgt_len}.jsonl", "c": work / "summaries-memory.jsonl"}
    for key, extra in (("b", ["--prompt-tokens", str(tgt_len)]), ("c", [])):
        if not outputs[key].is_file():
            times[key] = txl("summarize", str(ft), str(data / "test.jsonl"), "--out", str(outputs[key]),
                             "--max-new-tokens", str(args.max_new_tokens), *extra, *shlex.split(args.summarize_args))
    test = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    refs = [t["completion"] for t in test]
    preds = {"a": [name_words(t["name"]) for t in test]}
    for key, path in outputs.items():
        preds[key] = [json.loads(line)["summary"] for line in path.read_text().splitlines()]
    labels = {"a": "(a) the words of the name", "b": f"(b) fine-tuned, last {tgt_len} tokens only (no memory)",
              "c": "(c) fine-tuned, whole document with memory"}
    scores = {k: rouge_scores(p, refs) for k, p in preds.items()}
    print(f"\n{len(test)} test documents; wall seconds {json.dumps({k: round(v) for k, v in times.items()})}\n")
    print("| summary | ROUGE-1 | ROUGE-2 | ROUGE-L |\n|---|---|---|---|")
    for k, s in scores.items():
        print(f"| {labels[k]} | {s['rouge1']:.4f} | {s['rouge2']:.4f} | {s['rougeL']:.4f} |")
    order = sorted(range(len(test)), key=lambda i: -scores["c"]["per_pair"][i]["rougeL"])
    for title, picks in (("best (c)", order[:3]), ("worst (c)", order[-3:])):
        print(f"\n{title}:")
        for i in picks:
            print(json.dumps({"name": test[i]["name"], "module": test[i]["module"], "reference": refs[i],
                              "a": preds["a"][i], "b": preds["b"][i], "c": preds["c"][i],
                              "rougeL_c": round(scores["c"]["per_pair"][i]["rougeL"], 3)}, ensure_ascii=False))
    (work / "rouge.json").write_text(json.dumps({k: {t: s[t] for t in ("rouge1", "rouge2", "rougeL", "n")}
                                                 for k, s in scores.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
