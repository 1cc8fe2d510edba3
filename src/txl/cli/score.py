"""``txl score``: per-token and per-document log-probabilities of documents under a checkpoint.

Inputs (each FILE): a text file is one document; a directory gives one document per file (recursive,
sorted, hidden files skipped, as for training corpora); a ``.jsonl`` file (given directly or found in
a directory) gives one document per non-blank line, each a JSON object with a ``"text"`` string.

Output: JSON Lines (default; one object per document, with a ``tokens`` list unless
``--no-per-token``) or TSV (``--format tsv``: one row per token, or one row per document with
``--no-per-token``), to stdout or atomically to ``--out``. A summary line goes to stderr.
Every input is read and tokenised before anything is scored or written, so bad input leaves no
output file. Scoring rules (first token not scored, memory reset per document unless
``--carry-memory``) are those of :mod:`txl.evaluation.scoring`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from txl.cli.checks import check_exists, check_output, check_range
from txl.cli.common import (add_quantize, add_batch_size, add_checkpoint, add_checkpoint_name, add_device, add_dtype, add_force,
                            add_option, add_span, checkpoint_arg, load_checkpoint, print_notes, span_args)
from txl.errors import TxlError

NAME = "score"
HELP = "per-token and per-document log-probabilities (bpb / bpc / perplexity)"
EXAMPLE = "txl score runs/enwik8 docs/ notes.jsonl --format tsv --out scores.tsv"
DETAILS = ("Score documents with a checkpoint: log p(token | everything before it in the document) in nats, "
           "with the memory carried through each document and reset between documents. The first token of a "
           "document is not scored.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``score`` flags (no torch import here)."""
    add_checkpoint(p, option_alias=True)
    add_checkpoint_name(p)
    p.set_defaults(_more="files")  # later items of the list, after an option (see txl.cli.main)
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="a text file (one document), a directory (one document per file) or a .jsonl file "
                        "(one {\"text\": ...} document per line)")
    p.add_argument("--format", choices=["jsonl", "tsv"], default="jsonl", help="output format (default jsonl)")
    p.add_argument("--per-token", action=argparse.BooleanOptionalAction, default=True,
                   help="one entry per token (default); --no-per-token: per-document summaries only")
    p.add_argument("--carry-memory", action="store_true",
                   help="treat the documents as one continuous stream: memory and context carry over from one "
                        "document to the next (scored as one sequence; --batch-size does not apply)")
    add_span(p)
    add_batch_size(p, text="documents scored side by side")
    add_dtype(p)
    add_quantize(p)
    add_device(p)
    add_option(p, "--out", "-o", aliases=("--output",), metavar="FILE",
               help="write here (atomically) instead of stdout (- : stdout); an existing file only with --force")
    add_force(p)


def _read_jsonl(path: Path) -> list[tuple[str, str]]:
    """(name, text) for each non-blank line of a JSON Lines file."""
    from txl.fileio import read_jsonl

    docs = []
    for number, obj in read_jsonl(path):
        where = f"{path}:{number}"
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise TxlError(f"{where} must be a JSON object with a \"text\" string")
        docs.append((where, obj["text"]))
    if not docs:
        raise TxlError(f"{path} holds no documents (no non-blank lines)")
    return docs


def read_documents(items: list[str], tokenizer, min_tokens: int = 2) -> list[tuple[str, "object"]]:
    """(name, int64 token ids [n]) for every document of the FILE arguments, in order.

    Names are file paths, or ``PATH:LINE`` for JSON Lines documents.

    Raises:
        TxlError: a missing path, an unreadable file, text the tokenizer cannot encode (e.g.
            non-UTF-8 bytes for a char/word/BPE model, characters outside a char vocabulary),
            malformed JSON Lines, an empty document or one with fewer than ``min_tokens`` tokens.
    """
    from txl.data import read_corpus_files
    from txl.fileio import read_bytes

    docs = []
    for item in items:
        path = Path(item)
        if not path.exists():
            raise TxlError(f"input {path} does not exist; give text files, directories or .jsonl files")
        if not path.is_dir() and not path.is_file():
            raise TxlError(f"input {path} is not a regular file or directory")
        files = read_corpus_files(path) if path.is_dir() else [path]
        for f in files:
            if f.suffix == ".jsonl":
                for name, text in _read_jsonl(f):
                    docs.append((name, _encode(tokenizer.encode, text, name)))
            else:
                docs.append((str(f), _encode(lambda raw, source=str(f): tokenizer.encode_file_bytes(raw, source),
                                             read_bytes(f), str(f))))
    for name, ids in docs:
        if ids.size == 0:
            raise TxlError(f"document {name} is empty (no tokens); remove it or give it some text")
        if ids.size < min_tokens:
            raise TxlError(f"document {name} has {ids.size} token(s), nothing to score: the first token of a "
                           "document has no context (use --carry-memory to score it after the previous one)")
    return docs


