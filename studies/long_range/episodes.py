"""Facts placed in real text at known distances: the data of the long-range retrieval suite.

How far back can a Transformer-XL *use* a fact? The suite states facts in filler text and asks for
them later, at a distance d that is exact in tokens. Everything is byte-level (one token per byte):

- **filler**: the built-in corpus (this Python's standard-library modules), split by file into
  train / valid / test filler (a file is in one split only). Bytes >= 0x80 are replaced by ``?``, so
  the filler is ASCII.
- **a fact** (a binding): ``\\x0e h v1 v2 \\x10``, a handle ``h`` (a byte in ``0x80``..``0xbf``)
  bound to a value of two bytes in ``0xc0``..``0xff``. Handle and value bytes never occur in the ASCII
  filler, nor do the markers ``\\x0e`` / ``\\x10`` (checked when the filler is read), so no part of a
  fact occurs in it.
- **a query**: ``\\x0e h``; the answer is the value ``v1 v2`` (then ``\\x10``). Exact match: both
  value bytes predicted (arg max) at once. The distance d is the answer's first position minus the
  value's first position in the fact.
- **keys**: a value is a test value when ``(v1 + v2) % 8 == 0``, else a training value: the values
  asked in evaluation were never seen in training (chance of an exact guess among test values:
  1 / 512), and the training and test filler are disjoint.

Two tasks are asked at each distance d:

- **pass-key**: one binding (one fixed handle) stated once, the query d tokens later, filler only between;
- **associative recall**: the binding asked for plus three others with distinct handles, stated at
  random places between the fact and the query; only the asked handle's value is right.

Training streams (:func:`training_stream`) are training episodes one after the other (training
filler, training values, distances drawn from a range, random handles not used again within twice
that range), read as one stream with the memory carried; the loss is on the answers only (the labels
elsewhere are -100). The suite itself trains on separate episodes, each read from an empty memory
(:mod:`txl_studies.long_range.suite`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from txl.config import IGNORE_INDEX
from txl.data.files import default_corpus_files
from txl.errors import TxlError

__all__ = ["FACT", "CLOSE", "VALUE_BYTES", "TASKS", "Filler", "Episode", "load_filler", "is_test_value",
           "training_stream", "episode", "episode_batch"]

FACT, CLOSE = 0x0E, 0x10  #: the markers that open a fact or a query, and close a value
VALUE_BYTES = 2  #: bytes in a value (each in 0x80..0xff)
HANDLES = range(0x80, 0xC0)  #: the handle bytes
VALUES = range(0xC0, 0x100)  #: the value bytes
PASS_KEY_HANDLE = 0x80
TASKS = ("pass-key", "associative")
DISTRACTORS = 3  #: other bindings placed between the fact and its query in the associative task


@dataclass(frozen=True)
class Filler:
    """The ASCII filler of each split: uint8 arrays [n] of the built-in corpus's files, by split, and the
    files of each split (``files["train"]`` ...: paths, in order)."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    files: dict

    def split(self, name: str) -> np.ndarray:
        """The filler of ``name`` ("train", "valid" or "test")."""
        return {"train": self.train, "valid": self.valid, "test": self.test}[name]


