"""Labelled documents: reading (a folder per label, or JSON Lines) and a seeded stratified split."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from txl.data.tokenizers import decode_file_text
from txl.errors import TxlError, quoted, shorten
from txl.fileio import json_kind, read_bytes
from txl.fileio import read_jsonl as _jsonl_lines


@dataclass
class Document:
    """One document: its text, its label as given (a folder's name, or a JSON Lines label: a string or an
    integer) and where it came from (``path`` or ``path:line``)."""

    text: str
    label: str | int | None
    source: str


def label_names(docs: Sequence[Document]) -> list[str | int]:
    """The distinct labels of ``docs`` as given, ordered by their text (the class indices of a classifier).

    A label keeps its identity: the integer 1 and the string "1" are different labels, which would be one
    class once written as text (in the classifier's outputs), so such a pair is refused, not merged.

    Raises:
        TxlError: two labels with the same text, naming both and a document of each.
    """
    seen: dict[str, tuple[str | int, str]] = {}
    for doc in docs:
        if doc.label is None:
            continue
        key = str(doc.label)
        first = seen.setdefault(key, (doc.label, doc.source))
        if type(first[0]) is not type(doc.label):
            spelled = {label: f"{json_kind(label)} {shorten(json.dumps(label))} ({shorten(source)})"
                       for label, source in (first, (doc.label, doc.source))}
            raise TxlError(f"labels {' and '.join(spelled.values())} have the same text {quoted(key)} but are not the "
                           "same label; write every label of a class the same way (all strings or all numbers)")
    return sorted((label for label, _ in seen.values()), key=str)


def read_jsonl(path: str | Path, need_label: bool = True) -> list[Document]:
    """Documents from a JSON Lines file, one object ``{"text": ..., "label": ...}`` per line.

    Blank lines are skipped; labels may be strings or integers, kept as given (the integer 1 and the string
    "1" are different labels: :func:`label_names` refuses the pair).

    Raises:
        TxlError: unreadable file, a line that is not a JSON object with a string ``text`` (and a
            ``label`` when ``need_label``), naming the file and line number.
    """
    path = Path(path)
    docs = []
    for number, obj in _jsonl_lines(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise TxlError(f'{path} line {number} must be a JSON object with a string "text"')
        label = obj.get("label")
        if label is None and need_label:
            raise TxlError(f'{path} line {number} has no "label"' + (" (it is null)" if "label" in obj else ""))
        if label is not None and (not isinstance(label, (str, int)) or isinstance(label, bool)):
            raise TxlError(f'{path} line {number}: "label" must be a string or an integer, got {json_kind(label)}')
        docs.append(Document(obj["text"], label, f"{path}:{number}"))
    return docs


def read_text_file(path: str | Path, kind: str = "byte") -> str:
    """A file's text as a ``kind`` tokenizer reads it (:func:`txl.data.tokenizers.decode_file_text`):
    for "byte", bytes that are not UTF-8 are kept as lone surrogates (the byte tokenizer restores
    them); the char, word and BPE tokenizers need UTF-8.

    Raises:
        TxlError: the file cannot be read, or is not UTF-8 for a text tokenizer (the not-UTF-8 message
            every command gives, naming the byte and its offset).
    """
    return decode_file_text(read_bytes(path), kind, str(path))


def read_folder(root: str | Path) -> list[Document]:
    """Documents from ``root/LABEL/...``: every non-hidden file below a label folder, sorted by path.

    Raises:
        TxlError: ``root`` has no label folders with files.
    """
    root = Path(root)
    docs = []
    for label_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for dirpath, dirnames, filenames in os.walk(label_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if not name.startswith(".") and full.is_file():
                    docs.append(Document(read_text_file(full), label_dir.name, str(full)))
    if not docs:
        raise TxlError(f"{root} has no labelled documents: expected {root}/LABEL/FILE for each label")
    return docs


def load_labelled(path: str | Path, min_labels: int = 2) -> list[Document]:
    """Labelled documents from a folder per label or a JSON Lines file, checked for training.

    ``min_labels``: the fewest distinct labels accepted (2 for training data; 1 for held-out documents).

    Raises:
        TxlError: missing path, malformed input, no documents, an empty document, labels whose texts
            collide (:func:`label_names`), or fewer than ``min_labels`` labels.
    """
    path = Path(path)
    if not path.exists():
        raise TxlError(f"data {path} does not exist; give a folder DIR/LABEL/FILE or a .jsonl file")
    docs = read_folder(path) if path.is_dir() else read_jsonl(path)
    if not docs:
        raise TxlError(f"{path} holds no documents; give one JSON object per line with \"text\" and \"label\"")
    for doc in docs:
        if not doc.text:
            raise TxlError(f"document {doc.source} is empty; remove it or give it text")
    labels = label_names(docs)
    if len(labels) < max(1, min_labels):
        raise TxlError(f"{path} has {len(labels)} label(s) ({', '.join(map(str, labels)) or 'none'}); "
                       f"{'classification needs at least 2' if min_labels >= 2 else 'give labelled documents'}")
    return docs


def stratified_split(labels: Sequence[str | int], valid_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic held-out split: per label, a seeded shuffle puts ``round(fraction * n)`` documents
    (at least 1 and at most n - 1, none for a single document) into the held-out set.

    Returns:
        ``(train_indices, valid_indices)``, each sorted.

    Raises:
        TxlError: ``valid_fraction`` outside (0, 1), or no label with two documents.
    """
    if not 0.0 < valid_fraction < 1.0:
        raise TxlError(f"the held-out fraction must be in (0, 1), got {valid_fraction}")
    rng = np.random.default_rng(seed)
    train, valid = [], []
    for label in sorted(set(labels), key=str):  # labels as given (strings and integers): ordered by their text
        idx = np.array([i for i, x in enumerate(labels) if x == label])
        rng.shuffle(idx)
        n_valid = 0 if len(idx) < 2 else min(len(idx) - 1, max(1, round(valid_fraction * len(idx))))
        valid += idx[:n_valid].tolist()
        train += idx[n_valid:].tolist()
    if not valid:
        raise TxlError("no label has two documents, so nothing can be held out; add documents")
    return sorted(train), sorted(valid)