def _encode(encode, data, name: str):
    """``encode(data)``, with a tokenizer error naming the document."""
    try:
        return encode(data)
    except TxlError as err:
        text = str(err)
        raise TxlError(text if name in text else f"{name}: {text}") from None


def _tsv_field(text: str) -> str:
    """A TSV cell: tab, newline and carriage return written as \\t, \\n, \\r (backslashes are kept as they are)."""
    return text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _num(x: float) -> float | None:
    """``x``, or None (JSON null) for NaN: an unscored token, or a document with no scored token."""
    return None if x != x else x


def _cell(x: float) -> str:
    """A number as a TSV cell, empty for NaN."""
    return "" if x != x else repr(x)


def format_scores(names: list[str], scores: list, tokenizer, unit: str, fmt: str, per_token: bool) -> str:
    """The whole output text for ``scores`` (see the module docstring for the layouts)."""
    from txl.evaluation.scoring import token_text

    out: list[str] = []
    if fmt == "tsv":
        out.append("\t".join(["document", "position", "token_id", "token", "logprob"] if per_token else
                             ["document", "n_tokens", "n_scored", "logprob", "loss", unit]))
    for name, s in zip(names, scores):
        if fmt == "tsv" and per_token:
            for pos, (tok, lp) in enumerate(zip(s.tokens.tolist(), s.logprobs.tolist())):
                out.append(f"{_tsv_field(name)}\t{pos}\t{tok}\t{_tsv_field(token_text(tokenizer, tok))}\t"
                           f"{_cell(lp)}")
        elif fmt == "tsv":
            out.append("\t".join([_tsv_field(name), str(s.n_tokens), str(s.n_scored), repr(s.total),
                                  _cell(s.loss), _cell(s.metric(unit))]))
        else:
            row = {"document": name, "n_tokens": s.n_tokens, "n_scored": s.n_scored, "logprob": s.total,
                   "loss": _num(s.loss), unit: _num(s.metric(unit))}
            if per_token:
                row["tokens"] = [{"position": pos, "id": tok, "text": token_text(tokenizer, tok),
                                  "logprob": _num(lp)}
                                 for pos, (tok, lp) in enumerate(zip(s.tokens.tolist(), s.logprobs.tolist()))]
            out.append(json.dumps(row, ensure_ascii=False))
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run ``txl score``; returns the exit status (user errors raise :class:`TxlError`)."""
    checkpoint_arg(args, rest="files")
    if not args.files:
        raise TxlError("give at least one FILE to score after the CHECKPOINT")
    check_range(args, 1, "batch_size")  # the span flags: txl.cli.checks.check_shared_flags
    check_exists(args.checkpoint, "checkpoint", kind="folder")  # arguments and paths before torch is imported
    for item in args.files:
        check_exists(item, "input")
    if args.out == "-":  # stdout, as every command's - means
        args.out = None
    check_output(args, args.out, [args.checkpoint, *args.files])

    from txl.evaluation.scoring import score_tokens, total_metric
    from txl.evaluation.stream import metric_unit
    from txl.fileio import atomic_write

    ckpt, _ = load_checkpoint(args, announce=True)
    docs = read_documents(args.files, ckpt.tokenizer, min_tokens=1 if args.carry_memory else 2)
    print_notes(args)  # which checkpoint (the input has passed its checks)
    names = [name for name, _ in docs]
    e = ckpt.run.eval
    span = span_args(args, e)
    scores = score_tokens(ckpt.model, [ids for _, ids in docs],
                          batch_size=args.batch_size if args.batch_size is not None else e.batch_size,
                          carry_memory=args.carry_memory, dtype=args.dtype, **span)
    unit = metric_unit(ckpt.tokenizer.kind)
    text = format_scores(names, scores, ckpt.tokenizer, unit, args.format, args.per_token)
    if args.out:
        atomic_write(args.out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), overwrite=args.force,
                     make_parents=False)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    value, count = total_metric(scores, unit)
    cfg = ckpt.model.config
    used = {k: (v if v is not None else getattr(cfg, k)) for k, v in span.items()}
    print(f"scored {len(scores)} document(s), {count} tokens: {unit} {value:.4f} "
          f"({', '.join(f'{k}={v}' for k, v in used.items())}, "
          f"{'memory carried across documents' if args.carry_memory else 'memory reset per document'})",
          file=sys.stderr)
    return 0
