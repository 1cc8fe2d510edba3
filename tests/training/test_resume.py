"""Exact resume: a run that crashed and was resumed from last/ ends exactly like one that never stopped."""

import csv
import json

import pytest
from safetensors.torch import load_file

import txl.training.loop as loop
from txl.cli import main
from txl.config import RunConfig, load_run_config
from txl.errors import TxlError
from txl.training.loop import train

ARGS = ["model.n_layer=2", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "model.dropout=0.1", "model.dropatt=0.1", "train.batch_size=4",
        "train.max_steps=40", "train.eval_interval=10", "train.log_interval=1", "train.sample_tokens=0",
        "train.warmup_steps=5", "train.tgt_len_schedule=[[0, 6], [15, 8]]", "train.varlen=true"]


def losses(run_dir):
    rows = csv.DictReader(open(run_dir / "metrics.csv"))
    return {int(r["step"]): r["train_loss"] for r in rows if r["train_loss"]}


def make_run(tmp_path, name, corpus):
    return load_run_config(None, [f"data.path={corpus}", "data.tokenizer=char", f"data.cache_dir={tmp_path / 'c'}",
                                  f"train.out_dir={tmp_path / name}", *ARGS])


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps.\n" for i in range(400)))
    return path


def test_crash_then_resume_equals_uninterrupted_run(tmp_path, corpus, monkeypatch, capsys):
    train(make_run(tmp_path, "straight", corpus), progress=False, log=lambda m: None)

    real_lr = loop.learning_rate

    def crash_at_26(step, **kw):  # a crash in step 26: last/ holds step 20
        if step == 26:
            raise RuntimeError("simulated crash")
        return real_lr(step, **kw)

    monkeypatch.setattr(loop, "learning_rate", crash_at_26)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_run(tmp_path, "crashed", corpus), progress=False, log=lambda m: None)
    monkeypatch.setattr(loop, "learning_rate", real_lr)
    assert json.loads((tmp_path / "crashed" / "last" / "trainer.json").read_text())["step"] == 20

    assert main(["train", "--resume", str(tmp_path / "crashed"), "-q"]) == 0
    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "crashed")
    assert sorted(resumed) == list(range(1, 41))  # rows after the checkpoint were redone, not duplicated
    diff = {s: (straight[s], resumed[s]) for s in range(21, 41) if resumed[s] != straight[s]}
    assert not diff, diff
    a = load_file(tmp_path / "straight" / "last" / "model.safetensors")
    b = load_file(tmp_path / "crashed" / "last" / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_resume_refuses_a_changed_model_or_vocabulary(tmp_path, corpus, capsys):
    run = make_run(tmp_path, "short", corpus)
    run.train.max_steps = 10
    train(run, progress=False, log=lambda m: None)
    before = sorted((p.name, p.read_bytes()) for p in (tmp_path / "short").rglob("*") if p.is_file())
    for change, expect in (("model.d_model=24", "model shapes cannot change"),
                           ("data.tokenizer=byte", "different vocabulary"),
                           ("train.batch_size=8", "batch size cannot change")):
        capsys.readouterr()
        assert main(["train", "--resume", str(tmp_path / "short"), "-q", "--allow-config-change", change]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert expect in err[-1] and err[-1].startswith("txl: error:")
    assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "short").rglob("*") if p.is_file()) == before


def test_resume_refusals(tmp_path, corpus, capsys):
    with pytest.raises(TxlError, match="no resumable checkpoint"):
        train(make_run(tmp_path, "nothing", corpus), progress=False, resume=True)
    assert main(["train", "--resume", str(tmp_path), "model.n_layer=3"]) == 2
    assert "--allow-config-change" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert isinstance(RunConfig(), RunConfig)


def test_sigint_stops_after_the_step_and_resumes_exactly(tmp_path, corpus):
    import os
    import signal

    train(make_run(tmp_path, "straight", corpus), progress=False, log=lambda m: None)
    real_lr = loop.learning_rate

    def interrupt_in_13(step, **kw):  # Ctrl-C arrives in the middle of step 13
        if step == 13:
            os.kill(os.getpid(), signal.SIGINT)
        return real_lr(step, **kw)

    loop.learning_rate = interrupt_in_13
    try:
        with pytest.raises(KeyboardInterrupt):
            train(make_run(tmp_path, "stopped", corpus), progress=False, log=lambda m: None)
    finally:
        loop.learning_rate = real_lr
    state = json.loads((tmp_path / "stopped" / "last" / "state.json").read_text())
    assert state["step"] == 13 and state["interrupted"] is True  # step 13 finished, then it stopped
    train(RunConfig.from_dict(json.loads((tmp_path / "stopped" / "run.json").read_text())), progress=False,
          log=lambda m: None, resume=True)
    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "stopped")
    assert all(resumed[s] == straight[s] for s in range(14, 41))
    a = load_file(tmp_path / "straight" / "last" / "model.safetensors")
    b = load_file(tmp_path / "stopped" / "last" / "model.safetensors")
    assert all(a[k].equal(b[k]) for k in a)


