"""Corpus loading: find files, tokenize them (through a .npy token cache) and split them.

The training loop calls :func:`load_corpus`; the other functions are its building blocks.
Token arrays are 1-D numpy arrays of the narrowest dtype that holds the vocabulary
(see :func:`token_dtype`). The token array is written into the cache folder once and read back
memory-mapped (:mod:`txl.data.token_cache`): a split is a view of the file, and only the segments a
reader takes come into memory (:class:`~txl.data.iterators.LMOrderedIterator`). Without a cache
folder the same is done in a temporary one, and the arrays come back in memory. Byte
text is copied into the cache in chunks, char, word and BPE text counted and encoded chunk by chunk
(:mod:`txl.data.streaming`), so neither writing nor reading holds the corpus in memory. Where the
splits are cut: :mod:`txl.data.splits`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from txl.config import check_split
from txl.data.splits import SPLITS, _check_sizes, _split_fix, line_cuts, split_files, split_tokens
from txl.data.streaming import read_range, span_of
from txl.data.token_cache import cached, copied, file_hashes, fingerprint, read_index, streamed, streamed_vocabulary
from txl.data.tokenizers import TOKENIZER_KINDS, ByteTokenizer, Tokenizer, WordTokenizer
from txl.data.files import _file_size, _read_text, dataset_info, default_corpus_files, load_bytes, read_corpus_files
from txl.errors import TxlError
from txl.fileio import path_inside
from txl.runtime import default_cache_dir

__all__ = [
    "CorpusSplits", "default_corpus_files", "encode_corpus", "load_bytes",
    "load_corpus", "read_corpus_files", "split_tokens", "token_dtype",
]

PathLike = str | os.PathLike[str]


def token_dtype(vocab_size: int) -> np.dtype:
    """Narrowest dtype for ids ``< vocab_size``: uint8 (<= 256), uint16 (<= 65536), else int32."""
    if vocab_size <= 256:
        return np.dtype(np.uint8)
    if vocab_size <= 65536:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def encode_corpus(files: Sequence[PathLike], tokenizer: Tokenizer, cache_dir: PathLike | None = None, *,
                  workers: int = 1, progress: bool = False) -> np.ndarray:
    """Tokenize the concatenation of ``files`` into a 1-D array of dtype ``token_dtype(vocab)``.

    With ``cache_dir`` the result is stored as ``<cache_dir>/<fingerprint>.npy`` and reused
    while neither the tokenizer nor any file (path or content) changes; a cache file that
    fails to load is rewritten. The array returned is then the file memory-mapped read-only
    (``np.memmap``). Byte-level text goes into the cache in chunks, and char, word and BPE text
    is encoded chunk by chunk (:func:`txl.data.streaming.encode_to_file`, by ``workers`` processes,
    with a progress bar on stderr when ``progress``): a corpus larger than memory is written and
    read without being held. A tokenizer of the caller's own kind encodes the whole text at once.
    Without ``cache_dir`` the same is done in a temporary folder and the array comes back in memory.

    Raises :class:`TxlError` for unreadable files, non-UTF-8 files (char/word tokenizers; the
    message names the file and byte offset), unknown characters, or an unwritable cache.
    """
    if cache_dir is None:
        with tempfile.TemporaryDirectory(prefix="txl-cache-") as tmp:
            return np.array(encode_corpus(files, tokenizer, tmp, workers=workers, progress=progress))
    paths = [Path(f) for f in files]
    dtype = token_dtype(tokenizer.vocab_size)
    hashes = file_hashes(paths, cache_dir)
    key = fingerprint(tokenizer, hashes, None)
    if isinstance(tokenizer, ByteTokenizer):
        return copied(cache_dir, key, paths, hashes)
    if tokenizer.kind in TOKENIZER_KINDS:
        return streamed(cache_dir, key, dtype, span_of(paths, 0, sum(_file_size(p) for p in paths)), tokenizer,
                        workers, progress, hashes)

    def compute() -> np.ndarray:  # a tokenizer of the caller's own kind: encoded in memory
        text = _read_text(paths, tokenizer.kind)
        try:
            return tokenizer.encode(text).astype(dtype)
        except TxlError as e:
            raise TxlError(f"corpus {paths[0] if len(paths) == 1 else paths[0].parent}: {e}") from None

    return cached(cache_dir, key, dtype, compute)


@dataclass
class CorpusSplits:
    """A tokenized corpus, ready for :class:`~txl.data.iterators.LMOrderedIterator`.

    Attributes:
        tokenizer: the tokenizer used (built from the corpus, or the one passed in).
        train, valid, test: 1-D token arrays (dtype from :func:`token_dtype`); ``valid`` /
            ``test`` may be empty when not requested (fraction 0 or no test file).
        source: human-readable description of where the text came from.
        files: the corpus file paths, as strings.
        train_shards: for a shuffled-sentence corpus (lm1b) the training shard files, one
            sentence per line; ``train`` is then empty and training reads the shards with
            :func:`shard_sentences` and :class:`~txl.data.iterators.LMShuffledIterator`.
        on_disk: for each split read memory-mapped from the token cache, ``(file, byte offset,
            bytes)`` of its tokens in that file: what reads them whole (a fingerprint) reads the
            file there instead of the mapping, which would bring the corpus into memory.
    """

    tokenizer: Tokenizer
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str
    files: list[str] = field(default_factory=list)
    train_shards: list[Path] = field(default_factory=list)
    on_disk: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def documents(self, name: str) -> list[int] | None:
        """Where the documents (the corpus files, e.g. the books of PG-19) of split ``name`` start: token
        positions in the split, ascending, from the index of its token-cache file. A split that begins
        inside a file does not list its own first token; for char, word and BPE text a file whose first line
        goes on from the previous file's last is no new document. None when the split is not in a token cache
        with an index (no cache folder, or a cache written without one).

        Raises:
            TxlError: ``name`` is not "train", "valid" or "test".
        """
        if name not in SPLITS:
            raise TxlError(f"no split {name!r}: choose one of {', '.join(SPLITS)}")
        where = self.on_disk.get(name)
        index = read_index(where[0]) if where else None
        if index is None:
            return None
        file, offset, nbytes = where
        tokens = np.load(file, mmap_mode="r")
        if np.dtype(index["dtype"]) != tokens.dtype or index["tokens"] != len(tokens):
            return None  # an index that does not describe this array
        itemsize = tokens.dtype.itemsize
        first = (offset - int(tokens.offset)) // itemsize
        starts = {s["first_token"] for s in index["sources"] if s["bytes"][0] == 0 and s["first_token"] is not None}
        return sorted(t - first for t in starts if first <= t < first + nbytes // itemsize)


def _on_disk(roots: dict[str, np.ndarray], parts: dict[str, np.ndarray]) -> dict[str, tuple[str, int, int]]:
    """``(file, byte offset, bytes)`` of each split in ``parts`` that is a view of the memory-mapped token
    file ``roots[name]`` (a split held in memory has none)."""
    found = {}
    for name, part in parts.items():
        root = roots.get(name)
        if isinstance(root, np.memmap) and root.filename is not None and part.size:
            start = part.__array_interface__["data"][0] - root.__array_interface__["data"][0]
            found[name] = (str(root.filename), int(root.offset) + start, int(part.nbytes))
    return found


def _human_size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    return f"{n / 1e3:.1f} kB" if n < 1e6 else f"{n / 1e6:.1f} MB"


def _describe(label: str, files: Sequence[Path]) -> str:
    size = sum(_file_size(f) for f in files)
    what = str(files[0]) if len(files) == 1 else f"{len(files)} files"
    return f"{label} {what} ({_human_size(size)})"


@dataclass(frozen=True)
class _Loading:
    """What every loader takes from :func:`load_corpus`: the tokenizer ``kind``, the caller's tokenizer
    ``tok`` (None: a new vocabulary is built), the vocabulary options ``opts``, the token cache folder, and
    the ``workers`` and ``progress`` bars of the encoding."""

    kind: str
    tok: Tokenizer | None
    opts: dict
    cache_dir: PathLike
    workers: int
    progress: bool

    def encode(self, files: Sequence[Path], tok: Tokenizer) -> np.ndarray:
        """:func:`encode_corpus` of ``files`` with this load's cache folder, workers and progress."""
        return encode_corpus(files, tok, self.cache_dir, workers=self.workers, progress=self.progress)

    def vocabulary(self, files: list[Path]) -> Tokenizer:
        """A new char, word or BPE vocabulary from the text of ``files``, counted chunk by chunk into the
        cache folder (char takes no options)."""
        return streamed_vocabulary(self.kind, span_of(files, 0, sum(_file_size(f) for f in files)),
                                   self.opts if self.kind != "char" else {}, file_hashes(files, self.cache_dir), {},
                                   self.cache_dir, self.progress)


