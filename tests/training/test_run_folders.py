"""Training run folders (issue 23, items 6, 7, 8, 10, 23): a new run never writes over files txl did not
write, no metrics row is lost to a kill, resuming on other data is refused, non-finite weights are
never saved, and each validation line says what it measured."""

import csv
import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import txl.training.loop as loop
from conftest import one_error_line, run_cli, tiny_model
from txl.data import ByteTokenizer
from txl.errors import TxlError
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.training.checkpoint import save_checkpoint
from txl.config import RunConfig
from txl.training.loop import finetune

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["model.n_layer=2", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "train.batch_size=4", "train.log_interval=1", "train.sample_tokens=0",
        "train.warmup_steps=2", "model.dropout=0.1"]
WALL_CLOCK = ("elapsed_s", "tokens_per_s")  # metrics.csv columns that depend on the machine's speed


def train_args(tmp_path, corpus, name, *extra):
    return ["train", corpus, "--tokenizer", "char", "--out", tmp_path / name, "-q",
            f"data.cache_dir={tmp_path / 'cache'}", *TINY, *extra]


def tree(folder: Path) -> dict:
    """Every file under ``folder`` with its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in csv.DictReader(f)]


def state(folder: Path) -> dict:
    return json.loads((folder / "state.json").read_text())


def make_lm(folder: Path) -> Path:
    """A byte-level language-model checkpoint to fine-tune (seeded, untrained)."""
    torch.manual_seed(0)
    config = TransformerXLConfig(vocab_size=256, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=8,
                                 mem_len=8, dropout=0.0, dropatt=0.0)
    save_checkpoint(folder, TransformerXLLM(config), ByteTokenizer(), RunConfig(model=config), {"step": 0})
    return folder


def write_pairs(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` prompt/completion pairs of ASCII words (another ``seed``, other pairs)."""
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega"]
    g = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for _ in range(n):
            doc = " ".join(words[int(i)] for i in torch.randint(0, 6, (int(torch.randint(3, 12, (), generator=g)),),
                                                                 generator=g))
            f.write(json.dumps({"prompt": doc, "completion": f"{doc.split()[0]} and {doc.split()[-1]}"}) + "\n")
    return path


def txl_line(err: str) -> str:
    """The one ``txl:`` line of ``err`` (the run's progress lines before it aside)."""
    return one_error_line("\n".join(x for x in err.splitlines() if x.startswith("txl:") or "Traceback" in x))


def user_folder(path: Path) -> dict:
    """The folder of the report: not a txl run, but holding best/, last/ and metrics.csv of another program."""
    (path / "best").mkdir(parents=True)
    (path / "last").mkdir()
    (path / "best" / "notes.txt").write_text("my notes\n")
    (path / "last" / "data.txt").write_text("my data\n")
    (path / "metrics.csv").write_text("epoch,accuracy\n1,0.5\n")
    return tree(path)


# --- item 6: a new run needs a new or empty folder; rotation never deletes what txl did not write -------------------

def test_train_refuses_a_folder_of_other_files_and_changes_nothing(tmp_path, corpus, capsys):
    before = user_folder(tmp_path / "d")
    code, out, err = run_cli(capsys, *train_args(tmp_path, corpus, "d", "train.max_steps=2"))
    assert code == 2
    assert one_error_line(err) == (f"txl: error: {tmp_path / 'd'} is not empty (best/, last/, metrics.csv) and is not "
                                   "a txl run; a new run needs a new or empty folder, and txl never overwrites files "
                                   "it did not write: choose another train.out_dir (--out)")
    assert tree(tmp_path / "d") == before
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["best", "last", "metrics.csv"]
    # an empty folder is fine, and so is the run then: it is a txl run
    (tmp_path / "e").mkdir()
    assert run_cli(capsys, *train_args(tmp_path, corpus, "e", "train.max_steps=2"))[0] == 0
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["best", "last", "metrics.csv", "run.json"]


def test_finetune_refuses_a_folder_of_other_files(tmp_path, capsys):
    lm = make_lm(tmp_path / "lm")
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=8)
    before = user_folder(tmp_path / "d")
    code, out, err = run_cli(capsys, "finetune", "--init", lm, "--data", pairs, "--out", tmp_path / "d", "-q",
                             "train.max_steps=1")
    assert code == 2 and "is not empty (best/, last/, metrics.csv) and is not a txl run" in one_error_line(err)
    assert tree(tmp_path / "d") == before


