"""A document-classification set every machine has: which standard-library package is a piece of source from?

``txl data packages --out DIR`` (:func:`prepare_packages`) reads this Python's standard-library
packages (``sysconfig.get_paths()["stdlib"]/<package>/**/*.py``; a package is a top-level folder with an
``__init__.py``; ``site-packages`` and every file below a test folder, :data:`TEST_FOLDERS`, are left out).
The label of a file is its top-level package. The classes are the packages with at least
``min_class_bytes`` bytes of such source and at least one file per split (computed on the machine,
never a fixed list; on CPython 3.11 the default 150,000 bytes gives 14 classes: asyncio, distutils,
email, encodings, http, idlelib, importlib, lib2to3, logging, multiprocessing, tkinter, unittest,
urllib, xml; ``pydoc_data`` has the bytes but a single file with source, so it cannot be split by file).

Each file loses its module docstring and the comment block around it (:func:`strip_module_header`),
so the sentence naming the package is not in the text (the package's name can still occur in the code,
in imports and qualified names, as in any real file). The rest is cut at line starts into documents of
at most ``doc_bytes`` UTF-8 bytes (:func:`chunk_source`); pieces shorter than ``min_bytes`` are dropped.

The split is by *file*: all documents of a file are in one split, so no split sees another part of a
file it is tested on. Per class, a seeded shuffle of the files assigns each file to the split furthest
below its share of the class's documents (each split with a share > 0 gets at least one file).
Each class is then capped at ``max_per_class`` documents, ``round(max_per_class * fraction)`` per
split, by a seeded sample, so that no class dominates (the encodings tables alone are 1.4 MB).

Written into ``DIR``: ``train.jsonl``, ``valid.jsonl`` and ``test.jsonl`` (one object per line:
``text``, ``label`` the package, ``file`` the path relative to the stdlib folder), and ``split.json``
(the classes, the documents per split and class, before and after the cap, the files of each split and
the settings). ``txl classify train LM --data DIR/train.jsonl --valid DIR/test.jsonl`` reads them.

txl's built-in default corpus (:func:`txl.data.files.default_corpus_files`) holds only the *top-level*
``*.py`` modules of the standard library, none of these package files: a language model pre-trained
on it (plain ``txl train``) has never seen the documents it is asked to classify.
"""

from __future__ import annotations

import io
import json
import random
import sys
import sysconfig
import tokenize
from pathlib import Path

from txl.config import check_split
from txl.errors import TxlError
from txl.fileio import atomic_write, claim_folder, write_json

TEST_FOLDERS = ("test", "tests", "idle_test")
"""Folder names whose files are left out (the stdlib ``test`` package, ``lib2to3/tests``, ``idlelib/idle_test``)."""

SPLITS = ("train", "valid", "test")


def strip_module_header(text: str) -> str:
    """``text`` without its module docstring and the comment block around it.

    The leading lines that are blank or comments (``#!``, coding and licence lines) go; when the first
    statement is a lone string literal (the module docstring, possibly spread over several lines), it
    goes too, with the blank and comment lines after it. Found with :mod:`tokenize` on the first tokens
    only (a full parse of the 6 MB of package source takes seconds). Text that does not tokenize keeps
    everything after its leading comment block.

    Returns:
        The remaining text from the start of its first line (line endings kept).
    """
    lines = text.splitlines(keepends=True)
    start = 0
    try:
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        tok = next(t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING))
        end_row = None
        while tok.type == tokenize.STRING and "f" not in tok.string.split(tok.string[-1], 1)[0].lower():
            end_row = tok.end[0]
            tok = next(tokens)
            while tok.type == tokenize.COMMENT:  # """docstring"""  # a comment
                tok = next(tokens)
        if end_row is not None and tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            start = end_row  # the docstring ends on 1-based row end_row: keep the lines after it
    except (tokenize.TokenError, SyntaxError, StopIteration):
        start = 0
    while start < len(lines) and (not lines[start].strip() or lines[start].lstrip().startswith("#")):
        start += 1
    return "".join(lines[start:])


