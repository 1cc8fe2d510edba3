"""Classification through the shared training loop: exact resume, the run folder, frozen softmax."""

import csv

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_model
from txl.classification import TransformerXLForSequenceClassification
from txl.config import ClassifierConfig
from txl_recipes.classify.train import fit_classifier
from txl.data import ByteTokenizer
from txl.errors import TxlError
from txl.training import loop

pytestmark = pytest.mark.usefixtures("one_thread")


def _lm(tmp_path):
    torch.manual_seed(0)
    tiny_model(dtype=torch.float32, vocab_size=256, tgt_len=6, mem_len=6).save_pretrained(tmp_path / "lm",
                                                                                           ByteTokenizer())
    return tmp_path / "lm"


def _docs(n, seed):
    g = np.random.default_rng(seed)
    docs, labels = [], []
    for i in range(n):
        label = i % 3
        body = g.integers(97, 100, size=int(g.integers(4, 30)))
        docs.append(np.concatenate([body, np.full(3, 65 + label), body[:5]]).astype(np.int64))
        labels.append(label)
    return docs, labels


def _losses(run_dir):
    return {int(r["step"]): r["train_loss"] for r in csv.DictReader(open(run_dir / "metrics.csv")) if r["train_loss"]}


def test_crash_then_resume_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    lm = _lm(tmp_path)
    clf = ClassifierConfig(num_labels=3, labels=["a", "b", "c"], mode="memory", grad_segments=2, classifier_dropout=0.1)
    train, valid = _docs(20, 0), _docs(6, 1)
    kw = dict(steps=8, batch_size=4, lr=3e-3, warmup_steps=2, seed=3, save_interval=4, device="cpu")
    straight = fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "straight", log=lambda m: None, **kw)
    real_lr = loop.learning_rate

    def crash_at_6(step, **k):  # last/ holds step 4
        if step == 6:
            raise RuntimeError("simulated crash")
        return real_lr(step, **k)

    monkeypatch.setattr(loop, "learning_rate", crash_at_6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "crashed", log=lambda m: None, **kw)
    monkeypatch.setattr(loop, "learning_rate", real_lr)
    said = []
    resumed = fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "crashed", resume=True, log=said.append, **kw)
    assert any("after step 4" in line for line in said), said
    a, b = _losses(tmp_path / "straight"), _losses(tmp_path / "crashed")
    assert a == b and sorted(a) == [8]  # (one row per 10 steps, and the last)
    wa = load_file(tmp_path / "straight" / "best" / "model.safetensors")
    wb = load_file(tmp_path / "crashed" / "best" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)
    assert resumed.final_loss == straight.final_loss and resumed.steps == straight.steps == 8
    # the run's checkpoint is a classifier folder; the body's softmax was not trained
    again = TransformerXLForSequenceClassification.from_pretrained(tmp_path / "straight")
    assert again.classifier.labels == ["a", "b", "c"] and again.classifier.grad_segments == 2
    lm_bias = load_file(lm / "model.safetensors")["crit.out_layers.0.bias"]
    assert torch.equal(again.body.crit.out_layers[0].bias.detach(), lm_bias)
    assert straight.documents == 32 and straight.tokens == sum(
        len(train[0][i]) for i in _read_order(train, 8, 4, 3))


