"""Issue 23, items 18, 19, 24, 12 and 17: CPU threads chosen from the free CPUs (``--threads``), progress
bars on evaluation (quiet with ``-q``), install hints that name this folder and a distribution name of
its own, names read from JSON kept inside their folder, and HF vocabularies with added tokens."""

import collections
import json
import pickle
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import txl.runtime
import txl.training.checkpoint_files
from conftest import ROOT, one_error_line, run_cli, tiny_model
from txl.cli import all_parsers
from txl.data import CharTokenizer
from txl.errors import TxlError
from txl.runtime import choose_threads, usable_cpus
from txl.training.checkpoint import load_checkpoint, save_checkpoint
from txl.config import RunConfig

TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "train.batch_size=4", "train.max_steps=2", "train.eval_interval=2",
        "train.log_interval=1", "train.sample_tokens=0", "train.warmup_steps=1", "eval.max_tokens=200"]


def make_checkpoint(folder: Path) -> Path:
    """A checkpoint of a tiny character model as training writes one."""
    tok = CharTokenizer(list("abc \n"))
    model = tiny_model(0, dtype=torch.float32, vocab_size=tok.vocab_size, n_layer=1)
    save_checkpoint(folder, model, tok, RunConfig(), {"step": 3})
    return folder


@pytest.fixture
def machine(monkeypatch):
    """A machine of 2 CPUs with a 1-minute load of 1.3 and one other thread busy now, no OMP_NUM_THREADS."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(txl.runtime, "usable_cpus", lambda: 2)
    monkeypatch.setattr(txl.runtime, "load_average", lambda: 1.3)
    monkeypatch.setattr(txl.runtime, "busy_now", lambda: 1.0)
    monkeypatch.setattr(txl.runtime.os, "cpu_count", lambda: 2)


# --- item 18: threads ------------------------------------------------------------------------------------------


def test_threads_are_the_free_cpus_unless_the_flag_or_omp_num_threads_say_otherwise():
    assert choose_threads(None, cpus=2, load=1.3) == (1, "threads 1 (2 CPUs, load 1.3)")  # one CPU busy
    assert choose_threads(0, cpus=2, load=0.2) == (2, "threads 2 (2 CPUs, load 0.2)")  # 0: automatic
    assert choose_threads(None, cpus=2, load=0.6)[0] == 1  # a CPU more than half busy counts as busy
    assert choose_threads(None, cpus=2, load=7.5)[0] == 1  # at least one
    assert choose_threads(None, cpus=8, load=None) == (8, "threads 8 (8 CPUs, load unknown)")
    assert choose_threads(None, cpus=1, load=0.0) == (1, "threads 1 (1 CPU, load 0.0)")
    assert choose_threads(3, cpus=2, load=1.3, env="1") == (3, "threads 3 (--threads; 2 CPUs, load 1.3)")
    assert choose_threads(None, cpus=2, load=1.3, env="4") == (4, "threads 4 (OMP_NUM_THREADS; 2 CPUs, load 1.3)")
    for env in ("0", "two", "", "-1"):  # not a thread count: the automatic choice
        assert choose_threads(None, cpus=2, load=0.1, env=env) == (2, "threads 2 (2 CPUs, load 0.1)")
    # the load average lags a minute: a process that just ended (pip install before txl train) is not busy now
    assert choose_threads(None, cpus=2, load=1.0, now=0.0) == (2, "threads 2 (2 CPUs, load 1.0, busy now 0.0)")
    assert choose_threads(None, cpus=2, load=1.3, now=1.2) == (1, "threads 1 (2 CPUs, load 1.3, busy now 1.2)")
    assert choose_threads(None, cpus=2, load=0.1, now=1.8)[0] == 2  # a burst now, idle over the minute: noise
    assert choose_threads(None, cpus=4, load=None, now=2.0)[0] == 2
    for bad in (-1, 1025, 2.5, True):
        with pytest.raises(TxlError, match=r"^train\.threads must be from 0 \(automatic: the free CPUs\) to 1024"):
            choose_threads(bad, cpus=2, load=0.0, flag="train.threads")


def test_a_process_limited_to_some_cpus_counts_its_share_of_the_load(tmp_path, monkeypatch):
    # 4 of 64 CPUs, the machine's load 32 (half of it busy): about 2 of this process's 4 are busy
    assert choose_threads(None, cpus=4, load=32.0, online=64) == (2, "threads 2 (4 CPUs, load 32.0)")
    assert choose_threads(None, cpus=4, load=32.0)[0] == 1  # without the share: the whole load against 4 CPUs
    # a container's quota (cgroup v2 cpu.max: 1.5 CPUs) caps the affinity mask (8 CPUs), rounded up
    monkeypatch.setattr(txl.runtime.os, "sched_getaffinity", lambda pid: set(range(8)))
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert usable_cpus(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path) == 8
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()  # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(tmp_path) == 3


MODEL_COMMANDS = {"txl train", "txl finetune", "txl eval", "txl generate", "txl summarize", "txl score", "txl bench",
                  "txl classify train", "txl classify predict", "txl serve", "txl plot", "txl recl", "txl ablate"}


def test_every_command_that_runs_a_model_has_threads():
    parsers = all_parsers()
    assert MODEL_COMMANDS <= set(parsers)
    flags = {name: {o for a in p._actions for o in a.option_strings} for name, p in parsers.items()}
    assert {name for name in MODEL_COMMANDS if "--threads" not in flags[name]} == set()
    assert {name for name, f in flags.items() if "--device" in f and "--threads" not in f} == set()
    assert "--threads" not in flags["txl convert hf"] and "--threads" not in flags["txl data prepare"]


def test_eval_says_its_threads_in_the_start_line_and_gives_the_thread_count_back(tmp_path, capsys, machine,
                                                                               monkeypatch):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    text = tmp_path / "doc.txt"
    text.write_text("abc abc cab\n" * 20, encoding="utf-8")
    before = torch.get_num_threads()
    set_to, real = [], torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (set_to.append(n), real(n)))
    code, out, err = run_cli(capsys, "eval", ckpt, "--data", text, "-q")
    assert code == 0, err
    assert err.splitlines() == [f"txl: using {ckpt} (step 3); threads 1 (2 CPUs, load 1.3, busy now 1.0)"]
    code, out, err = run_cli(capsys, "eval", ckpt, "--data", text, "-q", "--threads", "3")
    assert code == 0 and err.splitlines() == [f"txl: using {ckpt} (step 3); threads 3 (--threads; 2 CPUs, load 1.3)"]
    assert set_to[-2:] == [3, before] and torch.get_num_threads() == before  # set for the command, then given back
    code, out, err = run_cli(capsys, "generate", ckpt, "-n", "2", "--threads", "-1")
    assert code == 2 and one_error_line(err) == ("txl: error: --threads must be from 0 (automatic: the free CPUs) to "
                                                 "1024, got -1")


def test_train_says_its_threads_and_takes_them_from_the_flag_or_the_config(tmp_path, capsys, machine, corpus):
    base = ["train", corpus, "--tokenizer", "char", "-q", f"data.cache_dir={tmp_path / 'cache'}", *TINY]
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "a")
    assert code == 0, err
    assert re.search(r"^model: .*; device cpu, dtype float32; threads 1 \(2 CPUs, load 1\.3, busy now 1\.0\)$", err,
                     re.M), err
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "b", "train.threads=2")
    assert code == 0 and "; threads 2 (train.threads; 2 CPUs, load 1.3)\n" in err, err
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "c", "--threads", "2")
    assert code == 0 and "; threads 2 (train.threads; 2 CPUs, load 1.3)\n" in err, err
    assert json.loads((tmp_path / "c" / "run.json").read_text())["train"]["threads"] == 2
    # --threads continues a run without --allow-config-change: how it runs, not what it trains
    code, out, err = run_cli(capsys, "train", "--resume", tmp_path / "c", "-q", "--threads", "1",
                             "--allow-config-change", "train.max_steps=3")
    assert code == 0 and "; threads 1 (train.threads; 2 CPUs, load 1.3)\n" in err, err
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "d", "train.threads=-2")
    assert code == 2 and "train.threads must be from 0 (automatic: the free CPUs) to 1024, got -2" in one_error_line(err)
    assert not (tmp_path / "d").exists()


def test_a_resumed_run_keeps_the_thread_count_it_recorded_whatever_the_load(tmp_path, capsys, machine, corpus,
                                                                             monkeypatch):
    """An automatic choice follows the load; a resumed run takes the count its checkpoint recorded, since another
    count changes the losses in their last digits."""
    base = ["train", corpus, "--tokenizer", "char", "-q", f"data.cache_dir={tmp_path / 'cache'}", *TINY]
    monkeypatch.setattr(txl.runtime, "load_average", lambda: 0.0)  # an idle machine: 2 threads
    monkeypatch.setattr(txl.runtime, "busy_now", lambda: 0.0)
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "a")
    assert code == 0 and "; threads 2 (2 CPUs, load 0.0, busy now 0.0)\n" in err, err
    assert json.loads((tmp_path / "a" / "last" / "state.json").read_text())["threads"] == 2
    monkeypatch.setattr(txl.runtime, "load_average", lambda: 1.3)  # busy now: a new run would take 1
    code, out, err = run_cli(capsys, "train", "--resume", tmp_path / "a", "-q", "--allow-config-change",
                             "train.max_steps=3")
    assert code == 0 and "; threads 2 (as recorded by the run; 2 CPUs, load 1.3)\n" in err, err
    code, out, err = run_cli(capsys, "train", "--resume", tmp_path / "a", "-q", "--threads", "1",
                             "--allow-config-change", "train.max_steps=4")
    assert code == 0 and "; threads 1 (train.threads; 2 CPUs, load 1.3)\n" in err, err  # a given count wins
    assert json.loads((tmp_path / "a" / "last" / "state.json").read_text())["threads"] == 1


def test_ablate_chooses_the_threads_once_for_every_variant(tmp_path, capsys, machine, monkeypatch):
    import txl_studies.ablation.table

    seen = []

    def stop(base, *args, **kwargs):
        seen.append(base.train.threads)
        raise TxlError("stopped before training")

    monkeypatch.setattr(txl_studies.ablation.table, "run_ablation", stop)
    code, _, err = run_cli(capsys, "ablate", "--out", tmp_path / "ab")
    assert code == 2 and seen == [1], err  # a fixed count in the base config, not 0 (automatic per variant)


def test_ranks_share_the_free_cpus_and_the_launcher_keeps_its_own_setting(monkeypatch):
    import torch.distributed.run

    from txl import distributed

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(distributed, "usable_cpus", lambda: 8)
    monkeypatch.setattr(distributed.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(distributed, "load_average", lambda: 2.2)  # 2 of 8 busy: 6 free, 3 per rank
    monkeypatch.setattr(distributed, "busy_now", lambda: 2.4)
    seen = []
    monkeypatch.setattr(torch.distributed.run, "run", lambda config: seen.append(txl.runtime.os.environ.get(
        "OMP_NUM_THREADS")))
    assert distributed.launch(2, ["train", "--help"]) == 0
    assert seen == ["3"] and "OMP_NUM_THREADS" not in txl.runtime.os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # the user's setting is passed on as it is
    assert distributed.launch(2, ["train", "--help"]) == 0
    assert seen == ["3", "5"] and txl.runtime.os.environ["OMP_NUM_THREADS"] == "5"


# --- item 19: progress bars -------------------------------------------------------------------------------------


def test_eval_shows_a_progress_bar_on_stderr_unless_quiet(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    text = tmp_path / "doc.txt"
    text.write_text("abc abc cab\n" * 20, encoding="utf-8")  # 240 characters: 239 targets
    code, out, err = run_cli(capsys, "eval", ckpt, "--data", text, "--tgt-len", "10", "--batch-size", "2")
    assert code == 0, err
    # stderr is not a terminal here: whole lines, no carriage returns (2 streams of 120 columns: 12 segments)
    assert re.search(r"^evaluating: +0%\| +\| 0/12 \[", err, re.M) and "\r" not in err, err
    assert out.startswith(f"{text}: bpc ") and "\r" not in out
    code, quiet_out, err = run_cli(capsys, "eval", ckpt, "--data", text, "--tgt-len", "10", "--batch-size", "2", "-q")
    assert code == 0 and quiet_out == out
    assert "\r" not in err and "evaluating" not in err and len(err.splitlines()) == 1
    code, out, err = run_cli(capsys, "eval", ckpt, "--data", text, "--sliding-window", "16", "--max-tokens", "40")
    assert code == 0 and re.search(r"^evaluating: +0%\| +\| 0/25 \[.*window/s", err, re.M), err  # the first window, 24 more
    code, out, err = run_cli(capsys, "eval", ckpt, "--data", text, "--sweep-mem", "0,8", "--tgt-len", "10")
    assert code == 0 and re.search("^mem_len 0: ", err, re.M) and re.search("^mem_len 8: ", err, re.M)


def test_the_final_evaluation_of_training_shows_its_bar_unless_quiet(tmp_path, capsys, corpus):
    base = ["train", corpus, "--tokenizer", "char", f"data.cache_dir={tmp_path / 'cache'}", *TINY]
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "loud")
    assert code == 0 and re.search(r"^final evaluation \(valid\): ", err, re.M) and "\r" not in err, err
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "quiet", "-q")
    assert code == 0 and "final evaluation" not in err and "\r" not in err, err


# --- item 24: the distribution name and the install hints --------------------------------------------------------


def test_the_distribution_has_a_name_of_its_own_and_hints_name_this_folder(capsys):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == "txl-transformer-xl" and project["scripts"] == {"txl": "txl.cli:main"}
    assert set(project["optional-dependencies"]) >= {"serve", "plot", "rouge", "test"}
    # no hint anywhere installs a package called txl from PyPI ('txl[serve]', pip install txl)
    wrong = re.compile(r"txl\[|pip install -U txl|pip install txl\b")
    files = [p for folder in ("src", "docs", "scripts", "tests", "benchmarks", "configs") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".py", ".md", ".sh", ".toml") and "egg-info" not in str(p) and p.name != Path(__file__).name]
    offenders = [str(p.relative_to(ROOT)) for p in files + [ROOT / "README.md"] if wrong.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`txl serve` needs the serve extra" in readme
    assert re.search(r"\| `txl serve RUN` \|[^\n]*needs the serve extra \(`pip install -e '\.\[serve\]'`", readme)
    code, out, err = run_cli(capsys, "serve", "--help")
    assert code == 0 and "in the txl folder, .venv/bin/python -m pip install -e '.[serve]'" in " ".join(out.split())


def test_a_missing_serve_stack_names_the_local_install(tmp_path, capsys, monkeypatch):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    monkeypatch.setitem(sys.modules, "fastapi", None)
    code, out, err = run_cli(capsys, "serve", ckpt)
    assert code == 2 and one_error_line(err) == ("txl: error: txl serve needs FastAPI and uvicorn: in the txl folder, "
                                                 ".venv/bin/python -m pip install -e '.[serve]' (or pip install "
                                                 "fastapi uvicorn)")


# --- item 12: names read from a file stay inside its folder --------------------------------------------------------


@pytest.mark.parametrize("name", ["../../../../etc/hostname", "../secret.txt", "SECRET", "sub/../../secret.txt",
                                  "..", "", 7])
def test_checksums_naming_a_file_outside_the_checkpoint_are_refused_unread(tmp_path, capsys, monkeypatch, name):
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of any checkpoint")
    name = str(secret) if name == "SECRET" else name  # an absolute path
    ckpt = make_checkpoint(tmp_path / "ckpt")
    listed = json.loads((ckpt / "checksums.json").read_text())
    (ckpt / "checksums.json").write_text(json.dumps({**listed, name: "0" * 64} if name != 7 else {**listed, "7": 7}))
    hashed = []
    real = txl.training.checkpoint_files.sha256_file
    monkeypatch.setattr(txl.training.checkpoint_files, "sha256_file", lambda path: (hashed.append(Path(path)), real(path))[1])
    if name == 7:  # a checksum that is not a string
        with pytest.raises(TxlError, match=r"checksums\.json gives 7 a checksum that is not a string"):
            load_checkpoint(ckpt)
        return
    with pytest.raises(TxlError, match=re.escape(f"checksums.json names {name!r}, which is not a file name inside "
                                                 f"{ckpt}; refusing to read it")):
        load_checkpoint(ckpt)
    assert hashed == []  # nothing was opened: the names are checked before the first file is read
    code, out, err = run_cli(capsys, "generate", ckpt, "-n", "1")
    assert code == 2 and f"names {name!r}, which is not a file name inside" in one_error_line(err)


@pytest.mark.parametrize("name", ["model.safetensors", "vocab.json", "checksums.json"])
def test_a_checkpoint_file_that_is_a_symbolic_link_is_refused_unread(tmp_path, capsys, monkeypatch, name):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    outside = tmp_path / f"outside-{name}"  # the very same bytes, so only the link itself can be refused
    outside.write_bytes((ckpt / name).read_bytes())
    (ckpt / name).unlink()
    (ckpt / name).symlink_to(outside)
    hashed = []
    real = txl.training.checkpoint_files.sha256_file
    monkeypatch.setattr(txl.training.checkpoint_files, "sha256_file", lambda path: (hashed.append(Path(path)), real(path))[1])
    message = (f"checkpoint {ckpt} holds {name} as a symbolic link; txl reads only the checkpoint's own files (a "
               "link can lead anywhere): replace the link with the file itself")
    with pytest.raises(TxlError, match=re.escape(message)):
        load_checkpoint(ckpt)
    assert hashed == []  # refused before the first file was read
    code, out, err = run_cli(capsys, "generate", ckpt, "-n", "1")
    assert code == 2 and one_error_line(err) == f"txl: error: {message}"
    (ckpt / name).unlink()  # the file itself in its place: the same checkpoint loads
    (ckpt / name).write_bytes(outside.read_bytes())
    assert load_checkpoint(ckpt).state["step"] == 3 and len(hashed) == 5


def test_a_prepared_dataset_naming_files_outside_its_folder_is_refused(tmp_path):
    from txl.data.corpus import load_corpus
    from txl.data.files import FORMAT

    (tmp_path / "secret.txt").write_text("private text " * 50)
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid", "test"):
        (data / f"{split}.txt").write_text(f"{split} text\n" * 200)
    info = {"format": FORMAT, "name": "x", "files": {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"}}
    for rel in ("../secret.txt", str(tmp_path / "secret.txt"), "sub/train.txt"):
        (data / "dataset.json").write_text(json.dumps({**info, "files": {**info["files"], "valid": rel}}))
        with pytest.raises(TxlError, match=re.escape(f"dataset.json names {rel!r}, which is not a file name inside")):
            load_corpus(data, "char", cache_dir=tmp_path / "cache")
    (data / "dataset.json").write_text(json.dumps(info))
    assert len(load_corpus(data, "char", cache_dir=tmp_path / "cache").valid) == 2200
    # a shuffled corpus's relative training shards stay inside the folder too (absolute ones are used in place)
    (data / "dataset.json").write_text(json.dumps({**info, "shuffled": True, "train_shards": ["../secret.txt"]}))
    with pytest.raises(TxlError, match=re.escape("names '../secret.txt', which is not a relative path inside")):
        load_corpus(data, "word", cache_dir=tmp_path / "cache")


# --- item 17: HF vocabularies with added tokens ----------------------------------------------------------------------


SYMBOLS = ["<eos>", *[f"w{i}" for i in range(35)], "<unk>"]  # 37 symbols


def hf_folder(folder: Path, added: list[str], size: int | None = None) -> "TransfoXLTokenizer":  # noqa: F821
    """A folder saved by transformers 4.35: a model of ``size`` tokens (default ``len(tokenizer)``) and its
    tokenizer with ``added`` (TransfoXLTokenizer adds ``<formula>`` by itself)."""
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel, TransfoXLTokenizer

    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(SYMBOLS) + "\n")
    tok = TransfoXLTokenizer(vocab_file=str(folder / "vocab.txt"), unk_token="<unk>")
    tok.build_vocab()
    tok.add_tokens(added)
    tok.save_pretrained(folder)
    (folder / "vocab.txt").unlink()
    config = TransfoXLConfig(vocab_size=size or len(tok), d_model=16, n_head=2, d_head=8, d_inner=32, n_layer=1, mem_len=4,
                             cutoffs=[], div_val=1, d_embed=16, eos_token_id=None)
    torch.manual_seed(0)
    TransfoXLLMHeadModel(config).save_pretrained(folder)
    return tok


@pytest.mark.parametrize("added", [[], ["<formula>"], ["<formula>", "<table>"]])
def test_a_vocabulary_with_added_tokens_converts_with_their_ids(tmp_path, capsys, added):
    hf_tok = hf_folder(tmp_path / "hf", added)
    added = added or ["<formula>"]  # the tokenizer's own added token
    assert len(hf_tok) == 37 + len(added) and len(hf_tok.idx2sym) == 37
    code, out, err = run_cli(capsys, "convert", "hf", tmp_path / "hf", tmp_path / "txl")
    assert code == 0, err
    ckpt = load_checkpoint(tmp_path / "txl")
    assert ckpt.tokenizer.words == SYMBOLS + added and ckpt.model.config.vocab_size == 37 + len(added)
    line = "w3 " + " w1 ".join(added) + " w0"
    assert ckpt.tokenizer.encode(line + "\n").tolist() == hf_tok.convert_tokens_to_ids(hf_tok.tokenize(line)) + [0]
    assert hf_tok.convert_tokens_to_ids(added) == list(range(37, 37 + len(added)))


def test_added_tokens_the_model_has_no_rows_for_are_left_out(tmp_path, capsys):
    hf_tok = hf_folder(tmp_path / "hf", ["<table>"], size=37)  # <formula> 37 and <table> 38: beyond the model
    assert len(hf_tok) == 39
    code, out, err = run_cli(capsys, "convert", "hf", tmp_path / "hf", tmp_path / "txl")
    assert code == 0, err
    assert load_checkpoint(tmp_path / "txl").tokenizer.words == SYMBOLS
    hf_folder(tmp_path / "hf38", ["<table>"], size=38)  # <formula> has a row, <table> not
    code, out, err = run_cli(capsys, "convert", "hf", tmp_path / "hf38", tmp_path / "txl38")
    assert code == 0 and load_checkpoint(tmp_path / "txl38").tokenizer.words == SYMBOLS + ["<formula>"]


def test_added_tokens_only_in_added_tokens_json_are_read_too(tmp_path):
    from txl.convert.commands import read_hf_vocab

    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": SYMBOLS, "lower_case": False,
                                                       "sym2idx": collections.OrderedDict()}))
    (tmp_path / "added_tokens.json").write_text(json.dumps({"<b>": 38, "<a>": 37}))
    assert read_hf_vocab(tmp_path / "vocab.pkl").words == SYMBOLS + ["<a>", "<b>"]


@pytest.mark.parametrize("added_tokens, decoder, message", [
    ({"<a>": 37}, {"37": {"content": "<b>"}}, "the added tokens give id 37 two texts, '<a>' and '<b>'"),
    ({}, {"x7": {"content": "<a>"}}, "an added token must be text at an integer id >= 0, got '<a>' at 'x7'"),
    ({"<a>": "37"}, {}, "an added token must be text at an integer id >= 0, got '<a>' at '37'"),
    ({"<a>": 37}, {"38": {"content": 5}}, "an added token must be text at an integer id >= 0, got 5 at 38"),
])
def test_added_tokens_of_the_saved_json_files_are_checked_as_the_pickled_ones(tmp_path, added_tokens, decoder,
                                                                               message):
    from txl.convert.commands import read_hf_vocab

    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": SYMBOLS}))
    (tmp_path / "added_tokens.json").write_text(json.dumps(added_tokens))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    with pytest.raises(TxlError) as err:
        read_hf_vocab(tmp_path / "vocab.pkl")
    assert str(err.value) == f"{tmp_path / 'vocab.pkl'}: {message}"


@pytest.mark.parametrize("tables, message", [
    ({"_added_tokens_encoder": {"<x>": 3}}, "added token '<x>' has id 3, which the vocabulary gives to 'w2'; one id "
                                            "cannot stand for two tokens"),
    ({"_added_tokens_encoder": {"w5": 37}}, "added token 'w5' (id 37) is already in the vocabulary at id 6"),
    ({"_added_tokens_encoder": {"<a>": 37, "<b>": 39}}, "the added tokens leave id 38 without a token"),
    ({"_added_tokens_encoder": {"<a>": 37}, "added_tokens_decoder": {37: "<b>"}},
     "the added tokens give id 37 two texts, '<b>' and '<a>'"),
    ({"_added_tokens_encoder": {"<a>": -1}}, "an added token must be text at an integer id >= 0, got '<a>' at -1"),
])
def test_added_tokens_that_do_not_fit_the_vocabulary_are_refused(tmp_path, tables, message):
    from txl.convert.commands import read_hf_vocab

    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": SYMBOLS, **tables}))
    with pytest.raises(TxlError, match=re.escape(message)):
        read_hf_vocab(tmp_path / "vocab.pkl")