def chunk_source(text: str, doc_bytes: int, min_bytes: int) -> list[str]:
    """Cut ``text`` at line starts into pieces of at most ``doc_bytes`` UTF-8 bytes, in order.

    Lines are added to a piece while it stays within ``doc_bytes``; a single line longer than that makes
    a piece of its own. Pieces under ``min_bytes`` bytes (typically the tail of a file) are dropped.
    """
    pieces, current, size = [], [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode("utf-8"))
        if current and size + n > doc_bytes:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += n
    if current:
        pieces.append("".join(current))
    return [p for p in pieces if len(p.encode("utf-8")) >= min_bytes]


def package_files(stdlib: str | Path | None = None) -> dict[str, list[Path]]:
    """The ``*.py`` files of every top-level standard-library package, by package name, sorted.

    A package is a folder of ``stdlib`` with an ``__init__.py`` (``site-packages`` and ``__pycache__``
    excluded); files below a folder named in :data:`TEST_FOLDERS` are left out.
    """
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    found = {}
    for folder in sorted(root.iterdir()):
        if folder.name in ("site-packages", "__pycache__") or folder.name in TEST_FOLDERS:
            continue
        if not folder.is_dir() or not (folder / "__init__.py").is_file():
            continue
        files = sorted(f for f in folder.rglob("*.py") if f.is_file()
                       and not any(part in TEST_FOLDERS for part in f.relative_to(root).parts[:-1]))
        if files:
            found[folder.name] = files
    return found


def _assign_files(sizes: dict[str, int], fractions: tuple[float, ...], rng: random.Random,
                  tries: int = 200) -> dict[str, str]:
    """Files of one class (name -> documents) to splits, as close to the fractions as whole files allow.

    One candidate: a seeded shuffle of the files, then each file goes to the split furthest below its
    share (when only as many files are left as splits without one, they fill those). Of ``tries``
    candidates the one with the smallest sum over splits of ``|documents - share| / share`` is kept (the
    first on a tie), so a class of a few large files still gets near its valid and test shares.
    """
    total = sum(sizes.values())
    wanted = [name for name, f in zip(SPLITS, fractions) if f > 0]
    target = {name: f * total for name, f in zip(SPLITS, fractions)}
    best, best_cost = {}, float("inf")
    for _ in range(tries):
        order = sorted(sizes)
        rng.shuffle(order)
        have = {name: 0 for name in wanted}
        files = {name: 0 for name in wanted}
        out = {}
        for i, f in enumerate(order):
            empty = [s for s in wanted if files[s] == 0]
            choices = empty if len(order) - i <= len(empty) else wanted
            split = max(choices, key=lambda s: (target[s] - have[s], -wanted.index(s)))
            out[f] = split
            have[split] += sizes[f]
            files[split] += 1
        cost = sum(abs(have[s] - target[s]) / target[s] for s in wanted)
        if cost < best_cost:
            best, best_cost = out, cost
    return best