def _read_order(train, steps, batch_size, seed):
    n = len(train[0])
    out = []
    for i in range(steps * batch_size):
        out.append(torch.randperm(n, generator=torch.Generator().manual_seed(seed + i // n)).tolist()[i % n])
    return out


def test_a_run_folder_is_refused_when_not_new_and_the_data_when_changed(tmp_path):
    lm = _lm(tmp_path)
    clf = ClassifierConfig(num_labels=3, mode="first")
    train, valid = _docs(9, 0), _docs(3, 1)
    kw = dict(steps=2, batch_size=3, lr=1e-3, device="cpu", log=lambda m: None)
    fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", **kw)
    with pytest.raises(TxlError, match="already holds a run"):
        fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", **kw)
    other = ([d[::-1].copy() for d in train[0]], train[1])
    with pytest.raises(TxlError, match="the data differ"):
        fit_classifier(lm, clf, other, valid, out_dir=tmp_path / "run", resume=True, **kw)
    said = []  # allowed: one warning, and the run (already complete) reports again
    fit_classifier(lm, clf, other, valid, out_dir=tmp_path / "run", resume=True, allow_data_change=True,
                   **{**kw, "log": said.append})
    assert any("continuing on the new data" in line for line in said)
    # txl train / finetune --resume name the command that continues it
    from txl.cli import main

    assert main(["train", "--resume", str(tmp_path / "run"), "-q"]) == 2
    # a language-model run is not continued as a classifier
    import json
    import shutil

    from txl.config import RunConfig

    shutil.copytree(lm, tmp_path / "lmrun" / "last")
    (tmp_path / "lmrun" / "run.json").write_text(json.dumps(RunConfig().to_dict()))
    with pytest.raises(TxlError, match="not a document-classification run"):
        fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "lmrun", resume=True, **kw)


def test_two_gloo_processes_equal_one_process(tmp_path, capsys):
    import json

    from txl.cli import main

    lm = _lm(tmp_path)
    docs, labels = _docs(16, 0)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": bytes(d.tolist()).decode(), "label": "abc"[y]}) + "\n"
                            for d, y in zip(docs, labels)))
    common = ["classify", "train", str(lm), "--data", str(data), "--steps", "4", "--batch-size", "4", "-q",
              "--device", "cpu", "--dropout", "0", "--grad-segments", "2"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    assert main([*common, "--out", str(tmp_path / "two"), "--nproc", "2"]) == 0
    out = capsys.readouterr().out
    a = load_file(tmp_path / "one" / "best" / "model.safetensors")
    b = load_file(tmp_path / "two" / "best" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)  # (float summation order differs)
    one = json.loads((tmp_path / "one" / "heldout.json").read_text())["heldout"]
    two = json.loads((tmp_path / "two" / "heldout.json").read_text())["heldout"]
    assert one["accuracy"] == two["accuracy"] and "held-out: accuracy" in out  # (the ranks print elsewhere)


def test_resume_refuses_other_settings_and_a_classifier_as_the_lm(tmp_path):
    lm = _lm(tmp_path)
    clf = ClassifierConfig(num_labels=3, mode="first")
    train, valid = _docs(9, 0), _docs(3, 1)
    kw = dict(batch_size=3, device="cpu", log=lambda m: None)
    fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", steps=2, lr=1e-3, **kw)
    before = sorted((p.name, p.read_bytes()) for p in (tmp_path / "run").rglob("*") if p.is_file())
    # more steps would let best/ be chosen on the held-out documents; another lr or head is another run
    for change, args in (("train.max_steps 2 -> 4", dict(steps=4, lr=1e-3)), ("train.lr", dict(steps=2, lr=5e-3))):
        with pytest.raises(TxlError, match=change):
            fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", resume=True, **args, **kw)
    with pytest.raises(TxlError, match="classifier.mode 'first' -> 'last'"):
        fit_classifier(lm, ClassifierConfig(num_labels=3, mode="last"), train, valid, out_dir=tmp_path / "run",
                       resume=True, steps=2, lr=1e-3, **kw)
    # a language model of the same shape with other weights is another run, not this one continued
    other = tmp_path / "other-lm"
    tiny_model(1, dtype=torch.float32, vocab_size=256, tgt_len=6, mem_len=6).save_pretrained(other, ByteTokenizer())
    with pytest.raises(TxlError, match=f"started from other language-model weights than {other} "
                                       r"\(language model: \d[\d,]* bytes, sha256 \w{12} then, now"):
        fit_classifier(other, clf, train, valid, out_dir=tmp_path / "run", resume=True, steps=2, lr=1e-3, **kw)
    assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "run").rglob("*") if p.is_file()) == before
    with pytest.raises(TxlError, match="is a document classifier"):
        fit_classifier(tmp_path / "run", clf, train, valid, out_dir=tmp_path / "other", steps=2, lr=1e-3, **kw)
    said = []  # allowed: the training loop says what changed, and the run goes on from its own weights
    fit_classifier(other, clf, train, valid, out_dir=tmp_path / "run", resume=True, steps=2, lr=1e-3,
                   allow_data_change=True, **{**kw, "log": said.append})
    assert any("(language model: " in line and "continuing on the new data" in line for line in said), said
    # a run whose last/ was lost in a crash resumes from its older checkpoint, checked against it
    (tmp_path / "run" / "last").rename(tmp_path / "run" / "last.2")
    assert fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", resume=True, steps=2, lr=1e-3,
                          **kw).steps == 2
    assert not (tmp_path / "run" / "last").exists()  # (the run was complete: nothing written)
    with pytest.raises(TxlError, match="started from other language-model weights"):
        fit_classifier(other, clf, train, valid, out_dir=tmp_path / "run", resume=True, steps=2, lr=1e-3, **kw)


