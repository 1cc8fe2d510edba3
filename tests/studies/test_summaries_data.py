"""The docstring summarisation set (txl_studies.summaries.data): exact pairs, a split by module with no leakage,
and the pre-training corpus without the held-out modules."""

import json

import pytest

from txl_studies.summaries.data import first_sentence, module_documents, name_words, prepare_docstrings
from txl.errors import TxlError


def _module(i: int) -> str:
    body = "".join(f"    x{k} = {k} * y  # line {k} of the body\n" for k in range(12))  # about 500 bytes
    return (f'"""Module {i}."""\n\n\n'
            f'def long_{i}(y):\n    """Compute the long thing number {i}. More words follow.\n\n    Details.\n    """\n'
            f"{body}    return y\n\n\n"
            f'def short_{i}(y):\n    """Return y plus {i}."""\n    return y + {i}\n\n\n'
            f"def bare_{i}(y):\n    return y\n")


def test_pairs_are_the_source_without_the_docstring_and_its_first_sentence(tmp_path):
    path = tmp_path / "m0.py"
    path.write_text(_module(0))
    docs = module_documents(path)
    assert [(d["name"], d["completion"]) for d in docs] == [
        ("long_0", "Compute the long thing number 0."), ("short_0", "Return y plus 0.")]
    assert docs[1]["prompt"] == "def short_0(y):\n    return y + 0\n"
    assert '"""' not in docs[0]["prompt"] and docs[0]["prompt"].startswith("def long_0(y):\n    x0 = 0 * y")
    long_bytes = len(docs[0]["prompt"].encode())
    assert [d["name"] for d in module_documents(path, min_bytes=long_bytes)] == ["long_0"]
    assert [d["name"] for d in module_documents(path, max_bytes=long_bytes - 1)] == ["short_0"]
    assert first_sentence("One.") is None and first_sentence("Two words!  Then more.") == "Two words!"
    assert name_words("Popen.send_signal") == "Popen send signal." and name_words("HTTPServer") == "HTTP server."


def test_the_split_is_by_module_and_the_pretraining_corpus_leaves_out_valid_and_test(tmp_path):
    files = []
    for i in range(10):
        files.append(tmp_path / "src" / f"mod{i}.py")
        files[-1].parent.mkdir(exist_ok=True)
        files[-1].write_text(_module(i))
    info = prepare_docstrings(tmp_path / "out", seed=3, fractions=(0.6, 0.2, 0.2), min_bytes=200, files=files,
                              short_train=True)
    out = tmp_path / "out"
    rows = {s: [json.loads(line) for line in (out / f"{s}.jsonl").read_text().splitlines()]
            for s in ("train", "valid", "test", "train-with-short")}
    modules = info["modules"]
    assert sorted(modules["train"] + modules["valid"] + modules["test"]) == sorted(f.name for f in files)
    assert (len(modules["train"]), len(modules["valid"]), len(modules["test"])) == (6, 2, 2)
    for split in ("train", "valid", "test"):  # only the long documents, each from a module of its split
        assert {r["module"] for r in rows[split]} == set(modules[split])
        assert all(r["name"].startswith("long_") for r in rows[split])
    assert {p.name for p in (out / "pretrain").iterdir()} == set(modules["train"])
    # train-with-short: the train pairs, then the short documents of the same modules, nothing else
    extra = rows["train-with-short"][len(rows["train"]):]
    assert rows["train-with-short"][:len(rows["train"])] == rows["train"]
    assert sorted(r["name"] for r in extra) == sorted(f"short_{m[3:-3]}" for m in modules["train"])
    assert all(len(r["prompt"].encode()) < 200 for r in extra)
    assert info["pairs"] == {"train": 6, "valid": 2, "test": 2, "train_with_short": 12}
    # the same seed and files give the same split whether or not the short pairs are written
    again = prepare_docstrings(tmp_path / "again", seed=3, fractions=(0.6, 0.2, 0.2), min_bytes=200, files=files)
    assert again["modules"] == modules and not (tmp_path / "again" / "train-with-short.jsonl").exists()