def test_rotation_refuses_to_replace_a_folder_txl_did_not_write(tmp_path, corpus, capsys):
    assert run_cli(capsys, *train_args(tmp_path, corpus, "run", "train.max_steps=4", "train.eval_interval=2"))[0] == 0
    run = tmp_path / "run"
    (run / "best" / "notes.txt").write_text("mine\n")  # a user's file inside a checkpoint txl would replace
    before = tree(run)
    code, out, err = run_cli(capsys, "train", "--resume", run, "-q", "--allow-config-change", "train.max_steps=6")
    assert code == 2
    assert one_error_line(err) == (f"txl: error: {run / 'best'} is not a txl checkpoint (notes.txt); txl never deletes "
                                   f"or replaces what it did not write: move it out of {run}, then start again "
                                   "(or --resume)")
    assert tree(run) == before

    # the sibling: an older last.<step>/ that rotation would delete, holding a folder of the user's
    (run / "best" / "notes.txt").unlink()
    (run / "last.2" / "photos").mkdir()
    (run / "last.2" / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    code, out, err = run_cli(capsys, "train", "--resume", run, "-q", "--allow-config-change", "train.max_steps=6")
    assert code == 2 and f"{run / 'last.2'} is not a txl checkpoint (photos/)" in one_error_line(err)
    assert (run / "last.2" / "photos" / "a.jpg").read_bytes() == b"\xff\xd8" and state(run / "last")["step"] == 4


def test_save_checkpoint_never_deletes_foreign_scratch_folders(tmp_path):
    model = tiny_model(dtype=torch.float32)
    (tmp_path / "ckpt.old").mkdir()
    (tmp_path / "ckpt.old" / "thesis.tex").write_text("\\begin{document}")
    with pytest.raises(TxlError, match=r"ckpt\.old is not a txl checkpoint \(thesis\.tex\)"):
        save_checkpoint(tmp_path / "ckpt", model, ByteTokenizer(), RunConfig(model=model.config), {"step": 1})
    assert (tmp_path / "ckpt.old" / "thesis.tex").read_text() == "\\begin{document}"
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "ckpt.tmp").exists()


# --- item 7: a kill between a step's checkpoint and its metrics row loses nothing --------------------------------

class Killed(BaseException):
    """Stands for SIGKILL: no handler of the training loop runs."""


@pytest.mark.parametrize("kill_step, after", [
    (4, True),   # the report: right after the checkpoint of a validation step
    (6, True),   # the same at a train.save_interval step
    (8, False),  # right before a checkpoint: its row is redone, not duplicated
])
def test_a_kill_at_a_checkpoint_keeps_metrics_equal_to_an_uninterrupted_run(tmp_path, corpus, capsys, monkeypatch,
                                                                           kill_step, after):
    extra = ["train.max_steps=8", "train.eval_interval=4", "train.save_interval=3"]
    assert run_cli(capsys, *train_args(tmp_path, corpus, "straight", *extra))[0] == 0
    real = loop.save_checkpoint

    def dies_at_the_checkpoint(directory, model, tokenizer, run, state, **kw):
        kill = Path(directory).name == "last" and state["step"] == kill_step
        if kill and not after:
            raise Killed
        real(directory, model, tokenizer, run, state, **kw)
        if kill:
            raise Killed

    monkeypatch.setattr(loop, "save_checkpoint", dies_at_the_checkpoint)
    with pytest.raises(Killed):
        run_cli(capsys, *train_args(tmp_path, corpus, "killed", *extra))
    monkeypatch.setattr(loop, "save_checkpoint", real)
    resumed_after = kill_step if after else 6
    assert state(tmp_path / "killed" / "last")["step"] == resumed_after
    code, out, err = run_cli(capsys, "train", "--resume", tmp_path / "killed", "-q")
    assert code == 0 and f"resuming {tmp_path / 'killed'} after step {resumed_after} " in err
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "killed")
    assert [int(r["step"]) for r in resumed] == list(range(1, 9))
    assert [r["val_loss"] != "" for r in resumed] == [s in (4, 8) for s in range(1, 9)]
    assert resumed == straight


