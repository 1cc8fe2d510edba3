"""A summarisation data set every machine has: standard-library functions and classes and their docstrings.

``txl data docstrings --out DIR`` (:func:`prepare_docstrings`) reads the modules of txl's built-in
default corpus (:func:`txl.data.files.default_corpus_files`: this Python's top-level
standard-library ``*.py`` files). Every function, method and class with a docstring becomes one
pair: the *document* is its source with the docstring removed (decorators included, dedented),
the *summary* is the first sentence of the docstring (:func:`first_sentence`). Only documents of
``min_bytes`` to ``max_bytes`` UTF-8 bytes are kept (long enough to need the memory: several
segments of the default ``tgt_len`` of 64). The modules, not the pairs, are split into
train/valid/test by a seeded shuffle, so that no module is in two splits.

Written into ``DIR``: ``train.jsonl``, ``valid.jsonl``, ``test.jsonl`` (one object per line:
``prompt`` the document, ``completion`` the summary, ``name`` the qualified name, ``module``,
``kind`` "function" or "class"), ``pretrain/``, a copy of the default corpus *without* the valid
and test modules (pre-train the language model on it, or it has seen the answers), and
``split.json`` (the modules of each split and the counts). With ``short_train``, also
``train-with-short.jsonl``: the train pairs followed by the pairs of the *same train modules* whose
documents are shorter than ``min_bytes`` (several times more examples of a name turning into a
summary, for fine-tuning; the split and the other files are unchanged). With ``package_train``, also
``train-with-packages.jsonl``: those pairs (``train-with-short``'s, or the train pairs) followed by
every pair, of any size up to ``max_bytes``, of the standard library's *packages*
(:func:`txl_studies.classification.data.package_files`: the files below a top-level package folder, none of them in
the default corpus, so none in a valid or test module). More fine-tuning pairs at no cost to the
split: the valid and test pairs stay those of the top-level modules. With ``package_pretrain``,
``pretrain/`` also holds the package files (``pretrain/email/utils.py``) that have at least one
docstring pair (codec tables and generated data have none): more text in the same library's style
(with them the pre-training corpus has 2.4 times the tokens on CPython 3.11). With
``installed_train`` (names of installed packages, e.g. ``("torch", "numpy")``: the source of txl's
own dependencies, so on every machine txl runs on), also ``train-with-installed.jsonl``: the most of
those pairs written (``train-with-packages``', else ``train-with-short``'s, else the train pairs)
followed by every pair of those packages' ``*.py`` files (:func:`installed_files`: no test code; any
size up to ``max_bytes``); ``split.json`` records each package's version. (The package benchmark of
``txl classify``, :mod:`txl_studies.classification.data`, reads the same files as *documents to classify*; a
language model only *fine-tuned* for summaries on them is not the one that benchmark starts from.)

The library holds near-copies across modules (``ntpath`` and ``posixpath``, ``distutils.archive_util``
of ``shutil``, ``lib2to3``'s tokenizer): every fine-tuning file leaves out a pair whose summary is a
valid or test pair's, or whose document holds a valid or test pair's document or summary (spacing
aside; summaries case aside too), and ``pretrain/`` leaves out a whole file whose text holds one or
that has such a pair (``split.json``: ``near_copy_pairs_left_out`` by source, ``pretrain_near_copies``),
so neither the language model nor the fine-tuning reads a held-out answer.
"""

from __future__ import annotations

import ast
import inspect
import json
import random
import re
import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from txl.config import check_split
from txl.data.files import default_corpus_files
from txl.errors import TxlError
from txl.fileio import atomic_write, claim_folder, write_json

_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def first_sentence(docstring: str) -> str | None:
    """The first sentence of a docstring: its first paragraph (up to a blank line) on one line, cut
    after the first ``.``, ``!`` or ``?`` followed by a space or the end; None when that is shorter
    than two words or longer than 300 characters (not a summary line)."""
    paragraph = inspect.cleandoc(docstring).split("\n\n", 1)[0]
    text = " ".join(paragraph.split())
    end = _SENTENCE_END.search(text)
    if end is not None:
        text = text[:end.end()]
    if len(text.split()) < 2 or len(text) > 300:
        return None
    return text