def test_the_command_writes_the_short_pairs_and_refuses_them_below_one_byte(tmp_path, capsys):
    from conftest import one_error_line, run_cli

    code, out, err = run_cli(capsys, "data", "docstrings", "--out", tmp_path / "bad", "--short-train",
                             "--min-bytes", "1")
    assert code == 2 and not (tmp_path / "bad").exists()
    assert one_error_line(err) == ("txl: error: --short-train adds the documents shorter than --min-bytes, and there "
                                   "are none below 1 byte: give --min-bytes 2 or more")
    code, out, err = run_cli(capsys, "data", "docstrings", "--out", tmp_path / "d", "--short-train",
                             "--split", "0.7,0.1,0.2")
    assert code == 0, err
    info = json.loads((tmp_path / "d" / "split.json").read_text())
    n = info["pairs"]
    assert f"train-with-short.jsonl: {n['train_with_short']} pairs (the {n['train']} train pairs" in out
    lines = (tmp_path / "d" / "train-with-short.jsonl").read_text().splitlines()
    assert len(lines) == n["train_with_short"] > n["train"]
    assert {json.loads(line)["module"] for line in lines} <= set(info["modules"]["train"])


def _library(tmp_path, n=5):
    """A folder of n modules (``_module(i)`` each): the library a data set is made of; returns its files."""
    src = tmp_path / "lib"
    src.mkdir()
    files = [src / f"mod{i}.py" for i in range(n)]
    for i, f in enumerate(files):
        f.write_text(_module(i))
    return src, files


def test_package_pairs_join_the_train_pairs_only(tmp_path):
    src, files = _library(tmp_path)
    pkg = src / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text(_module(7))
    (pkg / "deep.py").write_text(_module(8))
    copy = src / "pkg" / "copy.py"  # a package function identical to a module's: kept out of train
    copy.write_text(_module(0))
    near = src / "pkg" / "near.py"  # another function with a held-out summary (spacing and case aside)
    near.write_text('def other(y):\n    """compute  the long thing number 0."""\n    return y * 2\n')
    packages = [src / "pkg" / "__init__.py", pkg / "deep.py", copy, near]
    info = prepare_docstrings(tmp_path / "out", seed=1, fractions=(0.6, 0.2, 0.2), min_bytes=200, files=files,
                              short_train=True, package_train=True, packages=packages)
    out = tmp_path / "out"
    rows = {s: [json.loads(line) for line in (out / f"{s}.jsonl").read_text().splitlines()]
            for s in ("train", "valid", "test", "train-with-short", "train-with-packages")}
    assert rows["train-with-packages"][:len(rows["train-with-short"])] == rows["train-with-short"]
    extra = rows["train-with-packages"][len(rows["train-with-short"]):]
    held = {r["prompt"] for s in ("valid", "test") for r in rows[s]}
    assert not held & {r["prompt"] for r in extra}
    # every pair of every size of the package files, named by their path below the library folder
    want = {("pkg/__init__.py", "long_7"), ("pkg/__init__.py", "short_7"), ("pkg/sub/deep.py", "long_8"),
            ("pkg/sub/deep.py", "short_8"), ("pkg/copy.py", "short_0")}
    assert "mod0.py" not in info["modules"]["train"]  # (seed 1) so copy.py's long_0 and near.py's other are held out
    assert {(r["module"], r["name"]) for r in extra} == want
    assert info["pairs"]["train_with_packages"] == len(rows["train-with-short"]) + len(want)
    assert {p.name for p in (out / "pretrain").iterdir()} == set(info["modules"]["train"])  # no package file