# --- item 8: resuming on other data --------------------------------------------------------------------------------

def test_resume_on_a_replaced_pairs_file_is_refused_unless_allowed(tmp_path, capsys):
    lm = make_lm(tmp_path / "lm")
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=12)
    old = hashlib.sha256(pairs.read_bytes()).hexdigest()
    run = tmp_path / "run"
    finetune(lm, pairs, out_dir=run, overrides=["train.max_steps=2", "train.eval_interval=2", "train.sample_tokens=0",
                                                "train.batch_size=2"], progress=False, log=lambda m: None)
    assert state(run / "last")["data_fingerprint"] == {"data.path": {"bytes": pairs.stat().st_size, "sha256": old}}
    write_pairs(pairs, n=12, seed=1)  # replaced
    new = hashlib.sha256(pairs.read_bytes()).hexdigest()
    before = tree(run)
    resume = ["finetune", "--resume", run, "-q", "--allow-config-change", "train.max_steps=3"]
    code, out, err = run_cli(capsys, *resume)
    assert code == 2
    line = txl_line(err)
    assert line.startswith(f"txl: error: the data differ from those {run / 'last'} was trained on (data.path: ")
    assert f"sha256 {old[:12]} then, now " in line and f"sha256 {new[:12]})" in line
    assert line.endswith("; resuming would continue on other data: add --allow-data-change to continue on the new "
                         "data, or start a new run")
    assert tree(run) == before

    code, out, err = run_cli(capsys, *resume, "--allow-data-change")
    assert code == 0
    warnings = [x for x in err.splitlines() if x.startswith("txl: warning: the data differ")]
    assert len(warnings) == 1 and warnings[0].endswith("; continuing on the new data (--allow-data-change)")
    assert state(run / "last")["step"] == 3
    assert state(run / "last")["data_fingerprint"]["data.path"]["sha256"] == new


def test_resume_on_a_changed_corpus_is_refused_unless_allowed(tmp_path, corpus, capsys):
    assert run_cli(capsys, *train_args(tmp_path, corpus, "run", "train.max_steps=2", "train.eval_interval=2"))[0] == 0
    run = tmp_path / "run"
    lines = corpus.read_text().splitlines(keepends=True)
    corpus.write_text("".join(lines[1:] + lines[:1]))  # the same characters and size, another order
    before = tree(run)
    resume = ["train", "--resume", run, "-q", "--allow-config-change", "train.max_steps=3"]
    code, out, err = run_cli(capsys, *resume)
    line = txl_line(err)
    change = r"{}: {} tokens, sha256 [0-9a-f]{{12}} then, now {} tokens, sha256 [0-9a-f]{{12}}"
    assert code == 2 and re.fullmatch(
        rf"txl: error: the data differ from those {re.escape(str(run / 'last'))} was trained on \("
        + "; ".join(change.format(part, n, n) for part, n in (("test split", 763), ("train split", "13,733"),
                                                            ("valid split", 763)))
        + r"\); resuming would continue on other data: add --allow-data-change to continue on the new data, or start "
          r"a new run", line), line
    assert tree(run) == before
    code, out, err = run_cli(capsys, *resume, "--allow-data-change")
    assert code == 0 and err.count("txl: warning: the data differ") == 1
    # unchanged data resume silently; the flag needs --resume
    code, out, err = run_cli(capsys, "train", "--resume", run, "-q", "--allow-config-change", "train.max_steps=4")
    assert code == 0 and "warning" not in err
    code, out, err = run_cli(capsys, *train_args(tmp_path, corpus, "new", "--allow-data-change"))
    assert code == 2 and one_error_line(err) == ("txl: error: --allow-data-change applies to --resume only (a new run "
                                                 "records the data it trains on)")
    code, out, err = run_cli(capsys, *train_args(tmp_path, corpus, "new", "--allow-config-change"))
    assert code == 2 and one_error_line(err) == ("txl: error: --allow-config-change applies to --resume only (a new "
                                                 "run takes every KEY=VALUE as given)")
    assert not (tmp_path / "new").exists()