def _line_fraction_splits(files: list[Path], fr: tuple[float, float, float],
                          how: _Loading) -> tuple[Tokenizer, dict[str, np.ndarray]]:
    """Word/BPE with fractions: the text cut at the line starts nearest the byte fractions, the vocabulary
    from the train text, each split encoded into its cache file and memory-mapped; all of it read chunk by
    chunk, never the whole text in memory."""
    total = sum(_file_size(f) for f in files)
    b1, b2 = line_cuts(lambda lo, hi: read_range(files, lo, hi), total, fr)
    spans = dict(zip(SPLITS, (span_of(files, 0, b1), span_of(files, b1, b2), span_of(files, b2, total))))
    hashes = file_hashes(files, how.cache_dir)
    tok = how.tok
    if tok is None:
        if not b1:
            raise TxlError(f"cannot build a {how.kind} vocabulary from empty text; give a non-empty corpus")
        tok = streamed_vocabulary(how.kind, spans["train"], how.opts, hashes, {"split": list(fr)}, how.cache_dir,
                                  how.progress)
    dtype = token_dtype(tok.vocab_size)
    parts = {name: streamed(how.cache_dir, fingerprint(tok, hashes, {"part": name, "split": list(fr)}), dtype,
                             spans[name], tok, how.workers, how.progress, hashes) for name in SPLITS}
    return tok, parts