def test_near_copies_of_held_out_answers_leave_the_pairs_and_the_pretraining_files(tmp_path):
    src, files = _library(tmp_path)
    first = prepare_docstrings(tmp_path / "first", seed=1, fractions=(0.6, 0.2, 0.2), min_bytes=200, files=files)
    held = first["modules"]["valid"] + first["modules"]["test"]
    assert "mod0.py" in held  # (seed 1) so long_0's document and summary are held-out answers
    copier, quoter, plain = (src / m for m in first["modules"]["train"])
    # a train module with a short function whose summary is long_0's (a cross-module near-copy: left out of the
    # pairs and, as its text holds the summary, of pretrain/) and another whose text quotes the summary only in a
    # comment (no pair: the text check finds it)
    copier.write_text(copier.read_text() + 'def again(y):\n    """Compute the long thing NUMBER 0."""\n    return y\n'
                      # a class whose document (its source less its own docstring) holds the summary in a method's
                      'class Holder:\n    """Hold the things."""\n    def run(self):\n'
                      '        """Compute the long thing number 0."""\n        return 1\n')
    quoter.write_text(quoter.read_text() + "# as mod0 says: compute the long   thing number 0.\n")
    pkg = src / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text(_module(7))
    (pkg / "deep.py").write_text(_module(8))
    (src / "pkg" / "copy.py").write_text(_module(0))  # holds long_0's document
    (src / "pkg" / "nested.py").write_text(  # long_0's summary in a nested function (no pair), and a pair of its own
        'def outer():\n    def inner(y):\n        """Compute the long thing number 0."""\n        return y\n'
        '    return inner\n\n\ndef mine(y):\n    """Do my own thing."""\n    return y\n')
    (src / "pkg" / "redoc.py").write_text(  # long_0's code under another docstring: its document is held out
        _module(0).replace("Compute the long thing number 0. More words follow.", "Work out item zero."))
    (src / "pkg" / "train_copy.py").write_text(_module(int(plain.stem[3:])))  # a copy of a *train* module: kept
    (src / "pkg" / "table.py").write_text("TABLE = (1, 2, 3)\n")  # no docstring pair: not text for summaries
    packages = sorted((src / "pkg").rglob("*.py"))
    info = prepare_docstrings(tmp_path / "out", seed=1, fractions=(0.6, 0.2, 0.2), min_bytes=200, files=files,
                              short_train=True, package_train=True, package_pretrain=True, packages=packages)
    out = tmp_path / "out"
    assert info["modules"] == first["modules"]
    pretrain = out / "pretrain"
    copied = sorted(p.relative_to(pretrain).as_posix() for p in pretrain.rglob("*.py"))
    assert copied == sorted([plain.name, "pkg/__init__.py", "pkg/sub/deep.py", "pkg/train_copy.py"])
    assert (pretrain / "pkg" / "sub" / "deep.py").read_text() == _module(8)
    assert info["pretrain_near_copies"] == [copier.name, quoter.name, "pkg/copy.py", "pkg/nested.py", "pkg/redoc.py"]
    assert info["pretrain_package_files"] == 3 and info["pretrain_files"] == 1
    short = [json.loads(line) for line in (out / "train-with-short.jsonl").read_text().splitlines()]
    assert not {"again", "Holder", "Holder.run"} & {r["name"] for r in short}
    # the short pairs again, Holder, Holder.run; the package pairs long_0 of copy.py and of redoc.py
    assert info["near_copy_pairs_left_out"] == {"train": 0, "short": 3, "packages": 2}
    packaged = [json.loads(line) for line in (out / "train-with-packages.jsonl").read_text().splitlines()]
    assert {(r["module"], r["name"]) for r in packaged[len(short):]} >= {("pkg/train_copy.py", f"long_{plain.stem[3:]}"),
                                                                        ("pkg/nested.py", "mine")}
    assert not {"long_0", "inner"} & {r["name"] for r in packaged}
    assert ("pkg/redoc.py", "short_0") in {(r["module"], r["name"]) for r in packaged}