def name_words(name: str) -> str:
    """The words of an identifier as a sentence (the name baseline): ``Popen.send_signal`` ->
    ``"Popen send signal."``, ``HTTPServer`` -> ``"HTTP server."`` (underscores and case changes
    split words; words after the first are lower-cased unless all capitals)."""
    words = []
    for part in re.split(r"[._]+", name):
        words += re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", part)
    words = [w if i == 0 or w.isupper() else w.lower() for i, w in enumerate(words)]
    return (" ".join(words) + ".") if words else name


def _documents(tree: ast.Module, lines: list[str], module: str) -> list[dict]:
    """Pairs for every function, method and class of a parsed module that has a docstring."""
    found = []

    def visit(body, prefix: str) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            name = f"{prefix}{node.name}"
            doc = ast.get_docstring(node, clean=False)
            summary = first_sentence(doc) if doc else None
            first = node.body[0]
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            # the docstring must sit on its own lines, with code after it
            if summary and len(node.body) > 1 and first.lineno > node.lineno and first.end_lineno < node.end_lineno:
                kept = lines[start - 1:first.lineno - 1] + lines[first.end_lineno:node.end_lineno]
                found.append({"prompt": textwrap.dedent("".join(kept)), "completion": summary, "name": name,
                              "module": module, "kind": "class" if isinstance(node, ast.ClassDef) else "function"})
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{name}.")

    visit(tree.body, "")
    return found