def test_non_finite_losses_are_skipped_then_stop_the_run(tmp_path, corpus):
    from txl.model import TransformerXLLM

    real_forward = TransformerXLLM.forward
    calls = {"n": 0, "bad": set()}

    def forward(self, *args, **kwargs):
        out = real_forward(self, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] in calls["bad"]:
                out.token_loss = out.token_loss * float("nan")
        return out

    TransformerXLLM.forward = forward
    try:
        calls["bad"] = {5, 6, 7}  # three bad steps: skipped, the run goes on
        run = make_run(tmp_path, "skips", corpus)
        run.train.max_bad_steps = 4
        train(run, progress=False, log=lambda m: None)
        state = json.loads((tmp_path / "skips" / "last" / "state.json").read_text())
        assert state["skipped_steps"] == 3
        weights = load_file(tmp_path / "skips" / "last" / "model.safetensors")
        assert all(w.isfinite().all() for w in weights.values())

        calls["n"], calls["bad"] = 0, set(range(12, 100))  # from step 12 on: four in a row stop it
        run = make_run(tmp_path, "stops", corpus)
        run.train.max_bad_steps = 4
        with pytest.raises(TxlError, match="not finite for 4 steps in a row"):
            train(run, progress=False, log=lambda m: None)
        assert (tmp_path / "stops" / "last").is_dir()  # the checkpoint from step 10 is kept
    finally:
        TransformerXLLM.forward = real_forward


def test_resume_with_allowed_config_change_trains_longer(tmp_path, corpus, capsys):
    train(make_run(tmp_path, "short", corpus), progress=False, log=lambda m: None)
    assert main(["train", "--resume", str(tmp_path / "short"), "-q", "train.max_steps=50"]) == 2  # refused
    assert main(["train", "--resume", str(tmp_path / "short"), "-q", "--allow-config-change",
                 "train.max_steps=50"]) == 0
    assert max(losses(tmp_path / "short")) == 50


def test_checkpoint_files_agree_on_the_schedule_span(tmp_path, corpus):
    from txl.training.checkpoint import load_checkpoint

    args = [a for a in ARGS if not a.startswith(("train.max_steps", "train.tgt_len_schedule", "train.eval_interval"))]
    run = load_run_config(None, [f"data.path={corpus}", "data.tokenizer=char", f"data.cache_dir={tmp_path / 'c'}",
                                 f"train.out_dir={tmp_path / 'sched'}", *args, "train.max_steps=6",
                                 "train.eval_interval=3", "train.tgt_len_schedule=[[0, 6, 5]]"])
    train(run, progress=False, log=lambda m: None)
    for name in ("best", "last"):
        folder = tmp_path / "sched" / name
        config = json.loads((folder / "config.json").read_text())
        model_section = json.loads((folder / "run.json").read_text())["model"]
        assert (config["tgt_len"], config["mem_len"]) == (model_section["tgt_len"], model_section["mem_len"]) == (6, 5)
        loaded = load_checkpoint(folder).model.config
        assert (loaded.tgt_len, loaded.mem_len) == (6, 5)


# --- an accepted config change is the run's config from then on; "already complete" without best/ ----------------

QUICK = [a for a in ARGS if not a.startswith(("train.max_steps", "train.eval_interval", "train.tgt_len_schedule",
                                              "train.varlen"))]


def stop_during(monkeypatch, steps):
    """SIGINT (as SIGTERM would) arrives during each step of ``steps``: the loop finishes it, writes last/, stops."""
    import os
    import signal

    real_lr = loop.learning_rate

    def learning_rate(step, **kw):
        if step in steps:
            os.kill(os.getpid(), signal.SIGINT)
        return real_lr(step, **kw)

    monkeypatch.setattr(loop, "learning_rate", learning_rate)


def lr_column(run_dir):
    return {int(r["step"]): float(r["lr"]) for r in csv.DictReader(open(run_dir / "metrics.csv")) if r["lr"]}


