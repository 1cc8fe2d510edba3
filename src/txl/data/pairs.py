"""Prompt/completion pairs for fine-tuning: reading them, the separator and end markers, token rows.

A pair becomes one token row ``prompt + SEP + completion + END``: the prompt, a separator, the
completion and an end-of-completion marker. The model reads the row left to right; the loss counts
the targets ``completion + END`` only (every other label is ``IGNORE_INDEX``), and at generation
time the prompt and ``SEP`` are fed and decoding stops at ``END``.

The markers are the same two *texts* for the byte, char and BPE tokenizers, and two reserved words
for the word tokenizer (whose text splits at whitespace, which the control characters are to
Python's ``str.split``):

================  =================================  =====================================
tokenizer kind    separator (SEP)                    end of completion (END)
================  =================================  =====================================
byte              byte 0x1D (ASCII group separator)  byte 0x04 (ASCII end of transmission)
bpe               the byte-level token of 0x1D       the byte-level token of 0x04
char              the character U+001D               the character U+0004
word              the word ``<sep>``                 the word ``<eoc>``
================  =================================  =====================================

Byte and byte-level BPE vocabularies hold every byte, so the markers are ids they already have.
A char or word vocabulary built from a corpus usually lacks them: :func:`add_markers` then appends
them as new entries (ids ``V``, ``V + 1``) and the fine-tuned model gets new embedding and output
rows for them (:func:`txl.training.finetune.load_grown`). A prompt or completion whose tokens
contain a marker id is refused (it would end the completion early or fake a separator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from txl.config import IGNORE_INDEX
from txl.data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer, WordTokenizer
from txl.errors import TxlError
from txl.fileio import json_kind, read_jsonl

SEPARATOR_TEXT = "\x1d"  # ASCII group separator (byte, char and BPE tokenizers)
END_TEXT = "\x04"  # ASCII end of transmission
SEPARATOR_WORD = "<sep>"  # word tokenizers
END_WORD = "<eoc>"


@dataclass
class Pair:
    """One training example: the ``prompt`` text, the ``completion`` text and where it came from."""

    prompt: str
    completion: str
    source: str


@dataclass(frozen=True)
class Markers:
    """The separator and end-of-completion token ids of one tokenizer (see the module docstring)."""

    sep_id: int
    end_id: int


def read_pairs(path: str | Path) -> list[Pair]:
    """Pairs from a JSON Lines file, one object ``{"prompt": str, "completion": str}`` per line
    (other keys are ignored; blank lines are skipped).

    Raises:
        TxlError: a missing or unreadable file, invalid JSON (naming the line), a line without string
            ``prompt`` and ``completion``, an empty completion, or a file without pairs.
    """
    path = Path(path)
    if not path.exists():
        raise TxlError(f"pairs file {path} does not exist; give a .jsonl file of {{\"prompt\", \"completion\"}}")
    if path.is_dir():
        raise TxlError(f"{path} is a folder; give a .jsonl file of {{\"prompt\", \"completion\"}} objects")
    pairs = []
    for number, obj in read_jsonl(path, "pairs file"):
        if not isinstance(obj, dict):
            raise TxlError(f'{path} line {number} must be a JSON object with string "prompt" and "completion"')
        for key in ("prompt", "completion"):
            if key not in obj:
                raise TxlError(f'{path} line {number} has no "{key}" (each line needs string "prompt" and '
                               '"completion")')
            if not isinstance(obj[key], str):
                raise TxlError(f'{path} line {number}: "{key}" must be a string, got {json_kind(obj[key])}')
        if not obj["completion"]:
            raise TxlError(f'{path} line {number} has an empty "completion"; there is nothing to learn from it')
        pairs.append(Pair(obj["prompt"], obj["completion"], f"{path}:{number}"))
    if not pairs:
        raise TxlError(f"pairs file {path} holds no pairs")
    return pairs


def pair_splits(data) -> dict[str, list[Pair]]:
    """The train/valid/test pairs a fine-tuning run's ``[data]`` section names (a
    :class:`~txl.config.DataConfig`): ``data.train`` and ``data.valid`` (and optionally ``data.test``)
    files, or one file ``data.path`` cut into train/valid/test by the fractions ``data.split``, in
    file order.

    Raises:
        TxlError: both kinds of source or neither, ``data.train`` without ``data.valid`` (or the
            reverse), a missing or malformed pairs file (see :func:`read_pairs`).
    """
    if data.train is not None or data.valid is not None or data.test is not None:
        if data.path is not None:
            raise TxlError("give either one pairs file (--data, split by data.split) or data.train/data.valid "
                           "files, not both")
        if data.train is None or data.valid is None:
            raise TxlError("separate pairs files need both data.train and data.valid (data.test is optional)")
        return {"train": read_pairs(data.train), "valid": read_pairs(data.valid),
                "test": read_pairs(data.test) if data.test is not None else []}
    if data.path is None:
        raise TxlError("give the pairs file (--data PAIRS.jsonl)")
    pairs = read_pairs(data.path)
    n_train = round(data.split[0] * len(pairs))
    n_valid = round(data.split[1] * len(pairs))
    return {"train": pairs[:n_train], "valid": pairs[n_train:n_train + n_valid], "test": pairs[n_train + n_valid:]}


def marker_texts(kind: str) -> tuple[str, str]:
    """The (separator, end) texts of a tokenizer kind (see the module docstring)."""
    return (SEPARATOR_WORD, END_WORD) if kind == "word" else (SEPARATOR_TEXT, END_TEXT)


def _single_id(tokenizer: Tokenizer, text: str) -> int | None:
    """The one id ``text`` encodes to on its own, or None when the vocabulary lacks it."""
    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.chars.index(text) if text in tokenizer.chars else None
    if isinstance(tokenizer, WordTokenizer):
        return tokenizer.words.index(text) if text in tokenizer.words else None
    ids = tokenizer.encode(text)
    return int(ids[0]) if len(ids) == 1 else None


def find_markers(tokenizer: Tokenizer) -> Markers:
    """The marker ids of a tokenizer that has them (byte and BPE always; char and word after
    :func:`add_markers`).

    Raises:
        TxlError: the vocabulary lacks a marker (a language model that was not fine-tuned for
            prompt/completion pairs; fine-tune it with ``txl finetune``).
    """
    sep_text, end_text = marker_texts(tokenizer.kind)
    sep, end = _single_id(tokenizer, sep_text), _single_id(tokenizer, end_text)
    if sep is None or end is None:
        raise TxlError(f"the {tokenizer.kind} vocabulary has no separator/end-of-completion markers "
                       f"({sep_text!r}, {end_text!r}): it is not a fine-tuned model; fine-tune it with txl finetune")
    return Markers(sep, end)


def add_markers(tokenizer: Tokenizer) -> tuple[Tokenizer, Markers, int]:
    """The tokenizer with both markers in its vocabulary, their ids, and how many entries were added.

    Byte and BPE tokenizers are returned as they are (0 added). A char or word vocabulary without a
    marker gets it appended (ids ``vocab_size``, ``vocab_size + 1``); the original ids do not move.

    Raises:
        TxlError: a BPE vocabulary in which a marker byte is not a single token (not byte-level).
    """
    if isinstance(tokenizer, (CharTokenizer, WordTokenizer)):
        entries = list(tokenizer.chars if isinstance(tokenizer, CharTokenizer) else tokenizer.words)
        missing = [t for t in marker_texts(tokenizer.kind) if t not in entries]
        if missing:
            if isinstance(tokenizer, CharTokenizer):
                tokenizer = CharTokenizer(entries + missing)
            else:
                tokenizer = WordTokenizer(entries + missing, lower=tokenizer.lower, normalize=tokenizer.normalize)
        return tokenizer, find_markers(tokenizer), len(missing)
    if isinstance(tokenizer, BPETokenizer):
        for text in marker_texts("bpe"):
            if _single_id(tokenizer, text) is None:
                raise TxlError(f"the BPE vocabulary has no single token for {text!r}; it is not byte-level")
    return tokenizer, find_markers(tokenizer), 0


def encode_prompt(tokenizer: Tokenizer, markers: Markers, prompt: str, max_tokens: int = 0,
                  source: str = "prompt") -> np.ndarray:
    """int64 [n + 1]: the ids of ``prompt`` (its last ``max_tokens`` when > 0) followed by the separator.

    Raises:
        TxlError: the prompt's ids contain a marker, or the text is not valid for the tokenizer.
    """
    ids = _encode(tokenizer, prompt, f"{source}: the prompt")
    _check_free(ids, markers, f"{source}: the prompt")
    if max_tokens > 0:
        ids = ids[-max_tokens:]
    return np.concatenate([ids, np.asarray([markers.sep_id], dtype=np.int64)])


def _encode(tokenizer: Tokenizer, text: str, what: str) -> np.ndarray:
    try:
        return np.asarray(tokenizer.encode(text), dtype=np.int64)
    except TxlError as err:
        raise TxlError(f"{what}: {err}") from None


def _check_free(ids: np.ndarray, markers: Markers, what: str) -> None:
    if np.isin(ids, [markers.sep_id, markers.end_id]).any():
        raise TxlError(f"{what} contains a reserved marker (separator or end of completion, see docs/finetuning.md); "
                       "remove it from the text")


def encode_pair(tokenizer: Tokenizer, markers: Markers, pair: Pair, max_prompt_tokens: int = 0) -> tuple[np.ndarray, int]:
    """The token row of a pair, int64 [n_prompt + 1 + n_completion + 1], and the index of its
    first completion token (``n_prompt + 1``).

    Raises:
        TxlError: a marker inside the prompt or completion, a completion that encodes to no tokens,
            or text the tokenizer cannot encode (e.g. an unknown character for a char model).
    """
    head = encode_prompt(tokenizer, markers, pair.prompt, max_prompt_tokens, pair.source)
    tail = _encode(tokenizer, pair.completion, f"{pair.source}: the completion")
    if tail.size == 0:
        raise TxlError(f"{pair.source}: the completion encodes to no tokens")
    _check_free(tail, markers, f"{pair.source}: the completion")
    return np.concatenate([head, tail, np.asarray([markers.end_id], dtype=np.int64)]), len(head)


def pair_batch(rows: Sequence[tuple[np.ndarray, int]], device: torch.device | str = "cpu"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded inputs and labels of encoded pairs (:func:`encode_pair`).

    Returns:
        ``(x, y)``: int64 [B, L] inputs ``row[:-1]`` (padding id 0) and labels ``row[1:]`` with
        ``IGNORE_INDEX`` everywhere except at the completion and END targets, so that only they are
        scored. ``L`` is the longest row minus one.
    """
    width = max(len(ids) for ids, _ in rows) - 1
    x = torch.zeros(len(rows), width, dtype=torch.long)
    y = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for b, (ids, start) in enumerate(rows):
        t = torch.as_tensor(ids)
        x[b, :len(ids) - 1] = t[:-1]
        y[b, start - 1:len(ids) - 1] = t[start:]
    return x.to(device), y.to(device)