def load_corpus(
    path: PathLike | None = None,
    tokenizer: str = "byte",
    *,
    train: PathLike | None = None,
    valid: PathLike | None = None,
    test: PathLike | None = None,
    split: Sequence[float] = (0.9, 0.05, 0.05),
    pattern: str = "*",
    min_freq: int = 1,
    max_size: int | None = None,
    lower: bool = False,
    cache_dir: PathLike | None = None,
    tokenizer_obj: Tokenizer | None = None,
    normalize: str = "none",
    workers: int = 1,
    progress: bool = False,
    split_by: str = "text",
) -> CorpusSplits:
    """Load, tokenize and split a corpus: the one entry point of the training loop.

    Sources (exactly one):
      * ``train``/``valid`` (+ optional ``test``) files or folders: separate split files;
        ``test`` missing gives an empty test array.
      * ``path``, a folder prepared by ``txl data prepare`` (it holds ``dataset.json``): its
        ``train.txt``/``valid.txt``/``test.txt`` are the splits (``split`` and ``pattern`` are not
        used). :func:`~txl.data.files.dataset_info` gives its recommended tokenizer kind.
      * ``path``, a file or folder (files matching ``pattern``): one corpus cut by ``split``
        fractions (train, valid, test), in order. Byte/char: the token array is cut. Word/bpe:
        the text is cut at the line starts nearest the byte fractions, so splits hold whole lines.
        With ``split_by="file"`` a folder is cut between files instead (:func:`split_files`): no
        file (a book, a document) is in two splits.
      * neither: the default corpus (:func:`default_corpus_files`).

    Tokenizer: ``tokenizer_obj`` if given (``tokenizer`` is then ignored), else a new
    ``tokenizer`` kind: byte needs no data, char is built from all the text, word and bpe from
    the train text only (word: ``min_freq``, ``max_size``, ``lower``, ``normalize``, see
    :meth:`WordTokenizer.build`; bpe: ``max_size`` = vocabulary size, default
    :data:`~txl.data.token_cache.BPE_DEFAULT_VOCAB`, ``min_freq`` the minimum pair count of a merge).
    ``cache_dir`` caches token arrays, read back memory-mapped; byte text is copied and char, word and BPE
    text counted and encoded chunk by chunk (``workers`` processes encode; ``progress``: bars on stderr),
    so a corpus larger than memory loads (:mod:`txl.data.streaming`). Without ``cache_dir`` the same load
    goes through a temporary folder, and the arrays come back in memory.

    Raises :class:`TxlError` for: both ``path`` and split files, ``train`` without ``valid`` (or
    the reverse), missing/empty/unreadable files, non-UTF-8 text for char/word, unknown
    characters with a given char tokenizer, bad fractions, a train split under 2 tokens, or a
    requested valid/test split under 2 tokens, or a shuffled corpus (lm1b) with a tokenizer other
    than word. A prepared shuffled corpus returns its training shards in ``train_shards``.
    """
    kind = tokenizer_obj.kind if tokenizer_obj is not None else tokenizer
    if kind not in TOKENIZER_KINDS:
        raise TxlError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
    opts = {"min_freq": min_freq, "max_size": max_size, "lower": lower, "normalize": normalize}
    how = _Loading(kind, tokenizer_obj, opts, cache_dir, workers, progress)
    if cache_dir is not None:
        return _load_from(how, path, train, valid, test, split, pattern, split_by)
    with tempfile.TemporaryDirectory(prefix="txl-cache-") as tmp:  # the same load, its arrays then held in memory
        corpus = _load_from(replace(how, cache_dir=tmp), path, train, valid, test, split, pattern, split_by)
        return replace(corpus, train=np.array(corpus.train), valid=np.array(corpus.valid),
                       test=np.array(corpus.test), on_disk={})