def test_an_allowed_config_change_holds_at_the_next_plain_resume(tmp_path, corpus, capsys, monkeypatch):
    """The report: lr 3e-3, resumed with lr 1e-4 (accepted), then a plain --resume went back to 3e-3."""
    run = tmp_path / "r9"
    stop_during(monkeypatch, {3, 6, 8})
    assert main(["train", str(corpus), "--tokenizer", "char", "--out", str(run), "-q",
                 f"data.cache_dir={tmp_path / 'c'}", *QUICK, "train.max_steps=100000", "train.eval_interval=1000",
                 "train.lr=3e-3"]) == 130
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "-q", "--allow-config-change", "train.lr=1e-4",
                 "train.min_lr=1e-4"]) == 130
    err = capsys.readouterr().err
    assert (f"the run's config from now on (written to {run / 'run.json'}): train.lr 0.003 -> 0.0001, "
            "train.min_lr 0.0002 -> 0.0001\n") in err
    saved = json.loads((run / "run.json").read_text())
    assert (saved["train"]["lr"], saved["train"]["min_lr"], saved["train"]["out_dir"]) == (1e-4, 1e-4, str(run))
    assert main(["train", "--resume", str(run), "-q"]) == 130  # plain: the changed config holds
    assert "the run's config from now on" not in capsys.readouterr().err  # nothing changed this time
    lrs = lr_column(run)
    assert sorted(lrs) == list(range(1, 9))
    assert lrs[3] == pytest.approx(3e-3 * 3 / 5) and lrs[7] == lrs[8] == 1e-4
    assert json.loads((run / "last" / "run.json").read_text())["train"]["lr"] == 1e-4


def test_already_complete_without_best_uses_last_and_holds_at_the_next_resume(tmp_path, corpus, capsys, monkeypatch):
    """The report: stopped at step 3 before its first validation (no best/), then resumed with a max_steps it
    had passed: "best does not exist". The sibling: the lowered train.max_steps holds at the next plain resume."""
    run = tmp_path / "r10"
    stop_during(monkeypatch, {3})
    assert main(["train", str(corpus), "--tokenizer", "char", "--out", str(run), "-q",
                 f"data.cache_dir={tmp_path / 'c'}", *QUICK, "train.max_steps=145", "train.eval_interval=1000"]) == 130
    assert not (run / "best").exists()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "-q", "--allow-config-change", "train.max_steps=2"]) == 0
    out, err = capsys.readouterr()
    assert "error" not in err
    lines = out.splitlines()
    assert lines[0] == f"{run} is already complete at step 3 (train.max_steps=2); nothing was trained"
    assert lines[1].startswith("final, last/ on the whole valid split ") and lines[2] == f"checkpoint: {run / 'last'}"
    assert main(["train", "--resume", str(run), "-q"]) == 0  # the plain resume trains nothing either
    assert capsys.readouterr().out.startswith(f"{run} is already complete at step 3 (train.max_steps=2); nothing to "
                                              "train.")
    assert json.loads((run / "last" / "state.json").read_text())["step"] == 3 and max(lr_column(run)) == 3


def test_finetune_resume_keeps_an_accepted_change_too(tmp_path, capsys, monkeypatch):
    """Sibling: txl finetune --resume (the same loop, its own CLI check) with a lowered train.max_steps."""
    from test_run_folders import make_lm, write_pairs

    lm, pairs, run = make_lm(tmp_path / "lm"), write_pairs(tmp_path / "pairs.jsonl", n=12), tmp_path / "ft"
    stop_during(monkeypatch, {2})
    assert main(["finetune", "--init", str(lm), "--data", str(pairs), "--out", str(run), "-q", "train.max_steps=50",
                 "train.eval_interval=100", "train.sample_tokens=0", "--batch-size", "2"]) == 130
    capsys.readouterr()
    assert main(["finetune", "--resume", str(run), "-q", "--allow-config-change", "train.max_steps=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{run} is already complete at step 2 (train.max_steps=1); nothing was trained\n"
                          "final, last/ on the whole valid split")
    assert json.loads((run / "run.json").read_text())["train"]["max_steps"] == 1
    assert main(["finetune", "--resume", str(run), "-q"]) == 0
    assert capsys.readouterr().out.startswith(f"{run} is already complete at step 2 (train.max_steps=1); nothing to "
                                              "train.")
    assert json.loads((run / "last" / "state.json").read_text())["step"] == 2


def test_sigterm_outside_the_steps_ends_train_as_ctrl_c_does(tmp_path, corpus, monkeypatch, capsys):
    """SIGTERM while txl train loads or runs its final evaluation (outside the loop's own handler): one line
    and exit status 130, not death by the signal; the previous SIGTERM handler is given back."""
    import os
    import signal
    import time

    from txl.training import loop as training_loop

    def terminated(*args, **kwargs):  # the signal arrives while the command works outside the steps
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(training_loop, "train", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["train", str(corpus), "--tokenizer", "char", "--out", str(tmp_path / "r"), "-q"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "txl: interrupted"
    assert signal.getsignal(signal.SIGTERM) is before