# --- item 10: a non-finite reconstruction term is never applied, non-finite weights never saved --------------------

COMPRESSIVE = ["model.mem_len=4", "model.cmem_len=4", "model.cmem_ratio=2", "model.dropout=0.0"]


def test_an_overflowing_reconstruction_weight_names_itself_and_saves_finite_weights(tmp_path, corpus, capsys):
    args = train_args(tmp_path, corpus, "run", *COMPRESSIVE, "model.recon_loss_weight=1e308", "train.max_steps=6",
                      "train.eval_interval=1", "train.max_bad_steps=2")
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert err.count("step 1: attention-reconstruction term (model.recon_loss_weight 1e+308 × reconstruction loss) "
                     "is not finite, step skipped (1 in a row)") == 1
    assert err.strip().splitlines()[-1] == (
        "txl: error: the attention-reconstruction term (model.recon_loss_weight 1e+308 × reconstruction loss) is not "
        "finite for 2 steps in a row (up to step 2); lower model.recon_loss_weight (default 1.0) and start again (or "
        "--resume with --allow-config-change)")
    run = tmp_path / "run"
    assert state(run / "last")["step"] == 1 and state(run / "last")["skipped_steps"] == 1
    for name in ("best", "last"):
        weights = load_file(run / name / "model.safetensors")
        assert [k for k, w in weights.items() if not w.isfinite().all()] == []
    # the advice works: with a usable weight the run goes on from last/
    code, out, err = run_cli(capsys, "train", "--resume", run, "-q", "--allow-config-change",
                             "model.recon_loss_weight=1.0")
    assert code == 0 and state(run / "last")["step"] == 6


def test_weights_that_turned_nan_are_never_saved(tmp_path, corpus, capsys, monkeypatch):
    real, calls = loop.train_step, {"n": 0}

    def poisons_step_6(model, *args, **kwargs):
        out = real(model, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 6:  # the weights go bad while the loss was finite
            with torch.no_grad():
                model.word_emb.emb_layers[0].weight.fill_(float("nan"))
        return out

    monkeypatch.setattr(loop, "train_step", poisons_step_6)
    code, out, err = run_cli(capsys, *train_args(tmp_path, corpus, "run", "train.max_steps=8", "train.eval_interval=4"))
    run = tmp_path / "run"
    assert code == 2
    assert txl_line(err) == (
        "txl: error: training diverged: after step 8 the weights hold NaN or inf (word_emb.emb_layers.0.weight), "
        "and txl never saves such weights; last/ still holds step 4 (continue from it with --resume "
        "--allow-config-change); lower train.lr or raise train.warmup_steps")
    assert state(run / "last")["step"] == 4 and sorted(p.name for p in run.glob("last*")) == ["last"]
    assert all(w.isfinite().all() for w in load_file(run / "last" / "model.safetensors").values())
    # the same guard in save_checkpoint itself (e.g. txl convert)
    model = tiny_model(dtype=torch.float32)
    with torch.no_grad():
        model.crit.out_layers[0].bias[3] = float("inf")
    with pytest.raises(TxlError, match=r"the weight crit\.out_layers\.0\.bias holds NaN or inf values"):
        save_checkpoint(tmp_path / "ckpt", model, ByteTokenizer(), RunConfig(model=model.config), {})
    assert not (tmp_path / "ckpt").exists()


# --- item 23: each validation number says what it measured -------------------------------------------------------

def test_validation_lines_give_their_tokens_and_span(tmp_path, corpus, capsys):
    code, out, err = run_cli(capsys, *train_args(tmp_path, corpus, "run", "train.max_steps=4", "train.eval_interval=2",
                                                 "train.eval_max_tokens=200", "eval.mem_len=16"))
    assert code == 0
    rows = {int(r["step"]): r for r in metrics(tmp_path / "run")}
    periodic = [x for x in err.splitlines() if x.startswith("step ")]
    assert periodic == [f"step {s}: valid bpc {float(rows[s]['val_metric']):.4f} (200 tokens, tgt_len 8, mem_len 8)"
                        for s in (2, 4)]
    final = next(x for x in out.splitlines() if x.startswith("final"))
    assert re.fullmatch(r"final, best/ on the whole valid split at the \[eval\] span: valid bpc \d\.\d{4} \(loss "
                        r"\d\.\d{4} nats/token over 762 tokens; tgt_len=8, mem_len=16, clamp_len=0, "
                        r"same_length=False, warmup=False\)", final), final

    # siblings: a capped final evaluation says so; fine-tuning counts completion tokens of pairs
    code, out, err = run_cli(capsys, "train", "--resume", tmp_path / "run", "-q", "--allow-config-change",
                             "eval.max_tokens=300", "train.max_steps=5", "train.eval_interval=5")
    assert code == 0 and "final, best/ on the first 300 targets of the valid split (eval.max_tokens) at the [eval] " \
                         "span: valid bpc " in out and "over 300 tokens;" in out


def test_finetune_validation_lines_count_completion_tokens(tmp_path, capsys):
    lm = make_lm(tmp_path / "lm")
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=10)
    code, out, err = run_cli(capsys, "finetune", "--init", lm, "--data", pairs, "--out", tmp_path / "run", "-q",
                             "train.max_steps=2", "train.eval_interval=2", "train.sample_tokens=0", "--batch-size", "2")
    assert code == 0
    valid = [json.loads(x) for x in pairs.read_text().splitlines()][9:]  # data.split 0.9/0.1: the last pair
    tokens = len(valid[0]["completion"].encode()) + 1  # its bytes and the end marker
    assert "step 2: valid bpb " in err and f" ({tokens} completion tokens of 1 pairs, tgt_len 8, mem_len 8)" in err
    assert "final, best/ on the whole valid split at the [eval] span: valid bpb " in out