def _load_from(how: _Loading, path: PathLike | None, train: PathLike | None, valid: PathLike | None,
               test: PathLike | None, split: Sequence[float], pattern: str, split_by: str) -> CorpusSplits:
    """:func:`load_corpus` of its sources (see there) once the tokenizer kind is checked."""
    if train is not None or valid is not None or test is not None:
        if path is not None:
            raise TxlError("give either a corpus path (split by fractions) or train/valid/test files, not both")
        if train is None or valid is None:
            raise TxlError("separate split files need both a train and a valid file (test is optional)")
        sets = {"train": read_corpus_files(train, pattern), "valid": read_corpus_files(valid, pattern)}
        if test is not None:
            sets["test"] = read_corpus_files(test, pattern)
        return _load_separate(sets, how)
    info = dataset_info(path) if path is not None else None
    if info is not None and split_by == "file":
        raise TxlError(f"{path} is prepared with its own splits; data.split_by = \"file\" cuts a folder of text "
                       "by files: leave it out here")
    if info is not None and info.get("shuffled"):
        return _load_shuffled(Path(path), info, how)
    if info is not None:
        corpus = _load_separate(_prepared_sets(Path(path), info), how)
        corpus.source = f"{info.get('name') or 'dataset'} in {path} ({corpus.source})"
        return corpus
    if path is None:
        files = default_corpus_files()
        label = f"default corpus (Python standard library in {files[0].parent}):"
    else:
        files, label = read_corpus_files(path, pattern), "corpus"
    fr = check_split(split, "split fractions")
    if split_by == "file":
        return _load_separate(split_files(files, fr), how)
    if split_by != "text":
        raise TxlError(f"split_by must be 'text' or 'file', got {split_by!r}")
    return _load_fractions(files, label, fr, how)


def _load_shuffled(root: Path, info: dict, how: _Loading) -> CorpusSplits:
    """A prepared shuffled-sentence corpus (lm1b): word vocabulary from the training shards, ordered
    valid/test arrays, and the shard list for training."""
    # absolute: shards used in place (prepared from a folder); relative: extracted into the dataset folder
    where = str(root / "dataset.json")
    shards = [Path(s) if isinstance(s, str) and Path(s).is_absolute() else path_inside(root, s, where, nested=True)
              for s in info.get("train_shards") or []]
    if not shards:
        raise TxlError(f"{root / 'dataset.json'} lists no training shards; run txl data prepare again")
    for shard in shards:
        _file_size(shard)  # a clear error for a missing shard
    tok = how.tok
    if tok is None:
        if how.kind != "word":
            raise TxlError(f"{info.get('name')} is a word-level corpus of sentences: use tokenizer=word")
        tok = WordTokenizer.build((_read_text([s], "word") for s in shards), **how.opts)
    parts = {name: how.encode([root / f"{name}.txt"], tok) for name in ("valid", "test")}
    parts["train"] = np.zeros(0, dtype=token_dtype(tok.vocab_size))
    source = f"{info.get('name')} in {root}: {len(shards)} shuffled training shard(s)"
    return CorpusSplits(tokenizer=tok, train=parts["train"], valid=parts["valid"], test=parts["test"],
                        source=source, files=[str(s) for s in shards], train_shards=shards)


def shard_sentences(shard: PathLike, tokenizer: Tokenizer) -> list[np.ndarray]:
    """The sentences (lines) of one shard as id arrays, each ending with ``<eos>`` (word tokenizer).

    Raises:
        TxlError: an unreadable or non-UTF-8 shard.
    """
    text = _read_text([shard], "word")
    return [tokenizer.encode(line + "\n") for line in text.splitlines() if line.strip()]


