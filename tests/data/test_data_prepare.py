"""Tests for `txl data prepare`: fake archives of every benchmark, safe extraction, downloads and the CLI.

Everything is offline: archives are built in tmp_path and downloads come from a local
http.server on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from txl.cli import main
from txl.data.corpus import load_corpus
from txl.data.files import dataset_info
from txl_recipes.datasets.prepare import DATASETS, prepare_dataset, standard_split
from txl_recipes.datasets.download import download, extract
from txl.data.iterators import IGNORE_INDEX, LMShuffledIterator
from txl.errors import TxlError

WT_TRAIN = " = Lobster = \n \n The lobster 's claw is well @-@ known . \n"
WT_VALID = " = = Biology = = \n It weighs 2 @.@ 5 kg . \n"
WT_TEST = " The claw is blue . \n"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _zip(path: Path, members: dict[str, bytes | str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data)
    return path


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes | str]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
                continue
            name, data = m
            data = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _prepare(name: str, source: Path | str, out: Path, **kw) -> dict:
    logs: list[str] = []
    info = prepare_dataset(name, source, out, progress=False, log=logs.append, **kw)
    info["_logs"] = logs
    return info


# ---------------------------------------------------------------- splits and layouts

def test_standard_split_real_size_is_exact_90_5_5() -> None:
    assert standard_split(100_000_000) == (90_000_000, 95_000_000)
    assert standard_split(1000) == (900, 950)
    assert standard_split(1003) == (902, 952)
    with pytest.raises(TxlError, match="at least 20"):
        standard_split(19)


def test_enwik8_bytes_split(tmp_path: Path) -> None:
    data = bytes(np.random.default_rng(0).integers(0, 256, size=1001, dtype=np.uint8))
    z = _zip(tmp_path / "enwik8.zip", {"enwik8": data})
    out = tmp_path / "out"
    info = _prepare("enwik8", z, out, sha256=_sha(z))
    b1, b2 = 1001 * 9 // 10, 1001 * 19 // 20
    assert (out / "train.txt").read_bytes() == data[:b1]
    assert (out / "valid.txt").read_bytes() == data[b1:b2]
    assert (out / "test.txt").read_bytes() == data[b2:]
    assert info["sizes"] == {"train": 900, "valid": 50, "test": 51}
    on_disk = json.loads((out / "dataset.json").read_text())
    assert on_disk["tokenizer"] == "byte" and on_disk["sha256"] == _sha(z) and on_disk["sha256_verified"]
    assert on_disk["split"] == {"unit": "bytes", "train": [0, 900], "valid": [900, 950], "test": [950, 1001]}
    assert not (out / ".download" / "enwik8.member").exists()
    # the already extracted file: the archive's published checksum does not apply to it
    (tmp_path / "enwik8").write_bytes(data)
    raw = _prepare("enwik8", tmp_path / "enwik8", tmp_path / "out_raw")
    assert raw["sha256_verified"] is False and (tmp_path / "out_raw" / "valid.txt").read_bytes() == data[b1:b2]
    # the published checksum applies when --sha256 is not given: a fake archive is refused, left in place
    with pytest.raises(TxlError, match="sha256 mismatch.*published checksum of enwik8.zip"):
        _prepare("enwik8", z, tmp_path / "out2")
    assert z.is_file()


def test_text8_character_split_unverified(tmp_path: Path) -> None:
    text = ("anarchism originated as a term of abuse é " * 30)[:1003]
    z = _zip(tmp_path / "text8.zip", {"text8": text})
    info = _prepare("text8", z, tmp_path / "out")
    b1, b2 = 1003 * 9 // 10, 1003 * 19 // 20
    assert (tmp_path / "out" / "train.txt").read_text() == text[:b1]
    assert (tmp_path / "out" / "valid.txt").read_text() == text[b1:b2]
    assert (tmp_path / "out" / "test.txt").read_text() == text[b2:]
    assert info["tokenizer"] == "char" and info["sha256_verified"] is False and info["sha256"] == _sha(z)
    assert any("not verified" in line and _sha(z) in line for line in info["_logs"])
    # the already extracted file works too
    (tmp_path / "text8").write_text(text)
    _prepare("text8", tmp_path / "text8", tmp_path / "out3")
    assert (tmp_path / "out3" / "test.txt").read_text() == text[b2:]


def test_prepare_never_writes_over_what_it_did_not_write(tmp_path: Path) -> None:
    """The output folder may be new, empty, or this dataset's own earlier output; anything else is refused
    before a byte is written: user files, another dataset, split files without dataset.json, a run folder,
    the source itself or its folder. A file named as an archive that is none is refused too."""
    data = bytes(range(256)) * 8
    src = tmp_path / "enwik8"
    src.write_bytes(data)
    out = tmp_path / "out"
    _prepare("enwik8", src, out)
    (out / ".train.txt.k3j2.tmp").write_bytes(b"x")  # a killed prepare's temporary file: its own too
    again = _prepare("enwik8", src, out)  # the same dataset again: its own files
    assert again["sizes"]["train"] == len(data) * 9 // 10

    def refused(name, source, folder, message):
        before = {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} if folder.is_dir() else {}
        with pytest.raises(TxlError, match=message):
            _prepare(name, source, folder)
        assert {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} == before

    refused("text8", src, out, "holds the dataset 'enwik8'; choose another folder to prepare text8")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "train.txt").write_text("my notes\n")
    refused("enwik8", src, notes, r"holds train.txt but no dataset.json .* remove them, or choose another folder")
    (notes / "dataset.json").write_text("mine\n")
    refused("enwik8", src, notes, r"holds a dataset.json txl data prepare cannot read \(.*not valid JSON.*\); remove it")
    (notes / "todo.md").write_text("x\n")
    refused("enwik8", src, notes, r"holds files txl data prepare does not write \(todo.md\)")
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    refused("enwik8", src, run, "is a txl checkpoint or run folder")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "enwik8").write_bytes(data)
    refused("enwik8", mine / "enwik8", mine, "holds the source")
    refused("enwik8", mine, mine / "sub", "is inside the source folder")
    (tmp_path / "junk.zip").write_bytes(b"not an archive" * 100)
    refused("enwik8", tmp_path / "junk.zip", tmp_path / "o3", "is named as an archive but is not a zip or tar")


@pytest.mark.parametrize("name, folder, ext", [
    ("wikitext-2", "wikitext-2", "tokens"), ("wikitext-103", "wikitext-103", "tokens"),
    ("wikitext-2-raw", "wikitext-2-raw", "raw"), ("wikitext-103-raw", "wikitext-103-raw", "raw"),
])
def test_wikitext_zips(tmp_path: Path, name: str, folder: str, ext: str) -> None:
    z = _zip(tmp_path / "wt.zip", {f"{folder}/": b"", f"{folder}/wiki.train.{ext}": WT_TRAIN,
                                   f"{folder}/wiki.valid.{ext}": WT_VALID, f"{folder}/wiki.test.{ext}": WT_TEST})
    out = tmp_path / "out"
    info = _prepare(name, z, out, sha256=_sha(z))
    assert [(out / f"{s}.txt").read_text() for s in ("train", "valid", "test")] == [WT_TRAIN, WT_VALID, WT_TEST]
    assert info["tokenizer"] == "word" and info["members"]["valid"] == f"{folder}/wiki.valid.{ext}"


def test_wikitext_zip_of_the_other_variant_is_rejected(tmp_path: Path) -> None:
    z = _zip(tmp_path / "wt.zip", {"wikitext-2/wiki.train.tokens": WT_TRAIN})
    with pytest.raises(TxlError, match="no member matching 'wikitext-103/wiki.train.tokens'"):
        _prepare("wikitext-103", z, tmp_path / "out", sha256=_sha(z))


def _ptb_members() -> list[tuple[str, str]]:
    m = []
    for s in ("train", "valid", "test"):
        m.append((f"./simple-examples/data/ptb.{s}.txt", f" the {s} words of ptb \n a <unk> N \n"))
        m.append((f"./simple-examples/data/ptb.char.{s}.txt", f"t h e _ {s} \n"))
    m.append(("./simple-examples/models/model.bin", b"\x00\x01"))
    return m


@pytest.mark.parametrize("name, tok, char", [("ptb", "word", False), ("ptb-char", "char", True)])
def test_ptb_tgz(tmp_path: Path, name: str, tok: str, char: bool) -> None:
    t = _tar(tmp_path / "simple-examples.tgz", _ptb_members())
    out = tmp_path / "out"
    info = _prepare(name, t, out)
    expected = "t h e _ valid \n" if char else " the valid words of ptb \n a <unk> N \n"
    assert (out / "valid.txt").read_text() == expected
    assert info["tokenizer"] == tok and not (out / "model.bin").exists()
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json", "test.txt", "train.txt", "valid.txt"]


def test_ptb_from_extracted_folder(tmp_path: Path) -> None:
    for name, data in _ptb_members():
        p = tmp_path / "src" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    info = _prepare("ptb", tmp_path / "src", tmp_path / "out")
    assert (tmp_path / "out" / "test.txt").read_text().startswith(" the test words")
    assert info["sha256"] is None and info["archive"] is None
    # pointing at the data folder itself works as well
    _prepare("ptb-char", tmp_path / "src" / "simple-examples" / "data", tmp_path / "out2")
    assert (tmp_path / "out2" / "train.txt").read_text() == "t h e _ train \n"


def _lm1b_tar(path: Path) -> Path:
    root = "1-billion-word-language-modeling-benchmark-r13output"
    tr, ho = f"{root}/training-monolingual.tokenized.shuffled", f"{root}/heldout-monolingual.tokenized.shuffled"
    return _tar(path, [
        (f"{root}/README", "readme"),
        (f"{tr}/news.en-00002-of-00100", "Second shard sentence .\nAnother one .\n"),
        (f"{tr}/news.en-00001-of-00100", "First shard sentence .\n"),
        (f"{ho}/news.en.heldout-00000-of-00050", "Held out zero .\nHeld out again .\n"),
        (f"{ho}/news.en.heldout-00001-of-00050", "Held out one .\n"),
    ])


def test_lm1b_tar(tmp_path: Path) -> None:
    t = _lm1b_tar(tmp_path / "1b.tar.gz")
    out = tmp_path / "out"
    info = _prepare("lm1b", t, out, sha256=_sha(t))
    assert info["tokenizer"] == "word" and info["shuffled"] is True
    shards = ["training-monolingual.tokenized.shuffled/news.en-00001-of-00100",
              "training-monolingual.tokenized.shuffled/news.en-00002-of-00100"]
    assert (out / "train.txt").read_text().splitlines() == shards
    assert (out / shards[0]).read_text() == "First shard sentence .\n"
    assert (out / "valid.txt").read_text() == (out / "test.txt").read_text() == "Held out zero .\nHeld out again .\n"
    on_disk = dataset_info(out)
    assert on_disk["shuffled"] is True and on_disk["train_shards"] == shards and on_disk["tokenizer"] == "word"
    assert on_disk["train_bytes"] == sum((out / s).stat().st_size for s in shards)
    with pytest.raises(TxlError, match="use tokenizer=word"):
        load_corpus(out, "char")
    assert _prepare("lm1b", t, out, sha256=_sha(t))["train_shards"] == shards  # again, over its own shards


# ---------------------------------------------------------------- unsafe archives

def test_zip_with_parent_path_is_refused(tmp_path: Path) -> None:
    z = _zip(tmp_path / "wt.zip", {"wikitext-2/wiki.train.tokens": WT_TRAIN, "wikitext-2/wiki.valid.tokens": WT_VALID,
                                   "wikitext-2/wiki.test.tokens": WT_TEST, "../evil": "pwned"})
    out = tmp_path / "out"
    with pytest.raises(TxlError, match=r"'\.\./evil'"):
        _prepare("wikitext-2", z, out, sha256=_sha(z))
    assert not (tmp_path / "evil").exists() and not (out / "train.txt").exists()
    assert not list(out.rglob("*.partial"))


def test_zip_with_absolute_path_is_refused(tmp_path: Path) -> None:
    z = _zip(tmp_path / "e.zip", {"/tmp/evil_abs": "x", "enwik8": b"y" * 100})
    with pytest.raises(TxlError, match="absolute"):
        extract(z, lambda name: [tmp_path / "o" / name])


def test_tar_with_absolute_path_is_refused(tmp_path: Path) -> None:
    t = _tar(tmp_path / "a.tgz", [("./simple-examples/data/ptb.train.txt", "ok"), ("/etc/evil", "x")])
    with pytest.raises(TxlError, match="'/etc/evil'.*absolute"):
        _prepare("ptb", t, tmp_path / "out")
    assert not (tmp_path / "out" / "train.txt").exists() and not list((tmp_path / "out").rglob("*.partial"))


@pytest.mark.parametrize("kind, target", [(tarfile.SYMTYPE, "../../../outside"), (tarfile.SYMTYPE, "/etc/passwd"),
                                          (tarfile.LNKTYPE, "../outside")])
def test_tar_with_escaping_link_is_refused(tmp_path: Path, kind: bytes, target: str) -> None:
    link = tarfile.TarInfo("simple-examples/data/link")
    link.type, link.linkname = kind, target
    t = _tar(tmp_path / "l.tgz", [link] + _ptb_members())
    with pytest.raises(TxlError, match="'simple-examples/data/link'.*outside"):
        _prepare("ptb", t, tmp_path / "out")
    assert not (tmp_path / "out" / "train.txt").exists()


def test_tar_with_inner_link_is_fine(tmp_path: Path) -> None:
    link = tarfile.TarInfo("simple-examples/data/alias.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "ptb.train.txt"
    t = _tar(tmp_path / "ok.tgz", _ptb_members() + [link])
    _prepare("ptb", t, tmp_path / "out")
    assert (tmp_path / "out" / "train.txt").is_file()


# ---------------------------------------------------------------- downloads from a local server

class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        srv = self.server
        srv.ranges.append(self.headers.get("Range"))
        data: bytes = srv.content
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if m and srv.honor_range:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if srv.cut_after is not None:  # announce the whole body, send only part of it, hang up
            self.wfile.write(body[: srv.cut_after])
            srv.cut_after = None
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadingHTTPServer]:
    for var in ("NO_PROXY", "no_proxy"):  # never send test traffic through a configured proxy
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.content, srv.honor_range, srv.cut_after, srv.ranges = b"", True, None, []
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_download_resumes_partial_file(tmp_path: Path, server) -> None:
    server.content = bytes(range(256)) * 40
    dest = tmp_path / "d" / "file.bin"
    dest.parent.mkdir()
    (tmp_path / "d" / "file.bin.part").write_bytes(server.content[:1000])
    assert download(server.url + "/file.bin", dest, progress=False, timeout=5, log=lambda m: None) == dest
    assert dest.read_bytes() == server.content and server.ranges == ["bytes=1000-"]
    assert not (tmp_path / "d" / "file.bin.part").exists()
    # a .part longer than the file: the server answers 416 and the download starts over
    dest.unlink()
    (tmp_path / "d" / "file.bin.part").write_bytes(b"z" * 20000)
    download(server.url + "/file.bin", dest, progress=False, timeout=5, log=lambda m: None)
    assert dest.read_bytes() == server.content and server.ranges[-2:] == ["bytes=20000-", None]


def test_download_restarts_when_server_ignores_range(tmp_path: Path, server) -> None:
    server.content, server.honor_range = b"0123456789" * 300, False
    dest = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(b"XXXXXXXXXX" * 50)  # not a prefix: must be thrown away
    logs: list[str] = []
    download(server.url + "/file.bin", dest, progress=False, timeout=5, log=logs.append)
    assert dest.read_bytes() == server.content and any("ignored" in m for m in logs)


def test_download_interrupted_then_resumed(tmp_path: Path, server) -> None:
    server.content, server.cut_after = b"abcdefghij" * 500, 1234
    dest = tmp_path / "file.bin"
    with pytest.raises(TxlError, match="run the same command again to resume"):
        download(server.url + "/file.bin", dest, progress=False, timeout=5, log=lambda m: None)
    assert (tmp_path / "file.bin.part").stat().st_size == 1234 and not dest.exists()
    download(server.url + "/file.bin", dest, progress=False, timeout=5, log=lambda m: None)
    assert dest.read_bytes() == server.content and server.ranges[-1] == "bytes=1234-"


def test_download_errors(tmp_path: Path, server) -> None:
    server.content = b""
    with pytest.raises(TxlError, match="not an http"):
        download("ftp://127.0.0.1/x", tmp_path / "x", progress=False)
    with pytest.raises(TxlError, match="download of .* failed"):
        download("http://127.0.0.1:1/nothing", tmp_path / "x", progress=False, timeout=2)


def test_prepare_from_url_verifies_and_keeps_bad_file_aside(tmp_path: Path, server) -> None:
    z = _zip(tmp_path / "enwik8.zip", {"enwik8": bytes(range(200)) * 5})
    server.content = z.read_bytes()
    out = tmp_path / "out"
    wrong = "0" * 64
    with pytest.raises(TxlError, match="sha256 mismatch.*kept aside"):
        _prepare("enwik8", server.url + "/dl/enwik8.zip", out, sha256=wrong)
    assert (out / ".download" / "enwik8.zip.bad").read_bytes() == server.content
    assert not (out / ".download" / "enwik8.zip").exists() and not (out / "train.txt").exists()
    info = _prepare("enwik8", server.url + "/dl/enwik8.zip", out, sha256=_sha(z))
    assert info["sha256_verified"] and (out / "train.txt").read_bytes() == (bytes(range(200)) * 5)[:900]
    # a second run reuses the verified download without asking the server again
    n = len(server.ranges)
    _prepare("enwik8", server.url + "/dl/enwik8.zip", out, sha256=_sha(z))
    assert len(server.ranges) == n


# ---------------------------------------------------------------- training integration and CLI

def test_load_corpus_on_prepared_folder(tmp_path: Path) -> None:
    z = _zip(tmp_path / "wt.zip", {"wikitext-2/wiki.train.tokens": WT_TRAIN, "wikitext-2/wiki.valid.tokens": WT_VALID,
                                   "wikitext-2/wiki.test.tokens": WT_TEST})
    out = tmp_path / "wt2"
    _prepare("wikitext-2", z, out, sha256=_sha(z))
    info = dataset_info(out)
    assert info is not None and info["name"] == "wikitext-2" and dataset_info(tmp_path) is None
    c = load_corpus(out, info["tokenizer"])
    tok = c.tokenizer
    assert tok.kind == "word" and "@-@" in tok.words
    assert tok.decode(c.train) == "= Lobster =\n\nThe lobster 's claw is well @-@ known .\n"
    np.testing.assert_array_equal(c.valid, tok.encode(WT_VALID))
    np.testing.assert_array_equal(c.test, tok.encode(WT_TEST))
    for files in (["train.txt"], "train.txt", None):  # a damaged "files": one line, whatever its type
        (out / "dataset.json").write_text(json.dumps({**info, "files": files}))
        with pytest.raises(TxlError, match="does not name a train file; run txl data prepare again"):
            load_corpus(out, "word")
    (out / "dataset.json").write_text("{broken")
    with pytest.raises(TxlError, match="not valid JSON"):
        load_corpus(out, "word")


def test_cli_data_prepare(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    z = _zip(tmp_path / "wt.zip", {"wikitext-103/wiki.train.tokens": WT_TRAIN,
                                   "wikitext-103/wiki.valid.tokens": WT_VALID,
                                   "wikitext-103/wiki.test.tokens": WT_TEST})
    out = tmp_path / "wt103"
    rc = main(["data", "prepare", "wikitext-103", "--source", str(z), "--out", str(out), "--sha256", _sha(z), "-q"])
    assert rc == 0 and json.loads((out / "dataset.json").read_text())["name"] == "wikitext-103"
    assert "recommended tokenizer: word" in capsys.readouterr().out

    for argv, pattern in [
        (["data", "prepare", "wikitext-7", "--source", str(z)], "unknown dataset 'wikitext-7'"),
        (["data", "prepare", "ptb", "--source", str(tmp_path / "missing.tgz"), "--out", str(tmp_path / "o")],
         "does not exist"),
        (["data", "prepare", "ptb", "--out", str(tmp_path / "o")], "give --source"),
        (["data", "prepare", "ptb", "--source", str(z), "--sha256", "xyz"], "64 hexadecimal"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("txl: error: ") and re.search(pattern, err[0]), err


def test_every_name_is_registered() -> None:
    assert set(DATASETS) == {"enwik8", "text8", "wikitext-2", "wikitext-103", "wikitext-2-raw", "wikitext-103-raw",
                             "ptb", "ptb-char", "lm1b", "pg19"}
    for spec in DATASETS.values():
        assert spec.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", spec.sha256)


# ---------------------------------------------------------------- shuffled sentence iterator

def _streams(it: LMShuffledIterator) -> tuple[list[list[int]], list[list[int]]]:
    """Per stream, the concatenated inputs and labels over all batches (ignored positions dropped)."""
    xs: list[list[int]] = [[] for _ in range(it.batch_size)]
    ys: list[list[int]] = [[] for _ in range(it.batch_size)]
    for x, y in it:
        assert x.shape == y.shape == (it.batch_size, it.tgt_len) and x.dtype == y.dtype == torch.int64
        for b in range(it.batch_size):
            keep = y[b] != IGNORE_INDEX
            assert not (y[b][~keep] != IGNORE_INDEX).any()
            xs[b] += x[b][keep].tolist()
            ys[b] += y[b][keep].tolist()
    return xs, ys


def test_shuffled_iterator_covers_every_sentence_without_mixing() -> None:
    eos = 1
    rng = np.random.default_rng(0)
    sentences = [rng.integers(2, 50, size=int(n)) for n in rng.integers(0, 12, size=40)]
    sentences[3] = np.append(sentences[3], eos)  # an already terminated sentence is not doubled
    it = LMShuffledIterator(sentences, batch_size=3, tgt_len=7, eos_id=eos, seed=1)
    xs, ys = _streams(it)
    expected = sorted(tuple(s[s != eos].tolist()) for s in sentences)
    got = []
    for x, y in zip(xs, ys):
        assert y and y[-1] == eos
        # inputs are the labels shifted by one within a stream; each sentence starts after an <eos>
        assert x[0] == eos and x[1:] == y[:-1]
        sent: list[int] = []
        for tok in y:
            if tok == eos:
                got.append(tuple(sent))
                sent = []
            else:
                sent.append(tok)
    assert sorted(got) == expected
    assert sum(len(y) for y in ys) == it.n_targets == sum(len(s[s != eos]) + 1 for s in sentences)


def test_shuffled_iterator_order_is_seeded_and_changes_per_pass() -> None:
    sentences = [[i + 2] * 3 for i in range(20)]
    a = LMShuffledIterator(sentences, 2, 5, eos_id=1, seed=7)
    b = LMShuffledIterator(sentences, 2, 5, eos_id=1, seed=7)
    first_a = [y.clone() for _, y in a]
    assert all(torch.equal(p, q) for p, q in zip(first_a, [y for _, y in b]))
    second_a = [y.clone() for _, y in a]
    assert not all(torch.equal(p, q) for p, q in zip(first_a, second_a))
    plain = LMShuffledIterator(sentences, 1, 4, eos_id=1, shuffle=False)
    assert next(iter(plain))[1].tolist() == [[2, 2, 2, 1]]
    with pytest.raises(TxlError):
        LMShuffledIterator([], 2, 5, eos_id=1)
    with pytest.raises(TxlError):
        LMShuffledIterator(sentences, 0, 5, eos_id=1)


def test_lm1b_trains_on_shuffled_sentences(tmp_path: Path, capsys, monkeypatch) -> None:
    from txl.cli import main
    from txl.data.corpus import shard_sentences
    from txl.training.loop import shuffled_batches

    root = "1-billion-word-language-modeling-benchmark-r13output"
    tr, ho = f"{root}/training-monolingual.tokenized.shuffled", f"{root}/heldout-monolingual.tokenized.shuffled"
    words = "the a cat dog sat ran on under mat log and then".split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 5)) + " ." for i in range(120)]
    t = _tar(tmp_path / "1b.tar.gz", [(f"{tr}/news.en-00001-of-00100", "\n".join(lines[:60]) + "\n"),
                                       (f"{tr}/news.en-00002-of-00100", "\n".join(lines[60:]) + "\n"),
                                       (f"{ho}/news.en.heldout-00000-of-00050", "\n".join(lines[:20]) + "\n")])
    out = tmp_path / "lm1b"
    _prepare("lm1b", t, out, sha256=_sha(t))
    corpus = load_corpus(out, "word")
    assert len(corpus.train) == 0 and len(corpus.train_shards) == 2 and len(corpus.valid) > 20
    sentences = shard_sentences(corpus.train_shards[0], corpus.tokenizer)
    assert len(sentences) == 60 and all(s[-1] == corpus.tokenizer.eos_id for s in sentences)
    # one pass of the shuffled stream scores every sentence token (and its <eos>) exactly once
    stream = shuffled_batches(corpus, 3, 8, torch.device("cpu"), seed=0)
    expected = sum(len(s) for shard in corpus.train_shards for s in shard_sentences(shard, corpus.tokenizer))
    scored = 0
    while scored < expected:
        x, y = next(stream)
        assert x.shape == (3, 8)
        scored += int((y != -100).sum())
    assert scored == expected

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code = main(["train", str(out), "--out", str(tmp_path / "run"), "-q", "model.n_layer=1", "model.d_model=16",
                 "model.n_head=2", "model.d_head=8", "model.d_inner=32", "model.tgt_len=8", "model.mem_len=8",
                 "train.batch_size=3", "train.max_steps=12", "train.eval_interval=6", "train.sample_tokens=5"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "valid ppl" in captured.out
    assert main(["eval", str(tmp_path / "run"), "--split", "test"]) == 0


def _pg19(root: Path) -> Path:
    """A PG-19 layout made here: train/, validation/ and test/ folders of small books."""
    words = "the whale ship sea captain ahab white called ishmael".split()
    for folder, n in (("train", 3), ("validation", 1), ("test", 1)):
        (root / folder).mkdir(parents=True)
        for b in range(n):
            lines = [" ".join(words[(b * 5 + i * 3 + j) % len(words)] for j in range(6)) for i in range(150)]
            (root / folder / f"{1000 + b}.txt").write_text(f"BOOK {folder} {b}\n" + "\n".join(lines) + "\n",
                                                           encoding="utf-8")
    return root


def test_pg19_is_prepared_in_place_and_trains_by_books(tmp_path: Path, capsys, monkeypatch) -> None:
    src = _pg19(tmp_path / "pg19-copy")
    out = tmp_path / "pg19"
    code = main(["data", "prepare", "pg19", "--source", str(src), "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    info = dataset_info(out)
    assert info["files"] == {"train": str((src / "train").resolve()), "valid": str((src / "validation").resolve()),
                             "test": str((src / "test").resolve())}
    assert info["documents"] == {"train": 3, "valid": 1, "test": 1} and info["tokenizer"] == "bpe"
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json"]  # nothing copied
    corpus = load_corpus(out, "word", cache_dir=tmp_path / "cache")  # read through the cache, chunk by chunk
    assert corpus.source.startswith(f"pg19 in {out} (train: 3 files")
    with pytest.raises(TxlError, match="prepared with its own splits"):
        load_corpus(out, "word", split_by="file")
    books = sorted((src / "train").glob("*.txt"))
    assert np.array_equal(corpus.train, corpus.tokenizer.encode("".join(b.read_text(encoding="utf-8") for b in books)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code = main(["train", str(out), "--tokenizer", "bpe", "--out", str(tmp_path / "run"), "-q", "data.max_size=300",
                 "model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
                 "model.tgt_len=8", "model.mem_len=8", "train.batch_size=3", "train.max_steps=6",
                 "train.eval_interval=3", "train.sample_tokens=5", "eval.max_tokens=200"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "valid ppl" in captured.out and "3 files" in captured.out + captured.err


def test_pg19_needs_its_three_folders(tmp_path: Path, capsys) -> None:
    src = _pg19(tmp_path / "copy")
    for book in (src / "test").iterdir():
        book.unlink()
    code = main(["data", "prepare", "pg19", "--source", str(src), "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and f"{src / 'test'} holds no *.txt books" in err and err.count("\n") == 1
    code = main(["data", "prepare", "pg19", "--source", str(src / "train" / "1000.txt"), "--out", str(tmp_path / "o2")])
    assert code == 2 and "pg19 is prepared from a local copy of the pg19 folders" in capsys.readouterr().err
    code = main(["data", "prepare", "pg19", "--out", str(tmp_path / "o3")])
    assert code == 2 and "give --source: a local copy of the pg19 folders, holding train/" in capsys.readouterr().err


# ---------------------------------------------------------------- damaged and hostile archives


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_truncated_tgz_is_one_clear_error(tmp_path: Path, keep: float) -> None:
    whole = _tar(tmp_path / "whole.tgz", _ptb_members() + [("./simple-examples/data/big.txt", bytes(range(256)) * 400)])
    data = whole.read_bytes()
    cut = tmp_path / "simple-examples.tgz"
    cut.write_bytes(data[: int(len(data) * keep)])  # an interrupted download
    with pytest.raises(TxlError, match="corrupt|truncated|neither"):
        _prepare("ptb", cut, tmp_path / "out")
    assert not (tmp_path / "out" / "dataset.json").exists()


def test_truncated_zip_is_one_clear_error(tmp_path: Path) -> None:
    whole = _zip(tmp_path / "whole.zip", {"enwik8": bytes(range(256)) * 400})
    cut = tmp_path / "enwik8.zip"
    cut.write_bytes(whole.read_bytes()[:-100])
    with pytest.raises(TxlError, match="corrupt|neither"):
        _prepare("enwik8", cut, tmp_path / "out", sha256=_sha(cut))


def test_decompression_bomb_stops_at_the_member_limit(tmp_path: Path) -> None:
    # 20 MB of zeros compress to ~20 kB; the limit (here 1 MB) stops the copy long before the end
    bomb = tmp_path / "text8.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("text8", b"\0" * 20_000_000)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(TxlError, match="larger than 1,000,000 bytes"):
        _prepare("text8", bomb, tmp_path / "out", max_member_bytes=1_000_000)
    assert not any(p.name.endswith((".partial", ".member")) for p in (tmp_path / "out").rglob("*"))
    assert not (tmp_path / "out" / "dataset.json").exists()


def test_every_dataset_has_a_member_limit_above_its_real_size() -> None:
    real = {"enwik8": 100_000_000, "text8": 100_000_000, "wikitext-103": 539_000_000, "wikitext-103-raw": 541_000_000,
            "wikitext-2": 11_000_000, "wikitext-2-raw": 11_000_000, "ptb": 5_100_000, "ptb-char": 5_100_000,
            "lm1b": 45_000_000}
    for name, spec in DATASETS.items():
        if spec.layout == "pg19":  # a local copy's folders, named in place: nothing is extracted
            continue
        assert real[name] < spec.max_member_bytes <= 2 * real[name] + 150_000_000


@pytest.mark.parametrize("kind", ["folder", "zip", "tgz"])
def test_a_source_missing_a_split_leaves_the_output_folder_as_it_was(tmp_path: Path, kind: str) -> None:
    """Only ptb.train.txt is there: refused before any split is written, so a corrected retry is not
    blocked by train.txt (the folder holds nothing but what a download would leave)."""
    member, text = "./simple-examples/data/ptb.train.txt", " the train words of ptb \n"
    if kind == "folder":
        source = tmp_path / "src"
        (source / "simple-examples" / "data").mkdir(parents=True)
        (source / "simple-examples" / "data" / "ptb.train.txt").write_text(text)
        expect = r"has no file matching 'simple-examples/data/ptb.valid.txt', or one ptb.valid.txt anywhere in it"
    elif kind == "zip":
        source = _zip(tmp_path / "se.zip", {member[2:]: text})
        expect = "no member matching 'simple-examples/data/ptb.valid.txt'"
    else:
        source = _tar(tmp_path / "se.tgz", [(member, text)])
        expect = "no member matching 'simple-examples/data/ptb.valid.txt'"
    out = tmp_path / "out"
    with pytest.raises(TxlError, match=expect):
        _prepare("ptb", source, out, sha256=None if kind == "folder" else _sha(source))
    assert not out.exists() or list(out.iterdir()) == []
    full = dict(_ptb_members())  # the corrected source then prepares into the same folder
    fixed = _tar(tmp_path / "full.tgz", list(full.items()))
    _prepare("ptb", fixed, out, sha256=_sha(fixed))
    assert (out / "valid.txt").read_text() == full["./simple-examples/data/ptb.valid.txt"]


def test_a_split_file_too_short_to_cut_names_its_unit(tmp_path: Path) -> None:
    (tmp_path / "text8").write_text("short")
    with pytest.raises(TxlError, match="the file has 5 characters; at least 20"):
        _prepare("text8", tmp_path / "text8", tmp_path / "out")


def test_what_a_killed_prepare_left_in_staging_is_not_moved_into_the_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / ".staged").mkdir(parents=True)
    (out / ".staged" / "train.txt.partial").write_text("from a prepare that was killed")
    full = _tar(tmp_path / "full.tgz", _ptb_members())
    _prepare("ptb", full, out, sha256=_sha(full))
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json", "test.txt", "train.txt", "valid.txt"]


def test_a_destination_of_another_kind_is_refused_before_anything_moves(tmp_path: Path) -> None:
    full = _tar(tmp_path / "full.tgz", _ptb_members())
    out = tmp_path / "out"
    _prepare("ptb", full, out, sha256=_sha(full))
    before = {name: (out / name).read_bytes() for name in ("dataset.json", "test.txt", "train.txt")}
    (out / "valid.txt").unlink()
    (out / "valid.txt").mkdir()
    with pytest.raises(TxlError, match=r"valid.txt is a folder, where txl data prepare writes a file; remove it"):
        _prepare("ptb", full, out, sha256=_sha(full))
    assert {name: (out / name).read_bytes() for name in before} == before
    assert not (out / ".staged").exists()
