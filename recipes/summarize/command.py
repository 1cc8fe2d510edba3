"""``txl summarize``: write the completion of every document by a fine-tuned model, as JSON Lines.

Each input is a text file (one document) or a ``.jsonl`` file (one ``{"prompt": ...}`` or
``{"text": ...}`` object per line; a ``"completion"`` string there is the reference summary). The
document is read segment by segment with the memory, however long it is, then the summary is
decoded until the model's end-of-completion marker (``txl.generation.complete``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from txl.cli.checks import check_decoding_flags, check_exists, check_output, check_range, require_installed
from txl.cli.common import (add_batch_size, add_checkpoint, add_checkpoint_name, add_decoding_flags, add_device,
                            add_dtype, add_force, add_json, add_option, add_quantize, add_seed, add_span, decoding_rules,
                            emit_json, load_checkpoint, print_notes, underscore)
from txl.errors import TxlError

NAME = "summarize"
HELP = "summaries of long documents by a fine-tuned model (JSON Lines out)"
EXAMPLE = "txl summarize runs/docstrings data/docstrings/test.jsonl --out summaries.jsonl --rouge"
DETAILS = ("One JSON object per document: source, summary, and the reference (\"completion\") and \"name\" when "
           "the input line has them. --prompt-tokens N reads only the last N tokens of each document. --rouge "
           "prints ROUGE-1/2/L F1 against the references (needs rouge-score: in the txl folder, "
           ".venv/bin/python -m pip install -e '.[rouge]').")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``summarize`` flags (no torch import here)."""
    add_checkpoint(p, text="a fine-tuned checkpoint or run directory (txl finetune; uses its best/)")
    add_checkpoint_name(p)
    p.set_defaults(_more="inputs")
    p.add_argument("inputs", nargs="+", metavar="FILE_OR_JSONL",
                   help="a text file (one document) or a .jsonl file of {\"prompt\" or \"text\", [\"completion\"]}")
    add_option(p, "--out", "-o", metavar="FILE", default="-", help="JSON Lines output (default - : stdout)")
    add_force(p)
    add_option(p, "--prompt-tokens", aliases=underscore("--prompt-tokens"), type=int, default=0, metavar="N",
               help="read only the last N tokens of each document (default 0: all of it, with the memory)")
    add_decoding_flags(p, max_new_tokens=128, max_new_help="longest summary in tokens", temperature=0.0,
                       stop_help="also stop after this text, which is not written (repeatable)",
                       beam_help="beam search with N beams (default 1: greedy or sampling)", ranked="summaries")
    add_batch_size(p, default=8, text="documents decoded together")
    add_seed(p, default=0, text="seeds sampling (document i draws with its own generator, seeded seed + i)")
    add_span(p, ("mem_len",), default_text="the model's")
    p.add_argument("--rouge", action="store_true", help="print ROUGE-1/2/L F1 against the references")
    add_json(p, what="the ROUGE scores (with --rouge)")
    add_dtype(p)
    add_quantize(p)
    add_device(p)


def read_inputs(items: list[str]) -> list[dict]:
    """``{"source", "text" or "data", ["reference"], ["name"]}`` for every document of the inputs, in order
    (a JSON Lines document also has ``"where"``, ``FILE line N``, for its messages).

    A JSON Lines document has its ``"text"``; a text file its raw ``"data"`` (bytes), turned into text
    by :func:`document_texts` once the tokenizer is known. Needs no torch.

    Raises:
        TxlError: a missing or unreadable file, an empty text file, a bad JSON line or field (naming it:
            :func:`_jsonl_document`), no documents.
    """
    from txl.fileio import read_bytes, read_jsonl

    docs = []
    for item in items:
        path = Path(item)
        if not path.is_file():
            raise TxlError(f"{path} " + ("is not a file" if path.exists() else "does not exist"))
        if path.suffix != ".jsonl":
            data = read_bytes(path)
            if not data:
                raise TxlError(f"document {path} is empty; remove it or give it text")
            docs.append({"source": str(path), "data": data})
            continue
        # other keys are ignored: data files carry more (txl data docstrings writes "module" and "kind")
        for number, obj in read_jsonl(path):
            docs.append(_jsonl_document(obj, f"{path} line {number}", f"{path}:{number}"))
    if not docs:
        raise TxlError("no documents in the inputs")
    return docs