def load_filler(seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> Filler:
    """The built-in corpus's files shuffled with ``seed`` and split by file into train/valid/test filler,
    non-ASCII bytes replaced by ``?``.

    Raises:
        TxlError: no corpus files, a split without files, or a file holding a marker byte.
    """
    files = default_corpus_files()
    order = list(files)
    random.Random(seed).shuffle(order)
    n_train = int(len(order) * fractions[0])
    n_valid = int(len(order) * fractions[1])
    parts = (order[:n_train], order[n_train:n_train + n_valid], order[n_train + n_valid:])
    if any(not part for part in parts):
        raise TxlError(f"the built-in corpus has {len(order)} files: too few for a train, valid and test split")
    out = []
    for part in parts:
        data = np.frombuffer(b"".join(f.read_bytes() for f in part), dtype=np.uint8).copy()
        if np.isin(data, (FACT, CLOSE)).any():
            raise TxlError("the filler holds a fact marker byte (0x0e or 0x10): facts could occur in it")
        data[data >= 0x80] = ord("?")
        out.append(data)
    return Filler(*out, files={name: [str(f) for f in part] for name, part in zip(("train", "valid", "test"), parts)})


def is_test_value(value: np.ndarray) -> bool:
    """Whether a value is asked in evaluation only (``(v1 + v2) % 8 == 0``; else it is a training value)."""
    return int(value.sum()) % 8 == 0


def _value(rng: np.random.Generator, test: bool) -> np.ndarray:
    while True:
        value = rng.integers(VALUES.start, VALUES.stop, VALUE_BYTES)
        if is_test_value(value) == test:
            return value


def _fact(handle: int, value: np.ndarray) -> np.ndarray:
    return np.array([FACT, handle, *value.tolist(), CLOSE], dtype=np.int64)


def training_stream(rng: np.random.Generator, filler: np.ndarray, n_tokens: int, distances: tuple[int, int],
                    law: str = "uniform", reuse: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A training stream: training episodes one after the other, each with its fact and its question.

    Each episode is a pass-key or associative one (chosen at random) at a distance drawn from
    ``distances`` (inclusive; ``law`` "uniform" or "log": log-uniform), with training values
    (:func:`is_test_value` false), random handles (also for the pass-key task) none of which was used
    less than ``reuse`` tokens before (default: twice the longest distance), so within that reach a
    question's handle is bound by its own fact only. Read as one stream with the memory carried,
    earlier episodes are context like any other text.

    Returns:
        (int64 [n_tokens] tokens, int64 [n_tokens] labels: the token at answer positions, -100 elsewhere).
        Feed ``tokens[:-1]`` and score ``labels[1:]`` as a language model (labels are aligned with
        the tokens they name).

    Raises:
        TxlError: distances not in ``[8, ...]`` order or an unknown law.
    """
    lo, hi = distances
    if not 8 <= lo <= hi:
        raise TxlError(f"training distances must satisfy 8 <= low <= high, got {distances}")
    if law not in ("uniform", "log"):
        raise TxlError(f"the distance law must be 'uniform' or 'log', got {law!r}")
    reuse = reuse or 2 * hi
    last_use = {h: -(10 ** 9) for h in HANDLES}
    parts, pos = [], 0
    while pos < n_tokens:
        d = int(rng.integers(lo, hi + 1)) if law == "uniform" else int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))
        free = [h for h, at in last_use.items() if at < pos - reuse]
        if len(free) < 1 + DISTRACTORS:  # every handle was used recently: a stretch of filler only
            start = int(rng.integers(0, len(filler) - hi))
            parts.append((filler[start:start + hi].astype(np.int64), None))
            pos += hi
            continue
        handles = [int(h) for h in rng.permutation(free)[:1 + DISTRACTORS]]
        e = episode(rng, filler, d, TASKS[int(rng.integers(len(TASKS)))], tail=int(rng.integers(0, 64)), test=False,
                    handles=handles)
        for h in set(e.tokens[np.isin(e.tokens, handles)].tolist()):
            last_use[h] = pos + len(e.tokens)
        parts.append((e.tokens, e))
        pos += len(e.tokens)
    tokens = np.concatenate([t for t, _ in parts])[:n_tokens]
    labels = np.full(len(tokens), IGNORE_INDEX, dtype=np.int64)
    at = 0
    for t, e in parts:
        if e is not None and at + e.answer + VALUE_BYTES <= len(tokens):
            labels[at + e.answer:at + e.answer + VALUE_BYTES] = e.value
        at += len(t)
    return tokens, labels


@dataclass(frozen=True)
class Episode:
    """One evaluation episode: ``tokens`` int64 [n], the asked ``value`` (int64 [VALUE_BYTES]) whose
    answer starts at ``answer`` (index into ``tokens``), ``distance`` = answer - the fact's value start,
    and ``others``: the other bindings stated in it, ``(handle, value)`` pairs (associative task)."""

    tokens: np.ndarray
    value: np.ndarray
    answer: int
    distance: int
    others: tuple = ()


def episode(rng: np.random.Generator, filler: np.ndarray, distance: int, task: str, tail: int = 0,
            test: bool = True, handles: list[int] | None = None) -> Episode:
    """A pass-key or associative-recall episode at exactly ``distance`` (see the module docstring).

    A random prefix of filler (0..63 bytes) comes first and ``tail`` filler bytes after the answer, so
    that episodes of one batch put their fact and question at different places in a segment. Values
    are test values (``test``) or training values; ``handles`` (the asked one first, then the
    distractors' for the associative task) replaces the default choice (the fixed pass-key handle, or
    random distinct handles).

    Raises:
        TxlError: an unknown task, or a distance too short for a fact and a question (< 8).
    """
    if task not in TASKS:
        raise TxlError(f"the task must be one of {', '.join(TASKS)}, got {task!r}")
    if distance < 8:
        raise TxlError(f"a distance must be >= 8 tokens (a fact and a query), got {distance}")
    pre = int(rng.integers(0, 64))
    gap = distance - VALUE_BYTES - 1 - 2  # the fact's value and CLOSE, then filler, then FACT h of the query
    start = int(rng.integers(0, len(filler) - distance - pre - tail - 8))
    text = filler[start:start + pre + gap + tail].astype(np.int64)
    if handles is None:
        handles = [PASS_KEY_HANDLE] if task == "pass-key" else \
            [int(h) for h in rng.permutation(len(HANDLES))[:1 + DISTRACTORS] + HANDLES.start]
    handle, others = int(handles[0]), ([] if task == "pass-key" else [int(h) for h in handles[1:1 + DISTRACTORS]])
    value = _value(rng, test=test)
    middle = text[pre:pre + gap].copy()
    size = 3 + VALUE_BYTES
    slots = len(middle) // size
    stated = []
    if others and slots >= len(others):  # distractor bindings at distinct places between the fact and the query
        for h, k in zip(others, sorted(rng.choice(slots, len(others), replace=False).tolist())):
            stated.append((h, _value(rng, test=test)))
            middle[k * size:(k + 1) * size] = _fact(*stated[-1])
    tokens = np.concatenate([text[:pre], _fact(handle, value), middle, [FACT, handle], value, [CLOSE],
                             text[pre + gap:]]).astype(np.int64)
    answer = pre + size + gap + 2
    assert answer - (pre + 2) == distance
    return Episode(tokens, value, answer, distance, tuple(stated))


def episode_batch(episodes: list[Episode], pad: int = ord(" "), width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Episodes left-padded (with ``pad``) to one length L, the longest episode's or ``width`` if that is
    longer: (int64 [B, L] tokens, int64 [B, L] labels: the answer's bytes at their positions, -100 elsewhere)."""
    width = max([len(e.tokens) for e in episodes] + [width or 0])
    tokens = np.full((len(episodes), width), pad, dtype=np.int64)
    labels = np.full((len(episodes), width), IGNORE_INDEX, dtype=np.int64)
    for b, e in enumerate(episodes):
        shift = width - len(e.tokens)
        tokens[b, shift:] = e.tokens
        labels[b, shift + e.answer:shift + e.answer + VALUE_BYTES] = e.value
    return tokens, labels