def test_package_files_with_one_place_in_pretrain_are_refused_before_anything_is_written(tmp_path):
    _, files = _library(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mod1.py").write_text(_module(9))  # outside the library folder: it would be pretrain/mod1.py
    with pytest.raises(TxlError, match=r"would both be pretrain/mod1\.py"):
        prepare_docstrings(tmp_path / "out", seed=1, fractions=(0.6, 0.2, 0.2), min_bytes=200, files=files,
                           package_pretrain=True, packages=[elsewhere / "mod1.py"])
    assert not (tmp_path / "out").exists()


def test_installed_package_pairs_join_the_most_train_pairs_written(tmp_path, monkeypatch):
    _, files = _library(tmp_path)
    site = tmp_path / "site"  # an installed package: found on sys.path, never imported
    (site / "fakepkg" / "sub").mkdir(parents=True)
    (site / "fakepkg" / "tests").mkdir()
    (site / "fakepkg" / "__init__.py").write_text("raise RuntimeError('imported')\n" + _module(7))
    (site / "fakepkg" / "sub" / "deep.py").write_text(_module(8))
    (site / "fakepkg" / "tests" / "it.py").write_text(_module(9))  # test code: left out
    (site / "fakepkg" / "sub" / "test_deep.py").write_text(_module(9))
    (site / "fakepkg" / "copy.py").write_text(_module(0))  # mod0's functions: held out below (seed 1)
    monkeypatch.syspath_prepend(str(site))
    info = prepare_docstrings(tmp_path / "out", seed=1, fractions=(0.6, 0.2, 0.2), min_bytes=200, files=files,
                              short_train=True, installed_train=["fakepkg"])
    out = tmp_path / "out"
    rows = {s: [json.loads(line) for line in (out / f"{s}.jsonl").read_text().splitlines()]
            for s in ("train-with-short", "train-with-installed")}
    assert rows["train-with-installed"][:len(rows["train-with-short"])] == rows["train-with-short"]
    extra = rows["train-with-installed"][len(rows["train-with-short"]):]
    assert "mod0.py" not in info["modules"]["train"]  # so copy.py's long_0 is a held-out document
    assert {(r["module"], r["name"]) for r in extra} == {
        ("fakepkg/__init__.py", "long_7"), ("fakepkg/__init__.py", "short_7"), ("fakepkg/copy.py", "short_0"),
        ("fakepkg/sub/deep.py", "long_8"), ("fakepkg/sub/deep.py", "short_8")}
    assert info["installed_train"] == {"fakepkg": {"version": None, "files": 3}}
    assert info["pairs"]["train_with_installed"] == len(rows["train-with-short"]) + 5


def test_an_unknown_installed_package_is_one_line_and_writes_nothing(tmp_path, capsys):
    from conftest import one_error_line, run_cli

    code, out, err = run_cli(capsys, "data", "docstrings", "--out", tmp_path / "d", "--installed-train",
                             "numpy,no_such_package_here")
    assert code == 2 and not (tmp_path / "d").exists()
    assert one_error_line(err) == ("txl: error: --installed-train: 'no_such_package_here' is not an installed package "
                                   "(a folder of Python modules) in this Python; give import names such as torch or "
                                   "numpy")


def test_installed_files_walk_every_folder_of_a_namespace_package_and_refuse_an_empty_one(tmp_path, monkeypatch):
    from txl_studies.summaries.data import installed_files

    for site, module in (("a", "one.py"), ("b", "two.py")):  # one namespace package (no __init__) in two folders
        (tmp_path / site / "nspkg").mkdir(parents=True)
        (tmp_path / site / "nspkg" / module).write_text(_module(1))
        monkeypatch.syspath_prepend(str(tmp_path / site))
    (tmp_path / "a" / "nspkg" / "odd.py").mkdir()  # a folder named like a module: not a file
    (tmp_path / "c" / "emptypkg").mkdir(parents=True)
    (tmp_path / "c" / "emptypkg" / "__init__.pyc").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path / "c"))
    version, files = installed_files(["nspkg"])["nspkg"]
    assert version is None and sorted(module for _, module in files) == ["nspkg/one.py", "nspkg/two.py"]
    with pytest.raises(TxlError, match="'emptypkg' has no readable Python files"):
        installed_files(["emptypkg"])