def test_a_run_that_stored_integer_labels_as_text_resumes_with_them(tmp_path):
    import json

    from txl.fileio import sha256_file

    lm = _lm(tmp_path)
    clf = ClassifierConfig(num_labels=3, labels=[0, 1, 2], mode="first")
    train, valid = _docs(9, 0), _docs(3, 1)
    kw = dict(batch_size=3, device="cpu", log=lambda m: None, steps=2, lr=1e-3)
    fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", **kw)
    saved = tmp_path / "run" / "last" / "classifier.json"
    assert json.loads(saved.read_text())["labels"] == [0, 1, 2]
    saved.write_text(saved.read_text().replace('"labels": [\n    0,\n    1,\n    2\n  ]', '"labels": ["0", "1", "2"]'))
    assert json.loads(saved.read_text())["labels"] == ["0", "1", "2"]
    sums = saved.parent / "checksums.json"  # the checkpoint's own record of its files, made anew for the edit
    sums.write_text(json.dumps({**json.loads(sums.read_text()), "classifier.json": sha256_file(saved)}))
    assert fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", resume=True, **kw).steps == 2
    # a run that recorded no language-model weights resumes (there is nothing to compare them with)
    state = saved.parent / "state.json"
    values = json.loads(state.read_text())
    assert values["data_fingerprint"].pop("language model")["sha256"] == sha256_file(lm / "model.safetensors")
    state.write_text(json.dumps(values))
    sums.write_text(json.dumps({**json.loads(sums.read_text()), "state.json": sha256_file(state)}))
    assert fit_classifier(lm, clf, train, valid, out_dir=tmp_path / "run", resume=True, **kw).steps == 2
    with pytest.raises(TxlError, match=r"classifier.labels \['0', '1', '2'\] -> \[0, 1, 3\]"):
        fit_classifier(lm, ClassifierConfig(num_labels=3, labels=[0, 1, 3], mode="first"), train, valid,
                       out_dir=tmp_path / "run", resume=True, **kw)


