"""The command line: an end-to-end run, and one clear line with a non-zero exit for bad input."""

import hashlib
import os
import subprocess
import sys

import pytest

from conftest import ROOT, one_error_line, run_cli


TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "train.batch_size=4", "train.max_steps=6", "train.eval_interval=3",
        "train.log_interval=2", "train.sample_tokens=10", "train.warmup_steps=2", "eval.mem_len=16"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    return path


def test_train_eval_generate_end_to_end(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", corpus, "--tokenizer", "char", "--out", out_dir, "-q", *TINY)
    assert code == 0, err
    assert "valid bpc" in out and "mem_len=16" in out and "--- sample ---" in out
    assert {p.name for p in out_dir.iterdir()} >= {"run.json", "metrics.csv", "best", "last"}
    assert {p.name for p in (out_dir / "best").iterdir()} == {"model.safetensors", "config.json", "vocab.json",
                                                               "run.json", "state.json", "checksums.json"}

    code, out, err = run_cli(capsys, "eval", out_dir, "--mem_len", "32", "--tgt_len", "4", "--same_length", "--json")
    assert code == 0, err
    assert '"mem_len": 32' in out and '"tgt_len": 4' in out and '"same_length": true' in out
    code, out, err = run_cli(capsys, "eval", out_dir, "--json", tmp_path / "eval.json", "--seed", "3")
    assert code == 0 and "bpc" in out and not out.startswith("{"), err  # the report, and the JSON in the file
    assert '"value"' in (tmp_path / "eval.json").read_text(encoding="utf-8")
    code, out, err = run_cli(capsys, "eval", out_dir, "--json", "-", "--tgt-len", "4")
    assert code == 0 and out.count("\n") == 1 and '"tgt_len": 4' in out, err  # stdout holds only the JSON
    code, out, err = run_cli(capsys, "eval", out_dir, "--sliding-window", "8", "--stride", "2", "--max_tokens", "40")
    assert code == 0 and "sliding-window" in out, err
    code, out, err = run_cli(capsys, "eval", out_dir, "--data", corpus)
    assert code == 0 and "bpc" in out, err
    for bad, expect in ((["--data", corpus, "--split", "test"], "whole file"), (["--max_tokens", "-5"], "max-tokens"),
                        (["--batch_size", "0"], "batch-size")):
        code, out, err = run_cli(capsys, "eval", out_dir, *bad)
        assert code == 2 and expect in one_error_line(err)
    code, out, err = run_cli(capsys, "generate", out_dir, "--prompt", "the ", "--top-k", "0")
    assert code == 2 and "--top-k must be an integer >= 1" in one_error_line(err) and out == ""  # checked before anything is printed

    code, out, err = run_cli(capsys, "generate", out_dir, "--prompt", "the ", "-n", "20", "--seed", "1")
    assert code == 0, err
    assert out.startswith("the ") and len(out) >= 24
    code2, out2, _ = run_cli(capsys, "generate", out_dir, "--prompt", "the ", "-n", "20", "--seed", "1")
    assert out2 == out  # seeded sampling is reproducible
    code, out, err = run_cli(capsys, "generate", out_dir, "--prompt", "the ", "--max_new_tokens", "5", "--dtype",
                             "bfloat16", "--device", "cpu")
    assert code == 0 and out.startswith("the "), err

    # the existing run is never overwritten
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out_dir.rglob("*") if p.is_file()}
    code, out, err = run_cli(capsys, "train", corpus, "--tokenizer", "char", "--out", out_dir, "-q", *TINY)
    assert code == 2 and one_error_line(err).endswith(f"already holds a run; choose another train.out_dir (--out), "
                                                      f"remove it, or continue it with txl train --resume {out_dir}")
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out_dir.rglob("*") if p.is_file()}
    assert after == before

    # a broken (NaN) model, and a checkpoint that lost its run.json
    import shutil

    from safetensors.torch import load_file, save_file
    broken = tmp_path / "broken"
    shutil.copytree(out_dir / "best", broken)
    tensors = load_file(broken / "model.safetensors")
    save_file({k: v * float("nan") for k, v in tensors.items()}, broken / "model.safetensors")
    code, out, err = run_cli(capsys, "generate", broken, "--prompt", "the ", "-n", "5")
    assert code == 2 and "model.safetensors does not match its checksum" in one_error_line(err)
    (broken / "checksums.json").unlink()  # a hand-made folder (no checksums, no state) is loaded unverified
    (broken / "state.json").unlink()
    for command in ("generate", "eval", "score"):  # refused at load, naming the broken tensor and file
        extra = ("--prompt", "the ", "-n", "5") if command == "generate" else (
            ("--max-tokens", "50") if command == "eval" else (str(broken / "run.json"),))
        code, out, err = run_cli(capsys, command, broken, *extra)
        assert code == 2 and "model.safetensors are broken" in one_error_line(err) and "NaN" in err
    save_file(tensors, broken / "model.safetensors")  # intact weights again, but no run.json
    (broken / "run.json").unlink()
    code, out, err = run_cli(capsys, "eval", broken)
    assert code == 2 and "--data" in one_error_line(err)

    # a prompt character the char vocabulary has never seen
    code, out, err = run_cli(capsys, "generate", out_dir, "--prompt", "ZZZ", "-n", "3")
    assert code == 2 and "Z" in one_error_line(err)


