"""`--log tensorboard`: the metric rows as TensorBoard scalars, read back with TensorBoard's own reader."""

from __future__ import annotations

import csv
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # a test dependency

from conftest import run_cli

from txl.errors import TxlError

TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "train.batch_size=4", "train.max_steps=6", "train.eval_interval=3",
        "train.log_interval=1", "train.sample_tokens=0", "train.warmup_steps=1", "eval.max_tokens=200"]


def scalars(folder) -> dict[str, dict[int, float]]:
    """Every scalar of the event files in ``folder``: ``{tag: {step: value}}`` (a purged step's old value gone)."""
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_every_metric_row_is_a_scalar_at_its_step(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200, encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", corpus, "--tokenizer", "byte", "--out", out, "--log", "tensorboard",
                           f"data.cache_dir={tmp_path / 'cache'}", *TINY)
    assert code == 0, err
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    found = scalars(out / "tensorboard")
    assert sorted(int(r["step"]) for r in rows) == sorted(found["train/loss"]) == [1, 2, 3, 4, 5, 6]
    for row in rows:
        step = int(row["step"])
        assert found["train/loss"][step] == pytest.approx(float(row["train_loss"]), rel=1e-6)
        assert found["train/bpb"][step] == pytest.approx(float(row["train_metric"]), rel=1e-6)
        assert found["train/lr"][step] == pytest.approx(float(row["lr"]), rel=1e-6)
        if row["val_loss"]:
            assert found["valid/bpb"][step] == pytest.approx(float(row["val_metric"]), rel=1e-6)
    assert sorted(found["valid/loss"]) == [3, 6]


def test_a_resumed_log_drops_the_events_after_its_checkpoint(tmp_path):
    from txl.training.runlog import TENSORBOARD_DIR, MetricsLog

    def row(step, loss):
        return {"step": step, "train_loss": loss, "train_metric": loss * 2, "lr": 1e-3, "unit": "bpb"}

    log = MetricsLog(tmp_path, 0, ["tensorboard"])
    for step in range(1, 5):
        log.write(row(step, float(step)))
    log.close()
    log = MetricsLog(tmp_path, 2, ["tensorboard"])  # resumed from step 2: steps 3, 4 are written again
    for step in (3, 4):
        log.write(row(step, 10.0 * step))
    log.close()
    assert scalars(tmp_path / TENSORBOARD_DIR)["train/loss"] == {1: 1.0, 2: 2.0, 3: 30.0, 4: 40.0}
    with open(tmp_path / "metrics.csv", newline="") as f:
        assert [float(r["train_loss"]) for r in csv.DictReader(f)] == [1.0, 2.0, 30.0, 40.0]


def test_an_unknown_or_missing_logger_is_one_line(tmp_path, capsys, monkeypatch):
    from txl.config import TrainConfig

    with pytest.raises(TxlError, match=r"train.log takes each of tensorboard at most once, got \['wandb'\]"):
        TrainConfig(log=["wandb"]).check()
    code, _, err = run_cli(capsys, "train", "--log", "wandb", "--out", tmp_path / "r")
    assert code == 2 and "invalid choice: 'wandb'" in err
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # not installed
    code, _, err = run_cli(capsys, "train", "--log", "tensorboard", "--out", tmp_path / "r")
    assert code == 2 and "pip install -e '.[log]'" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()