def test_cli_names_a_label_with_one_document_only(tmp_path, capsys):
    import json

    from txl.cli import main

    lm = _lm(tmp_path)
    rows = [("aaa xyz", "a"), ("aab xyz", "a"), ("bbb xyz", "b"), ("bba xyz", "b"), ("ccc", "c")]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    argv = ["classify", "train", str(lm), "--data", str(data), "--steps", "1", "--batch-size", "2", "-q",
            "--device", "cpu", "--valid-fraction", "0.5"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "label(s) c have one document" in err and " a," not in err and "a have" not in err
    # RUN/last stands for RUN, given with --out RUN too
    assert main([*argv, "--resume", str(tmp_path / "r" / "last"), "--out", str(tmp_path / "r")]) == 0


def test_classify_names_a_used_folder_and_damaged_files_as_the_other_commands_do(tmp_path, capsys):
    import json
    import shutil

    from txl.cli import main
    from txl.training.checkpoint_files import checksums

    lm = _lm(tmp_path)
    (lm / "checksums.json").write_text(json.dumps(checksums(lm)))  # as a training run's checkpoint has
    data = _jsonl_docs(tmp_path, 6)
    argv = ["classify", "train", str(lm), "--data", str(data), "--steps", "1", "--batch-size", "2", "-q",
            "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in (tmp_path / "r").rglob("*"))
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2  # a second start says how to continue the run
    run = tmp_path / "r"
    assert capsys.readouterr().err.strip() == (f"txl: error: --out {run} already holds a run; choose another --out, "
                                               f"or continue it with txl classify train LM --data DATA --resume {run} "
                                               "(the settings it started with)")
    # the other commands name the command that continues each kind of run
    assert main(["finetune", "--init", str(lm), "--data", str(data), "--out", str(run)]) == 2
    assert f"continue it with txl classify train LM --data DATA --resume {run} " in capsys.readouterr().err
    from txl.config import RunConfig

    shutil.copytree(lm, tmp_path / "lmrun" / "last")  # a language-model run, given to --resume: one line, said first
    (tmp_path / "lmrun" / "run.json").write_text(json.dumps(RunConfig().to_dict()))
    assert main([*argv, "--resume", str(tmp_path / "lmrun" / "last")]) == 2
    assert capsys.readouterr().err.strip() == (f"txl: error: {tmp_path / 'lmrun'} is a language-model run, not a "
                                               "document-classification run; continue it with txl train --resume "
                                               f"{tmp_path / 'lmrun'}")
    assert main([*argv, "--out", str(lm)]) == 2  # the language model's own folder: an input, not a run to continue
    assert capsys.readouterr().err.strip() == f"txl: error: --out {lm} is the input folder {lm} or inside it; choose another folder"
    assert sorted(p.name for p in (tmp_path / "r").rglob("*")) == before
    # a true label the classifier does not know is copied to the output, and said once
    (tmp_path / "true.jsonl").write_text('{"text": "abc", "label": "zz"}\n{"text": "abc", "label": "a"}\n')
    assert main(["classify", "predict", str(run), str(tmp_path / "true.jsonl")]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["true_label"] for line in out.splitlines()] == ["zz", "a"]
    assert err.splitlines()[-1] == (f"txl: warning: 1 document (first {tmp_path / 'true.jsonl'}:1: 'zz') gives a true "
                                    "label the classifier does not know; its labels: a, b, c")
    # a damaged header is a checksum failure, for the language model and for the classifier alike
    for folder in (lm, tmp_path / "r" / "best"):
        weights = folder / "model.safetensors"
        shutil.copy(weights, tmp_path / "kept")
        damaged = bytearray(weights.read_bytes())
        damaged[20] ^= 0xFF
        weights.write_bytes(bytes(damaged))
        command = ([*argv, "--out", str(tmp_path / "r2")] if folder == lm
                   else ["classify", "predict", str(run), str(tmp_path / "docs.jsonl")])
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err == f"txl: error: checkpoint {folder} is corrupt: model.safetensors does not match its checksum"
        shutil.copy(tmp_path / "kept", weights)
    (run / "best" / "checksums.json").unlink()  # a run's checkpoint without its checksums: loaded, and said
    assert main(["classify", "predict", str(run), str(tmp_path / "true.jsonl")]) == 0
    assert (f"txl: warning: {run / 'best'} has no checksums.json; its files cannot be verified"
            in capsys.readouterr().err.splitlines())


def _jsonl_docs(tmp_path, n=12):
    import json

    docs, labels = _docs(n, 0)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": bytes(d.tolist()).decode(), "label": "abc"[y]}) + "\n"
                            for d, y in zip(docs, labels)))
    return data


