"""Several processes (torchrun, gloo on CPU) and gradient accumulation train exactly like one process."""

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from txl.cli import main
from txl.distributed import Dist

TINY = ["model.n_layer=2", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "model.dropout=0", "model.dropatt=0", "train.batch_size=4",
        "train.max_steps=20", "train.eval_interval=10", "train.log_interval=1", "train.sample_tokens=0",
        "train.warmup_steps=3", "train.lr=3e-3", "eval.batch_size=3", "eval.mem_len=16"]


def rows(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return {int(r["step"]): r for r in csv.DictReader(f)}


def train_cli(tmp_path, corpus, name, *extra):
    out = tmp_path / name
    args = ["train", str(corpus), "--tokenizer", "char", "--out", str(out), "-q",
            f"data.cache_dir={tmp_path / 'cache'}", *TINY, *extra]
    assert main(args) == 0
    return out


def assert_same_run(a, b, tol=1e-5):
    ra, rb = rows(a), rows(b)
    assert sorted(ra) == sorted(rb) == list(range(1, 21))
    for step in ra:
        for key in ("train_loss", "val_loss"):
            if ra[step][key]:
                assert abs(float(ra[step][key]) - float(rb[step][key])) < tol, (step, key, ra[step][key], rb[step][key])
    wa, wb = load_file(a / "last" / "model.safetensors"), load_file(b / "last" / "model.safetensors")
    assert wa.keys() == wb.keys()
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst < tol, worst


def test_rows_split_the_streams_into_blocks():
    blocks = [Dist(rank=r, world=3).rows(8) for r in range(3)]
    assert [list(range(8))[s] for s in blocks] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert Dist().rows(5) == slice(0, 5)


def test_two_ranks_step_equals_the_whole_batch_gradient(tmp_path):
    """With plain SGD the weights after one step show the gradient itself (AdamW would hide its scale)."""
    worker = str(Path(__file__).with_name("ddp_step_worker.py"))
    results = {}
    for name, cmd in (("one", [sys.executable, worker, tmp_path / "one.st", "1"]),
                      ("two", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               worker, tmp_path / "two.st", "2"])):
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[name] = load_file(tmp_path / f"{name}.st")
    one, two = results["one"], results["two"]
    assert abs(float(one["loss_sum"]) - float(two["loss_sum"])) < 1e-4
    worst = max(float((one[k] - two[k]).abs().max()) for k in one if k != "loss_sum")
    assert worst < 1e-5, worst


def test_the_launch_hands_txl_its_arguments_unparsed(monkeypatch):
    """torchrun's own parser never reads txl's arguments: a flag that is a prefix of several of torchrun's
    options (``--log`` of ``--log-dir``, ``--logs-specs``) reaches the ranks as given."""
    import torch.distributed.run as torchrun

    from txl.distributed import launch

    seen = []
    monkeypatch.setattr(torchrun, "run", lambda config: seen.append(config))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    argv = ["train", "corpus.txt", "--log", "tensorboard", "--npro", "x", "train.max_steps=3"]
    assert launch(2, argv) == 0
    (config,) = seen
    assert (config.nproc_per_node, config.module, config.training_script) == ("2", True, "txl")
    assert config.training_script_args == argv


def test_gradient_accumulation_equals_the_whole_batch(tmp_path, corpus):
    whole = train_cli(tmp_path, corpus, "whole")
    accum = train_cli(tmp_path, corpus, "accum", "train.grad_accum_steps=4")  # one stream per piece
    assert_same_run(whole, accum)


def test_two_gloo_processes_equal_one_process(tmp_path, corpus, capsys):
    single = train_cli(tmp_path, corpus, "single")
    capsys.readouterr()
    # txl train --nproc 2 runs torchrun: two ranks of 2 streams each, each split in 2 accumulation pieces
    double = train_cli(tmp_path, corpus, "double", "--nproc", "2", "train.grad_accum_steps=2")
    assert_same_run(single, double)
    assert {p.name for p in double.iterdir()} >= {"run.json", "metrics.csv", "best", "last", "last.10"}
    assert not list(double.glob("*.tmp"))
    # the 2-process checkpoint of step 10 (memory of all streams) resumed by one process
    shutil.rmtree(double / "last")
    assert main(["train", "--resume", str(double), "-q"]) == 0
    assert_same_run(single, double)


def test_batch_must_split_evenly_over_ranks(tmp_path, corpus, capsys):
    code = main(["train", str(corpus), "--tokenizer", "char", "--out", str(tmp_path / "odd"), "-q", "--nproc", "2",
                 f"data.cache_dir={tmp_path / 'cache'}", *TINY, "train.batch_size=3"])
    assert code == 2
    assert "must divide into 2 ranks" in capsys.readouterr().err  # refused before any process starts
    assert not (tmp_path / "odd").exists()


CMEM = ["model.mem_len=4", "model.cmem_len=4", "model.cmem_ratio=3", "model.recon_loss_weight=2.0",
        "train.varlen=true", "eval.cmem_len=6"]


def test_gradient_accumulation_with_compressed_memory_equals_the_whole_batch(tmp_path, corpus):
    """The reconstruction loss is a per-chunk mean, added with weight / chunks: accumulation over
    equal pieces gives the whole batch's step (the compressive memory split by rows like the plain one)."""
    whole = train_cli(tmp_path, corpus, "whole", *CMEM)
    accum = train_cli(tmp_path, corpus, "accum", *CMEM, "train.grad_accum_steps=4")
    assert_same_run(whole, accum)
    assert all(r["recon_loss"] for s, r in rows(accum).items() if s > 3)


@pytest.mark.slow
def test_two_gloo_processes_with_compressed_memory_equal_one_process(tmp_path, corpus, capsys):
    single = train_cli(tmp_path, corpus, "single", *CMEM)
    capsys.readouterr()
    double = train_cli(tmp_path, corpus, "double", *CMEM, "--nproc", "2", "train.grad_accum_steps=2")
    assert_same_run(single, double)
