"""Checkpoints survive crashes: checksums, keep-last-N rotation, fallback, SIGKILL, a full disk."""

import csv
import json
import resource
import signal
import subprocess
import sys
import time

import pytest

from txl.cli import main
from txl.errors import TxlError
from txl.training.checkpoint import load_checkpoint
from txl.training.checkpoint_files import verify_checkpoint

TINY = ["model.n_layer=2", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "model.dropout=0.1", "train.batch_size=4", "train.log_interval=1",
        "train.sample_tokens=0", "train.warmup_steps=3", "train.deterministic=true"]


def cli_args(tmp_path, corpus, name, *extra):
    return ["train", str(corpus), "--tokenizer", "char", "--out", str(tmp_path / name), "-q",
            f"data.cache_dir={tmp_path / 'cache'}", *TINY, *extra]


def losses(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return {int(r["step"]): r["train_loss"] for r in csv.DictReader(f) if r["train_loss"]}


def step_of(folder):
    return json.loads((folder / "state.json").read_text())["step"]


def test_rotation_keeps_the_last_n_and_a_corrupt_newest_falls_back(tmp_path, corpus, capsys):
    extra = ["train.max_steps=20", "train.eval_interval=10", "train.save_interval=5", "train.keep_last=3"]
    assert main(cli_args(tmp_path, corpus, "run", *extra)) == 0
    run = tmp_path / "run"
    straight = losses(run)
    assert sorted(p.name for p in run.glob("last*")) == ["last", "last.10", "last.15"]  # older ones named by step
    assert [step_of(run / n) for n in ("last", "last.15", "last.10")] == [20, 15, 10]
    assert not list(run.glob("*.tmp"))
    assert all(verify_checkpoint(run / n) for n in ("best", "last", "last.15", "last.10"))

    # a torn write of the newest checkpoint: detected, and resume falls back to the one before
    weights = run / "last" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(TxlError, match="last is corrupt: model.safetensors does not match its checksum"):
        load_checkpoint(run / "last")
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "-q"]) == 0
    err = capsys.readouterr().err
    assert "warning: checkpoint" in err and "using" in err and "last.15" in err and "after step 15" in err
    assert losses(run) == straight  # steps 16-20 redone from the fallback, identically
    # the corrupt one was set aside, so the good ones were not rotated out by the new save
    assert sorted(p.name for p in run.glob("last*")) == ["last", "last.10", "last.15", "last.corrupt"]
    assert step_of(run / "last") == 20 and verify_checkpoint(run / "last.15")


def test_a_replaced_vocabulary_is_refused(tmp_path, corpus, capsys):
    assert main(cli_args(tmp_path, corpus, "run", "train.max_steps=2", "train.eval_interval=2")) == 0
    vocab = tmp_path / "run" / "best" / "vocab.json"
    data = json.loads(vocab.read_text())
    key = next(k for k, v in data.items() if isinstance(v, list) and len(v) > 2)
    data[key][0], data[key][1] = data[key][1], data[key][0]  # same size, different mapping
    vocab.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run" / "best")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "vocab.json does not match its checksum" in err


def run_txl(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "txl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def test_sigkill_after_step_25_then_resume_equals_the_uninterrupted_run(tmp_path, corpus):
    extra = ["train.max_steps=40", "train.eval_interval=40", "train.save_interval=10", "model.d_model=48",
             "model.d_inner=96", "model.tgt_len=24", "model.mem_len=24", "train.batch_size=8"]
    straight = run_txl(cli_args(tmp_path, corpus, "straight", *extra))
    victim = run_txl(cli_args(tmp_path, corpus, "killed", *extra))
    metrics, killed_at = tmp_path / "killed" / "metrics.csv", None
    deadline = time.monotonic() + 300
    while killed_at is None and time.monotonic() < deadline and victim.poll() is None:
        done = losses(tmp_path / "killed") if metrics.is_file() else {}
        if done and max(done) >= 25:
            victim.send_signal(signal.SIGKILL)
            killed_at = max(done)
        time.sleep(0.002)
    victim.wait()
    assert killed_at is not None and victim.returncode == -signal.SIGKILL
    assert straight.wait() == 0, straight.stderr.read()
    # the newest checkpoint at the kill: rows are written before their step's checkpoint, so row 30 may
    # be seen before checkpoint 30 exists, and the run may have finished step 30 after row 29 was seen
    expected_start = {(killed_at - 1) // 10 * 10, killed_at // 10 * 10, (killed_at + 1) // 10 * 10}
    resumed = run_txl(["train", "--resume", str(tmp_path / "killed"), "-q"])
    _, err = resumed.communicate()
    assert resumed.returncode == 0, err
    assert any(f"after step {start} " in err for start in expected_start), err
    a, b = losses(tmp_path / "straight"), losses(tmp_path / "killed")
    assert sorted(b) == list(range(1, 41))
    assert {s: b[s] for s in range(31, 41)} == {s: a[s] for s in range(31, 41)}


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, corpus):
    assert main(cli_args(tmp_path, corpus, "run", "train.max_steps=10", "train.eval_interval=10")) == 0
    run = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in (run / "last").iterdir()}
    limit = (run / "last" / "model.safetensors").stat().st_size + 4096  # optimizer state is larger than this

    def small_files():  # every file larger than `limit` fails to write (EFBIG), like a disk that filled up
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = run_txl(["train", "--resume", str(run), "-q", "--allow-config-change", "train.max_steps=20"],
                   preexec_fn=small_files)
    _, err = proc.communicate()
    assert proc.returncode == 2
    lines = [line for line in err.splitlines() if line.startswith("txl:")]
    assert len(lines) == 1 and "could not write checkpoint" in lines[0] and "previous checkpoints are intact" in lines[0]
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (run / "last").iterdir()} == before
    assert not list(run.glob("*.tmp")) and verify_checkpoint(run / "last")
    proc = run_txl(["train", "--resume", str(run), "-q", "--allow-config-change", "train.max_steps=20"])
    assert proc.wait() == 0 and step_of(run / "last") == 20


def test_each_checkpoint_scans_its_weights_once(tmp_path, corpus, monkeypatch):
    import txl.training.checkpoint as checkpoint
    import txl.training.loop as loop

    scans, saves = [], []
    real_scan, real_save = checkpoint.nonfinite_weights, checkpoint.save_checkpoint

    def scan(model):
        scans.append(1)
        return real_scan(model)

    def save(directory, *args, **kwargs):
        saves.append(directory.name)
        return real_save(directory, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "nonfinite_weights", scan)
    monkeypatch.setattr(loop, "nonfinite_weights", scan, raising=False)  # the loop once scanned them as well
    monkeypatch.setattr(loop, "save_checkpoint", save)
    assert main(cli_args(tmp_path, corpus, "run", "train.max_steps=4", "train.eval_interval=2")) == 0
    assert saves[-1] == "last" and saves.count("last") == 2 and "best" in saves
    assert len(scans) == len(saves)  # save_checkpoint's own guard, once per checkpoint written