def test_a_config_file_equals_its_flags_and_a_flag_wins_over_it(tmp_path):
    import json

    from txl.cli import main

    lm, data = _lm(tmp_path), _jsonl_docs(tmp_path)
    config = tmp_path / "clf.toml"
    config.write_text('[classify]\nmode = "memory"\npooling = "mean"\ngrad_segments = 2\nsteps = 3\nbatch_size = 4\n'
                      'lr = 1e-3\ndropout = 0\nseed = 5\nmem_len = 4\n')
    common = ["classify", "train", str(lm), "--data", str(data), "-q", "--device", "cpu"]
    assert main([*common, "--out", str(tmp_path / "flags"), "--mode", "memory", "--pooling", "mean",
                 "--grad-segments", "2", "--steps", "3", "--batch-size", "4", "--lr", "1e-3", "--dropout", "0",
                 "--seed", "5", "--mem-len", "4"]) == 0
    assert main([*common, "--out", str(tmp_path / "file"), "--config", str(config)]) == 0
    a = load_file(tmp_path / "flags" / "best" / "model.safetensors")
    b = load_file(tmp_path / "file" / "best" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a flag on the command line wins over the file; the file's other settings still apply
    assert main([*common, "--out", str(tmp_path / "over"), "--config", str(config), "--steps", "2",
                 "--pooling", "last"]) == 0
    settings = json.loads((tmp_path / "over" / "heldout.json").read_text())["settings"]
    assert (settings["steps"], settings["lr"], settings["seed"], settings["mem_len"]) == (2, 1e-3, 5, 4)
    assert settings["classifier"]["pooling"] == "last" and settings["classifier"]["grad_segments"] == 2
    assert settings["config"] == str(config)


@pytest.mark.parametrize("text, message", [
    ("[classify]\nstep = 3\n", "{config}: unknown key(s) step in classify (did you mean steps?)"),
    ("[classify]\nsteps = 2.5\n", "{config}: classify.steps must be an integer, got 2.5"),
    ("[classify]\nsteps = true\n", "{config}: classify.steps must be an integer, got True"),
    ("[classify]\nlr = nan\n", "{config}: classify.lr must be a finite number, got nan"),
    ("[classify]\nlr = 1" + "0" * 400 + "\n", "{config}: classify.lr must be a finite number, got 1000"),
    ("[classify]\nlr = \"big\"\n", "{config}: classify.lr must be a number, got 'big'"),
    ("[classify]\nmode = \"middle\"\n", "[classify] mode of {config} must be one of memory, first, last, got 'middle'"),
    ("[classify]\npasses = 3\n", "[classify] passes of {config} must be one of 1, 2, got 3"),
    ("[classify]\nhead_init = \"zeros\"\n", "[classify] head_init of {config} must be one of probe, random, got 'zeros'"),
    ("[train]\nsteps = 3\n", "must hold one [classify] table of txl classify train settings (found: 'train')"),
    ("[classify\n", "is not valid TOML"),
    ("[classify]\nsteps = 0\n", "[classify] steps of {config} must be >= 1, got 0"),  # a value from the file is named as such
    ("[classify]\nseed = -1\n", "[classify] seed of {config} must be in [0, 2**32), got -1"),
    ("[classify]\nclip = -1\n", "[classify] clip of {config} must be >= 0, got -1"),
    ("steps = 3\n", "(found: 'steps')"),
])
def test_a_bad_config_file_is_one_line_and_writes_nothing(tmp_path, capsys, text, message):
    from txl.cli import main

    lm, data = _lm(tmp_path), _jsonl_docs(tmp_path)
    config = tmp_path / "bad.toml"
    config.write_text(text)
    assert main(["classify", "train", str(lm), "--data", str(data), "--out", str(tmp_path / "run"),
                 "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl: error: ") and message.format(config=config) in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
    assert main(["classify", "train", str(lm), "--data", str(data), "--out", str(tmp_path / "run"),
                 "--config", str(tmp_path / "none.toml")]) == 2
    assert "config file " + str(tmp_path / "none.toml") + " does not exist" in capsys.readouterr().err


def test_valid_on_the_command_line_wins_over_the_files_valid_fraction(tmp_path):
    import argparse

    from txl_recipes.classify.command import TRAIN_SETTINGS, resolve_settings

    config = tmp_path / "c.toml"
    config.write_text("[classify]\nvalid_fraction = 0.3\nsteps = 7\n")
    args = argparse.Namespace(config=str(config), valid="held.jsonl", **dict.fromkeys(TRAIN_SETTINGS))
    resolve_settings(args)
    assert args.valid_fraction is None and args.steps == 7 and args.batch_size == 8
    args = argparse.Namespace(config=str(config), valid=None, **dict.fromkeys(TRAIN_SETTINGS))
    resolve_settings(args)
    assert args.valid_fraction == 0.3


def test_only_a_run_with_checkpoints_of_another_kind_is_refused_as_one(tmp_path):
    import json
    import shutil

    from txl.config import RunConfig
    from txl_recipes.classify.config import check_classification_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(RunConfig().to_dict()))
    check_classification_run(run)  # killed before its first checkpoint: nothing says what kind it is
    shutil.copytree(_lm(tmp_path), run / "last")
    with pytest.raises(TxlError, match=f"^{run} is a language-model run, not a document-classification run; "
                                       f"continue it with txl train --resume {run}$"):
        check_classification_run(run)
    (run / "last" / "classifier.json").write_text("{}")
    check_classification_run(run)