def _prepared_sets(root: Path, info: dict) -> dict[str, list[Path]]:
    """The split files of a folder written by ``txl data prepare``."""
    files = info.get("files") or {}
    sets = {}
    for name in SPLITS:
        rel = files.get(name) if isinstance(files, dict) else None
        if not isinstance(rel, str):
            raise TxlError(f"{root / 'dataset.json'} does not name a {name} file; run txl data prepare again")
        if info.get("in_place") and Path(rel).is_absolute():  # folders used where they are (pg19)
            sets[name] = read_corpus_files(rel, str(info.get("pattern") or "*"))
        else:
            sets[name] = read_corpus_files(path_inside(root, rel, str(root / "dataset.json")))
    return sets


def _load_separate(sets: dict[str, list[Path]], how: _Loading) -> CorpusSplits:
    """Separate train/valid(/test) file sets; char vocab from all of them, word and BPE from train (read
    chunk by chunk)."""
    tok = how.tok
    if tok is None:  # byte: nothing to build; char: from all the text; word, bpe: from the train text
        read = sets["train"] if how.kind in ("word", "bpe") else [f for fs in sets.values() for f in fs]
        tok = ByteTokenizer() if how.kind == "byte" else how.vocabulary(read)
    parts = {name: how.encode(fs, tok) for name, fs in sets.items()}
    parts.setdefault("test", np.zeros(0, dtype=token_dtype(tok.vocab_size)))
    source = ", ".join(_describe(f"{name}:", fs) for name, fs in sets.items())
    _check_sizes(parts, {"valid": True, "test": "test" in sets}, source)
    files = [str(f) for fs in sets.values() for f in fs]
    return CorpusSplits(tok, parts["train"], parts["valid"], parts["test"], source, files,
                        on_disk=_on_disk(parts, parts))


def _load_fractions(files: list[Path], label: str, fr: tuple[float, float, float], how: _Loading) -> CorpusSplits:
    """One corpus cut by fractions: by lines for word level, else by tokens."""
    source = f"{_describe(label, files)}, split {fr[0]:g}/{fr[1]:g}/{fr[2]:g}"
    tok = how.tok
    if how.kind in ("word", "bpe"):
        tok, parts = _line_fraction_splits(files, fr, how)
        roots = parts  # each part its own cache file
        for name, f in zip(SPLITS, fr):
            if f > 0 and len(parts[name]) == 0:
                raise TxlError(
                    f"the {name} split of {source} is empty: too few lines to split at line "
                    f"boundaries; {_split_fix(name, fr)}"
                )
    else:
        if tok is None:  # char: counted chunk by chunk
            tok = how.vocabulary(files) if how.kind == "char" else ByteTokenizer()
        tokens = how.encode(files, tok)
        parts = split_tokens(tokens, fr)
        roots = dict.fromkeys(parts, tokens)
    _check_sizes(parts, {"valid": fr[1] > 0, "test": fr[2] > 0}, source, fr)
    return CorpusSplits(tok, parts["train"], parts["valid"], parts["test"], source, [str(f) for f in files],
                        on_disk=_on_disk(roots, parts))


def load_run_corpus(data, tokenizer: Tokenizer | None = None, progress: bool = False) -> CorpusSplits:
    """Load the corpus a run's data section describes (with a given tokenizer, e.g. a checkpoint's).

    Args:
        data: a :class:`txl.config.DataConfig` (``run.data``).
        tokenizer: use this tokenizer instead of building one from the training split.
        progress: progress bars on stderr while a word or BPE corpus is counted and encoded.

    Returns:
        :class:`CorpusSplits` with train/valid/test token arrays.

    Raises:
        TxlError: see :func:`load_corpus`.
    """
    kind = data.tokenizer or ((dataset_info(data.path) or {}).get("tokenizer") if data.path else None) or "byte"
    return load_corpus(data.path, kind, train=data.train, valid=data.valid, test=data.test, split=data.split,
                       pattern=data.pattern, min_freq=data.min_freq, max_size=data.max_size, lower=data.lower,
                       normalize=data.normalize, cache_dir=data.cache_dir or default_cache_dir(),
                       tokenizer_obj=tokenizer, workers=data.workers, progress=progress, split_by=data.split_by)