@pytest.mark.parametrize("make_args,expect", [
    (lambda d, c: ["train", d / "missing.txt"], "does not exist"),
    (lambda d, c: ["train", (d / "empty.txt")], "empty"),
    (lambda d, c: ["train", c, "model.n_layer=0"], "n_layer must be >= 1"),
    (lambda d, c: ["train", c, "model.n_layers=2"], "unknown key"),
    (lambda d, c: ["train", c, "nonsense=2"], "unknown config key"),
    (lambda d, c: ["train", c, "train.lr=fast"], "must be a number"),
    (lambda d, c: ["train", c, "--config", d / "bad.toml"], "not valid TOML"),
    (lambda d, c: ["train", c, "--config", d / "unknown.toml"], "unknown key"),
    (lambda d, c: ["train", d / "short.txt", "--tokenizer", "char"], "fewer than batch_size"),
    (lambda d, c: ["train", d / "binary.bin", "--tokenizer", "char"], "not UTF-8"),
    (lambda d, c: ["train", c, "data.split=[1.0, 0.0, 0.0]"], "valid split is empty"),
    (lambda d, c: ["train", c, "data.split=[0.9, 0.1, 0.0]", "eval.split=test"], "test split is empty"),
    (lambda d, c: ["train", c, "eval.warmup=true", "eval.mem_len=100000"], "eval.warmup needs"),
    (lambda d, c: ["train", c, "--out", c], "is a file"),
    (lambda d, c: ["train", c, "--tokenzier", "char"], "unrecognized arguments: --tokenzier"),
    (lambda d, c: ["eval", d, "--split", "train"], "invalid choice"),
    (lambda d, c: ["eval", d], "not a txl checkpoint"),
    (lambda d, c: ["eval", d / "nothing-here"], "does not exist"),
    (lambda d, c: ["generate", d], "not a txl checkpoint"),
    (lambda d, c: ["train", c, "train.seed=-1"], "train.seed must be in"),
    (lambda d, c: ["train", c, "train.lr=inf"], "train.lr must be a finite number, got inf"),
    (lambda d, c: ["train", c, "--config", d], "is not a file"),
    (lambda d, c: ["generate", d, "--temperature", "nan"], "argument --temperature/-t: must be a finite number, got 'nan'"),
    (lambda d, c: ["generate", d, "--seed", "99999999999999999999"], "--seed must be in"),
    (lambda d, c: ["generate", d, "--prompt", "a", "--prompt-file", c], "not both"),
])
def test_bad_input_gives_one_clear_line(tmp_path, corpus, capsys, monkeypatch, make_args, expect):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("just a few characters\n" * 10)  # valid split fine, train < one segment
    (tmp_path / "binary.bin").write_bytes(b"abc\xff\xfe\x00def" * 10)
    (tmp_path / "bad.toml").write_text("[model\nn_layer = 2\n")
    (tmp_path / "unknown.toml").write_text("[model]\nn_layers = 2\n")
    code, out, err = run_cli(capsys, *make_args(tmp_path, corpus))
    assert code == 2
    assert expect in one_error_line(err)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*"))  # nothing left behind


def test_console_script_reports_without_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-m", "txl", "train", str(tmp_path / "nope.txt")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("txl: error: corpus path") and "Traceback" not in proc.stderr