def test_eval_warns_when_the_run_data_changed_since_training(tmp_path, capsys):
    """The checkpoint's data fingerprint is compared with the split (or pairs file) txl eval reads."""
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    assert run_cli(capsys, *train_args(tmp_path, text, "run", "train.max_steps=2"))[0] == 0
    code, _, err = run_cli(capsys, "eval", tmp_path / "run", "-q")
    assert code == 0 and "warning" not in err
    text.write_text("the quick brown fox jumps over the lazy cat.\n" * 60, encoding="utf-8")  # the same size
    code, _, err = run_cli(capsys, "eval", tmp_path / "run", "-q")
    assert code == 0 and f"txl: warning: the valid split of corpus {text}" in err
    assert "differs from the data" in err and "valid split: 135 tokens, sha256" in err

    pairs = write_pairs(tmp_path / "pairs.jsonl", n=10)
    assert run_cli(capsys, "finetune", "--init", make_lm(tmp_path / "lm"), "--data", pairs, "--out",
                   tmp_path / "ft", "-q", "train.max_steps=1", "train.sample_tokens=0", "--batch-size", "2")[0] == 0
    code, _, err = run_cli(capsys, "eval", tmp_path / "ft", "-q")
    assert code == 0 and "warning" not in err
    write_pairs(pairs, n=10, seed=1)
    code, _, err = run_cli(capsys, "eval", tmp_path / "ft", "-q")
    assert code == 0 and f"txl: warning: the pairs file {pairs} differs from the data" in err


def test_a_kill_while_metrics_csv_is_trimmed_on_resume_keeps_its_rows(tmp_path, monkeypatch):
    """Sibling of the lost row: resuming rewrites metrics.csv without the rows after the checkpoint; a kill
    during that rewrite must leave the old file whole (it is written aside, then renamed)."""
    import csv

    from txl.training import runlog

    path = tmp_path / "metrics.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=runlog.METRIC_FIELDS)
        w.writeheader()
        w.writerows({"step": s, "train_loss": 1.0 / s} for s in range(1, 6))
    before = path.read_bytes()

    def killed(self, rows):
        raise KeyboardInterrupt  # the kill arrives while the kept rows are written

    monkeypatch.setattr(csv.DictWriter, "writerows", killed)
    with pytest.raises(KeyboardInterrupt):
        runlog.open_metrics(path, 3)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]
    monkeypatch.undo()
    f, writer = runlog.open_metrics(path, 3)
    writer.writerow({"step": 4, "train_loss": 0.5})
    f.close()
    assert [r["step"] for r in csv.DictReader(open(path, encoding="utf-8"))] == ["1", "2", "3", "4"]