def module_documents(path: str | Path, min_bytes: int = 0, max_bytes: int | None = None,
                     module: str | None = None) -> list[dict]:
    """The docstring pairs of one Python file (see the module docstring), in source order, whose
    document has ``min_bytes`` to ``max_bytes`` UTF-8 bytes; their ``module`` is ``module`` (default the
    file's name). A file that does not parse gives none."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    docs = _documents(tree, text.splitlines(keepends=True), module or path.name)
    return [d for d in docs if min_bytes <= len(d["prompt"].encode("utf-8")) <= (max_bytes or float("inf"))]


def installed_files(names: Sequence[str]) -> dict[str, tuple[str | None, list[tuple[Path, str]]]]:
    """``{name: (version, [(file, "name/path/below.py"), ...])}``: the ``*.py`` files of each installed
    package named (an import name: ``torch``, ``numpy``) in its folders (a namespace package may have
    several), found with :func:`importlib.util.find_spec` (nothing is imported) and sorted, leaving out
    test code (every file or folder whose name starts with ``test``: ``tests/``, ``testing/``,
    ``test_*.py``); the version is its distribution's (None when no distribution has that name).

    Raises:
        TxlError: a name that is not an installed package (a folder of modules), or one with no readable
            ``*.py`` file (zipped, unreadable), naming it.
    """
    import importlib.metadata
    import importlib.util

    found = {}
    for name in names:
        try:
            spec = importlib.util.find_spec(name) if name.isidentifier() else None
        except (ImportError, ValueError):
            spec = None
        folders = [Path(f) for f in (spec.submodule_search_locations or [])] if spec is not None else []
        if not folders:
            raise TxlError(f"--installed-train: {name!r} is not an installed package (a folder of Python modules) "
                           "in this Python; give import names such as torch or numpy")
        # every folder of the package (a namespace package may have several); no test code
        files = sorted((f, f"{name}/{f.relative_to(root).as_posix()}") for root in folders for f in root.rglob("*.py")
                       if f.is_file() and not any(part.startswith("test") for part in f.relative_to(root).parts))
        if not files:
            raise TxlError(f"--installed-train: the installed package {name!r} has no readable Python files "
                           f"in {', '.join(str(f) for f in folders)} (zipped, or not readable by this user)")
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        found[name] = (version, files)
    return found


def _summary_key(summary: str) -> str:
    return " ".join(summary.split()).lower()


@dataclass
class _NearCopies:
    """The held-out (valid and test) pairs' documents, whitespace-flattened (``documents``), and summaries
    (:func:`_summary_key`), and how many pairs each fine-tuning source left out for holding one
    (``left_out``: source name -> count, in the order the sources were read)."""

    documents: set[str]
    summaries: set[str]
    left_out: dict[str, int] = field(default_factory=dict)

    def holds(self, flat: str) -> bool:
        """Whether a whitespace-flattened text holds a held-out document or summary (case aside)."""
        lower = flat.lower()
        return any(k in lower for k in self.summaries) or any(doc in flat for doc in self.documents)

    def near_copy(self, d: dict) -> bool:
        """Whether pair ``d`` has a held-out summary, or holds one or a held-out document."""
        return _summary_key(d["completion"]) in self.summaries or self.holds(" ".join(d["prompt"].split()))

    def holds_answer(self, f: Path, docs: list[dict]) -> bool:
        """Whether file ``f``'s text holds a held-out document or summary, or one of its pairs ``docs`` (of
        every size) is a near-copy."""
        text = f.read_text(encoding="utf-8", errors="replace")
        return self.holds(" ".join(text.split())) or any(self.near_copy(d) for d in docs)

    def without(self, name: str, found: list[dict]) -> list[dict]:
        """The pairs ``found`` that are no near-copy; how many were not is counted in ``left_out[name]``."""
        kept = [d for d in found if not self.near_copy(d)]
        self.left_out[name] = len(found) - len(kept)
        return kept


def _held_out(pairs: dict[str, list[dict]]) -> _NearCopies:
    """The :class:`_NearCopies` of the valid and test pairs of ``pairs`` (split name -> pairs)."""
    return _NearCopies({" ".join(d["prompt"].split()) for name in ("valid", "test") for d in pairs[name]},
                       {_summary_key(d["completion"]) for name in ("valid", "test") for d in pairs[name]})


def _named(f: Path, root: Path) -> str:
    """The name of file ``f`` in ``pretrain/`` and as a pair's ``module``: its path below ``root``
    (``email/utils.py``, not ``utils.py``), or its name for a file outside it."""
    return f.relative_to(root).as_posix() if f.is_relative_to(root) else f.name


def _check_sizes(min_bytes: int, max_bytes: int, short_train: bool) -> None:
    """Refuse document sizes out of order, or ``short_train`` with no size below ``min_bytes`` (TxlError)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise TxlError(f"need 1 <= min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    if short_train and min_bytes < 2:
        raise TxlError("--short-train adds the documents shorter than --min-bytes, and there are none below 1 byte: "
                       "give --min-bytes 2 or more")


def _check_pretrain_places(files: list[Path], packages: list[Path], root: Path) -> None:
    """Refuse (TxlError) two of the modules ``files`` and package files ``packages`` that would be the
    same file of ``pretrain/`` (see :func:`_named`)."""
    taken = {f.name: f for f in files}
    for f in sorted(packages):
        other = taken.setdefault(_named(f, root), f)
        if other != f:
            raise TxlError(f"package files {other} and {f} would both be pretrain/{_named(f, root)}: give package "
                           f"files below the library folder {root}")


def _split_modules(by_module: dict[str, list[dict]], seed: int,
                   fractions: tuple[float, float, float]) -> dict[str, list[str]]:
    """``{"train": [module, ...], "valid": ..., "test": ...}``: the modules of ``by_module`` (module ->
    its pairs) that have a pair, shuffled with ``seed`` and cut by ``fractions``, each split sorted.

    Raises:
        TxlError: no module has a pair, or a split would have no module.
    """
    modules = sorted(m for m, docs in by_module.items() if docs)
    if not modules:
        raise TxlError("no function or class with a docstring has a document of the requested size")
    random.Random(seed).shuffle(modules)
    n_train = max(1, round(fractions[0] * len(modules)))
    n_valid = round(fractions[1] * len(modules))
    split = {"train": sorted(modules[:n_train]), "valid": sorted(modules[n_train:n_train + n_valid]),
             "test": sorted(modules[n_train + n_valid:])}
    empty = [name for name, mods in split.items() if not mods]
    if empty:  # nothing written: an empty file would only fail the command that reads it
        raise TxlError(f"the split fractions {','.join(f'{f:g}' for f in fractions)} of {len(modules)} modules "
                       f"leave {' and '.join(s + '.jsonl' for s in empty)} without pairs: give every split a "
                       "larger share")
    return split


def _beyond(near: _NearCopies, name: str, named_files, max_bytes: int) -> list[dict]:
    """The pairs of ``named_files`` ((file, module name)s outside the split) of 1 to ``max_bytes`` bytes
    that are no near-copy, those left out counted under ``name``."""
    return near.without(name, [d for f, module in named_files for d in module_documents(f, 1, max_bytes, module)])


def _add_fine_tuning(pairs: dict[str, list[dict]], near: _NearCopies, split: dict[str, list[str]], *,
                     files: list[Path], min_bytes: int, max_bytes: int, short_train: bool, package_train: bool,
                     packages: list[Path] | None, root: Path, installed: dict) -> None:
    """Leave the near-copies out of ``pairs["train"]`` and add to ``pairs`` the fine-tuning files asked for
    (``train-with-short``, ``train-with-packages`` of ``packages`` named below ``root``,
    ``train-with-installed`` of ``installed``, see :func:`installed_files`; see the module docstring), each
    without near-copies."""
    pairs["train"] = near.without("train", pairs["train"])
    if short_train:
        path_of = {f.name: f for f in files}
        pairs["train-with-short"] = pairs["train"] + near.without(
            "short", [d for m in split["train"] for d in module_documents(path_of[m], 1, min_bytes - 1)])
    if package_train:
        pairs["train-with-packages"] = pairs["train-with-short" if short_train else "train"] + _beyond(
            near, "packages", ((f, _named(f, root)) for f in sorted(packages)), max_bytes)
    if installed:
        base = next(pairs[k] for k in ("train-with-packages", "train-with-short", "train") if k in pairs)
        pairs["train-with-installed"] = base + _beyond(
            near, "installed", (pair for _, group in installed.values() for pair in group), max_bytes)


def _write_pairs(out: Path, pairs: dict[str, list[dict]]) -> dict[str, int]:
    """Write ``NAME.jsonl`` into ``out`` for each ``NAME`` of ``pairs``; returns the counts by
    ``NAME`` with ``_`` for ``-`` (``train_with_short``)."""
    counts = {}
    for name, rows in pairs.items():
        counts[name.replace("-", "_")] = len(rows)
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        atomic_write(out / f"{name}.jsonl", lambda tmp, data=payload: Path(tmp).write_bytes(data))
    return counts


def _write_pretrain(out: Path, files: list[Path], held_out: set[str], near: _NearCopies) -> tuple[int, list[str]]:
    """Create ``out/pretrain/`` and copy into it the modules ``files`` neither ``held_out`` (names) nor
    holding a held-out answer; returns the number copied and the names of those left out as near-copies."""
    (out / "pretrain").mkdir()
    outside = [f for f in files if f.name not in held_out]
    near_names = [f.name for f in outside if near.holds_answer(f, module_documents(f, 1, None))]
    kept = [f for f in outside if f.name not in near_names]
    for f in kept:
        shutil.copyfile(f, out / "pretrain" / f.name)
    return len(kept), near_names


def _write_package_pretrain(out: Path, packages: list[Path], root: Path, near: _NearCopies,
                            near_names: list[str]) -> int:
    """Copy into ``out/pretrain/`` the package files ``packages`` that have a docstring pair, under
    :func:`_named`; those holding a held-out answer are appended to ``near_names`` instead. Returns the
    number copied."""
    copied = []
    for f in sorted(packages):
        docs = module_documents(f, 1, None)
        if not docs:
            continue  # no docstring pair (codec tables, generated data): not text for summaries
        if near.holds_answer(f, docs):
            near_names.append(_named(f, root))  # after the top-level modules
            continue
        target = out / "pretrain" / _named(f, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        copied.append(_named(f, root))
    return len(copied)


def prepare_docstrings(out_dir: str | Path, *, seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                       min_bytes: int = 512, max_bytes: int = 4096, files: list[Path] | None = None,
                       short_train: bool = False, package_train: bool = False, package_pretrain: bool = False,
                       packages: list[Path] | None = None, installed_train: Sequence[str] = ()) -> dict:
    """Write the docstring data set into ``out_dir`` (see the module docstring); returns ``split.json``'s content.

    Args:
        seed: seeds the shuffle of the modules.
        fractions: train/valid/test fractions of the modules (those with at least one pair).
        min_bytes, max_bytes: the document sizes kept.
        files: the modules (default: :func:`~txl.data.files.default_corpus_files`).
        short_train: also write ``train-with-short.jsonl`` (see the module docstring).
        package_train: also write ``train-with-packages.jsonl`` (see the module docstring).
        package_pretrain: also copy the package files with a docstring pair into ``pretrain/``, near-copies
            left out (see the module docstring).
        packages: the package files for ``package_train`` and ``package_pretrain`` (default: every file of
            :func:`txl_studies.classification.data.package_files`; ignored without either). Their pairs'
            ``module`` is the path below the folder of ``files`` (``email/utils.py``), or the file's
            name for a file outside it.
        installed_train: installed packages whose pairs make ``train-with-installed.jsonl`` (see the
            module docstring); their pairs' ``module`` is the path from the package's folder on
            (``torch/nn/functional.py``).

    Raises:
        TxlError: bad fractions or sizes, an ``out_dir`` that is not empty or is in use, no pairs, a split
            without modules (nothing written), an ``installed_train`` name that is not an installed
            package, with ``package_pretrain`` a package file outside the folder of ``files`` named as a
            module or another package file (nothing written).
    """
    check_split(fractions, "the split fractions", train_needed=True)
    _check_sizes(min_bytes, max_bytes, short_train)
    files = sorted(files or default_corpus_files())
    installed = installed_files(installed_train)  # (an unknown name is refused before the folder is claimed)
    root = files[0].parent
    if (package_train or package_pretrain) and packages is None:
        from txl_studies.classification.data import package_files

        packages = [f for group in package_files().values() for f in group]
    if package_pretrain:  # two files for one place in pretrain/: refused before the folder is claimed
        _check_pretrain_places(files, packages, root)
    with claim_folder(out_dir, empty=True, inputs=[files[0].parent]) as claim:
        by_module = {f.name: module_documents(f, min_bytes, max_bytes) for f in files}
        split = _split_modules(by_module, seed, fractions)
        out = Path(claim.path)
        pairs = {name: [d for m in mods for d in by_module[m]] for name, mods in split.items()}
        # the standard library holds near-copies (ntpath and posixpath, distutils' archive_util of shutil, lib2to3's
        # tokenize, ...): a pair with a held-out document (spacing aside) or a held-out summary (case and spacing
        # aside) in its document or summary is left out of every fine-tuning file; a file whose text holds one, or
        # with such a pair, is left out of pretrain/
        near = _held_out(pairs)
        _add_fine_tuning(pairs, near, split, files=files, min_bytes=min_bytes, max_bytes=max_bytes,
                         short_train=short_train, package_train=package_train, packages=packages, root=root,
                         installed=installed)
        counts = _write_pairs(out, pairs)
        held_out = set(split["valid"]) | set(split["test"])
        n_pretrain, near_names = _write_pretrain(out, files, held_out, near)
        info = {"source": str(files[0].parent), "seed": seed, "fractions": list(fractions), "min_bytes": min_bytes,
                "max_bytes": max_bytes, "pairs": counts, "near_copy_pairs_left_out": near.left_out, "modules": split,
                "pretrain_files": n_pretrain, "pretrain_excludes": sorted(held_out)}
        if package_pretrain:
            info["pretrain_package_files"] = _write_package_pretrain(out, packages, root, near, near_names)
        info["pretrain_near_copies"] = near_names
        if installed:
            info["installed_train"] = {name: {"version": version, "files": len(group)}
                                       for name, (version, group) in installed.items()}
        write_json(out / "split.json", info)
    return info