def prepare_packages(out_dir: str | Path, *, seed: int = 0, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
                     doc_bytes: int = 2048, min_bytes: int = 1024, max_per_class: int | None = 250,
                     min_class_bytes: int = 150_000, stdlib: str | Path | None = None) -> dict:
    """Write the package-classification set into ``out_dir`` (see the module docstring).

    Args:
        seed: seeds the shuffle of each class's files and the sample of the cap.
        fractions: train/valid/test shares of each class's documents (whole files are assigned).
        doc_bytes: largest document, in UTF-8 bytes (cut at line starts).
        min_bytes: smallest document kept.
        max_per_class: most documents of one class over all splits (None or 0: no cap).
        min_class_bytes: a package is a class when its source files (below no test folder) hold at
            least this many bytes, before the docstrings are removed.
        stdlib: the standard-library folder (default: this Python's).

    Returns:
        The content of ``split.json``: ``classes``, ``documents`` (split -> class -> count),
        ``totals`` (split -> count), ``before_cap`` (as ``documents``, without the cap), ``files``
        (split -> class -> relative paths), ``class_bytes``, ``left_out`` (package -> reason) and the
        settings.

    Raises:
        TxlError: bad fractions or sizes, an ``out_dir`` that is not empty or is in use, fewer than two
            classes, a split without documents (a zero share, or a cap that leaves it none; nothing is
            written).
    """
    fractions = check_split(fractions, "the split fractions", train_needed=True)
    if min_bytes < 1 or doc_bytes < min_bytes:
        raise TxlError(f"need 1 <= min_bytes <= doc_bytes, got {min_bytes} and {doc_bytes}")
    if (max_per_class is not None and max_per_class < 0) or min_class_bytes < 1:
        raise TxlError(f"need max_per_class >= 0 and min_class_bytes >= 1, got {max_per_class} and {min_class_bytes}")
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    packages = package_files(root)
    with claim_folder(out_dir, empty=True, inputs=[root]) as claim:
        class_bytes = {p: sum(f.stat().st_size for f in files) for p, files in packages.items()}
        n_splits = sum(f > 0 for f in fractions)
        chunks: dict[str, dict[str, list[str]]] = {}
        left_out = {}
        for package in sorted(p for p, n in class_bytes.items() if n >= min_class_bytes):
            by_file = {}
            for f in packages[package]:
                text = f.read_bytes().decode("utf-8", errors="replace")
                pieces = chunk_source(strip_module_header(text), doc_bytes, min_bytes)
                if pieces:
                    by_file[f.relative_to(root).as_posix()] = pieces
            if len(by_file) < n_splits:
                left_out[package] = f"{len(by_file)} file(s) with documents; a class needs one per split ({n_splits})"
            else:
                chunks[package] = by_file
        for package in sorted(set(class_bytes) - set(chunks) - set(left_out)):
            left_out[package] = f"{class_bytes[package]} bytes of source < {min_class_bytes}"
        classes = sorted(chunks)
        if len(classes) < 2:
            raise TxlError(f"only {len(classes)} package(s) of {root} have {min_class_bytes} bytes of source in "
                           "files for every split; lower min_class_bytes")
        rows = {s: [] for s in SPLITS}
        documents = {s: {} for s in SPLITS}
        before_cap = {s: {} for s in SPLITS}
        files = {s: {} for s in SPLITS}
        for package in classes:
            rng = random.Random(f"{seed}/{package}")
            where = _assign_files({f: len(p) for f, p in chunks[package].items()}, fractions, rng)
            for split, fraction in zip(SPLITS, fractions):
                mine = sorted(f for f, s in where.items() if s == split)
                docs = [{"text": t, "label": package, "file": f} for f in mine for t in chunks[package][f]]
                before_cap[split][package] = len(docs)
                if max_per_class:
                    cap = round(max_per_class * fraction)
                    if len(docs) > cap:
                        docs = [docs[i] for i in sorted(rng.sample(range(len(docs)), cap))]
                files[split][package] = mine  # every file of the split, also one whose documents the cap left out
                documents[split][package] = len(docs)
                rows[split] += docs
        empty = [split for split in SPLITS if not rows[split]]
        if empty:  # nothing written: an empty file would only fail the command that reads it
            raise TxlError(f"the split fractions {','.join(f'{f:g}' for f in fractions)} leave "
                           f"{' and '.join(s + '.jsonl' for s in empty)} without documents: give every split a "
                           "share > 0 (and a max_per_class, --max-per-class, that leaves it some)")
        out = Path(claim.path)
        for split in SPLITS:
            payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[split]).encode("utf-8")
            atomic_write(out / f"{split}.jsonl", lambda tmp, data=payload: Path(tmp).write_bytes(data))
        info = {"source": str(root), "python": sys.version.split()[0], "seed": seed, "fractions": list(fractions),
                "doc_bytes": doc_bytes, "min_bytes": min_bytes, "max_per_class": max_per_class or None,
                "min_class_bytes": min_class_bytes, "test_folders": list(TEST_FOLDERS), "classes": classes,
                "totals": {s: len(rows[s]) for s in SPLITS}, "documents": documents, "before_cap": before_cap,
                "class_bytes": {p: class_bytes[p] for p in classes}, "left_out": left_out, "files": files}
        write_json(out / "split.json", info)
    return info