def _jsonl_document(obj, where: str, source: str) -> dict:
    """The document of one JSON Lines object, every field it may have checked as ``txl finetune`` checks a
    pair's: a non-empty ``"prompt"`` or ``"text"`` string (one of them), and when present a non-empty
    ``"completion"`` string (the reference) and a ``"name"`` string.

    Raises:
        TxlError: naming the line and the field: missing, of another JSON type, empty, or both
            ``"prompt"`` and ``"text"``.
    """
    from txl.fileio import json_kind

    if not isinstance(obj, dict):
        raise TxlError(f'{where} must be a JSON object with a "prompt" (or "text") string, got {json_kind(obj)}')
    keys = [k for k in ("prompt", "text") if k in obj]
    if not keys:
        raise TxlError(f'{where} has no "prompt" (or "text"): each line needs the document as a string')
    if len(keys) == 2:
        raise TxlError(f'{where} has both "prompt" and "text": give the document once')
    text = obj[keys[0]]
    if not isinstance(text, str):
        raise TxlError(f'{where}: "{keys[0]}" must be a string, got {json_kind(text)}')
    if not text:
        raise TxlError(f'{where}: the document ("{keys[0]}") is empty; remove the line or give it text')
    doc = {"source": source, "where": where, "text": text}
    for key, out in (("completion", "reference"), ("name", "name")):
        if key in obj:
            if not isinstance(obj[key], str):
                raise TxlError(f'{where}: "{key}" must be a string, got {json_kind(obj[key])}')
            if key == "completion" and not obj[key]:
                raise TxlError(f'{where} has an empty "completion" (the reference summary); remove the key or '
                               'give the summary')
            doc[out] = obj[key]
    return doc


def document_texts(docs: list[dict], kind: str) -> None:
    """Give every text-file document of :func:`read_inputs` its ``"text"`` as a ``kind`` tokenizer reads
    the file (:func:`txl.data.tokenizers.decode_file_text`).

    Raises:
        TxlError: a file that is not UTF-8 for a char, word or BPE model (the not-UTF-8 message).
    """
    from txl.data.tokenizers import decode_file_text

    for doc in docs:
        if "data" in doc:
            doc["text"] = decode_file_text(doc.pop("data"), kind, doc["source"])


def check_finetuned(path: str) -> None:
    """Refuse a checkpoint (or run directory) that was not fine-tuned on prompt/completion pairs: its
    ``run.json`` has no ``[finetune]`` section (or it has no ``run.json``). A plain language model never
    learnt what follows the separator, and would print noise until ``-n`` tokens. Reads JSON only (the
    first of ``path``, ``path/best``, ``path/last`` that holds ``run.json`` or ``config.json``), so it runs
    before torch and the weights load; a folder that holds neither is left to loading to report.

    Raises:
        TxlError: naming the checkpoint and the command that fine-tunes it; an unreadable ``run.json``.
    """
    from txl.config import CLASSIFIER_NAME, CONFIG_NAME, RUN_NAME
    from txl.fileio import read_json_object

    folder = Path(path)
    found = next((f for f in (folder, folder / "best", folder / "last")
                  if (f / RUN_NAME).is_file() or (f / CONFIG_NAME).is_file()), None)
    if found is None or any((f / CLASSIFIER_NAME).is_file() for f in (folder, folder / "best", folder / "last")):
        return  # loading reports it (a classifier is named as such)
    saved = read_json_object(found / RUN_NAME, "run config") if (found / RUN_NAME).is_file() else {}
    if not isinstance(saved.get("finetune"), dict):
        raise TxlError(f"{path} is a language model that was not fine-tuned on prompt/completion pairs (its "
                       "run.json has no [finetune] section), so its summaries would be noise; fine-tune it first: "
                       f"txl finetune --init {path} --data PAIRS.jsonl --out RUN, then txl summarize RUN ...")


def run(args: argparse.Namespace) -> int:
    """Run ``txl summarize``."""
    check_decoding_flags(args)  # torch-free: checked before torch loads
    check_range(args, 1, "num_beams", "batch_size")
    check_range(args, 0, "prompt_tokens", "mem_len")
    if args.json and not args.rouge:
        raise TxlError("--json writes the ROUGE scores: add --rouge (the summaries go to stdout or --out)")
    if args.rouge:  # an optional dependency: missing, it is said before any work
        from txl_recipes.summarize.rouge import ROUGE_MISSING

        require_installed("rouge_score", message=ROUGE_MISSING)
    check_exists(args.checkpoint, "checkpoint", kind="folder")
    check_output(args, args.out, inputs=[args.checkpoint, *args.inputs])
    check_output(args, args.json, inputs=[args.checkpoint, *args.inputs], flag="--json")
    docs = read_inputs(args.inputs)
    if args.rouge and not all("reference" in d for d in docs):
        missing = next(d["source"] for d in docs if "reference" not in d)
        raise TxlError(f"--rouge needs a reference (\"completion\") for every document; {missing} has none")
    check_finetuned(args.checkpoint)

    import torch  # once the arguments and the inputs have passed their checks

    from txl.data.pairs import encode_prompt, find_markers
    from txl.generation import StopText, complete
    from txl.runtime import autocast

    StopText(args.stop)
    rules = decoding_rules(args)
    ckpt, device = load_checkpoint(args, announce=True)
    markers = find_markers(ckpt.tokenizer)
    document_texts(docs, ckpt.tokenizer.kind)
    for doc in docs:  # every document encodes before any work
        where = doc.get("where", doc["source"])
        if encode_prompt(ckpt.tokenizer, markers, doc["text"], source=where).size < 2:  # the separator alone
            raise TxlError(f"{where}: the document encodes to no tokens; remove it or give it text")
    print_notes(args)
    rows = []
    with autocast(device, args.dtype):
        for start in range(0, len(docs), args.batch_size):
            chunk = docs[start:start + args.batch_size]
            generators = [torch.Generator(device=device).manual_seed(args.seed + start + i) for i in range(len(chunk))]
            ended: list[bool] = []
            summaries = complete(ckpt.model, ckpt.tokenizer, [d["text"] for d in chunk],
                                 max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.prompt_tokens,
                                 rules=rules, generator=generators, stop=args.stop, num_beams=args.num_beams,
                                 length_penalty=args.length_penalty, batch_size=args.batch_size, mem_len=args.mem_len,
                                 ended=ended)
            for doc, summary, done in zip(chunk, summaries, ended, strict=True):
                row = {"source": doc["source"], "summary": summary, "ended": done}
                row.update({k: doc[k] for k in ("reference", "name") if k in doc})
                rows.append(row)
                if args.out == "-":
                    print(json.dumps(row, ensure_ascii=False), flush=True)
    if args.out != "-":
        from txl.fileio import atomic_write

        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        atomic_write(args.out, lambda tmp: Path(tmp).write_bytes(payload), overwrite=args.force, make_parents=False)
    if args.rouge:
        from txl_recipes.summarize.rouge import rouge_scores

        scores = rouge_scores([r["summary"] for r in rows], [r["reference"] for r in rows])
        print(f"ROUGE-1 {scores['rouge1']:.4f}  ROUGE-2 {scores['rouge2']:.4f}  ROUGE-L {scores['rougeL']:.4f} "
              f"(F1, stemmed; {scores['n']} documents)", file=sys.stderr)
        if args.json:
            emit_json(args.json, {k: scores[k] for k in ("rouge1", "rouge2", "rougeL", "n")}, force=args.force)
    return 0
