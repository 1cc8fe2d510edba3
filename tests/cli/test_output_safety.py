"""Data loss (issue 12, items 1-2): one process per output folder, and no output over an input, into a
checkpoint or run folder, or over an existing file without --force."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from txl.cli import main
from txl.errors import TxlError
from txl.fileio import LOCK_SUFFIX, check_output_path, claim_folder

SRC = str(ROOT / "src")
ENV = dict(os.environ, PYTHONPATH=SRC)
TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "train.batch_size=4", "train.max_steps=6", "train.eval_interval=3",
        "train.log_interval=2", "train.sample_tokens=0", "train.warmup_steps=2", "eval.mem_len=16"]
HOLD = ("import sys, time\nfrom txl.fileio import claim_folder\nc = claim_folder(sys.argv[1])\n"
        "print('claimed', flush=True)\ntime.sleep(float(sys.argv[2]))\nc.release()\n")


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert lines[0].startswith("txl: error: ") and "Traceback" not in err
    return lines[0]


def tree_digest(folder: Path) -> dict:
    """Every file under ``folder`` with its sha256 (byte-for-byte comparison)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def holder(folder: Path, seconds: float = 60.0) -> subprocess.Popen:
    """A process that claims ``folder`` and holds it; returns once the claim is taken."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout.readline().strip() == "claimed", proc.stderr.read()
    return proc


# --- the claim helper --------------------------------------------------------------------------------------------

def test_claim_is_exclusive_between_threads(tmp_path):
    folder, results, barrier = tmp_path / "out", [], threading.Barrier(8)

    def attempt():
        barrier.wait()
        try:
            results.append(claim_folder(folder))
        except TxlError as err:
            results.append(err)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if not isinstance(r, TxlError)]
    assert len(won) == 1 and all("in use by another txl process" in str(r) for r in results if r not in won)
    won[0].release()
    assert not folder.exists() and not list(tmp_path.iterdir())  # created, empty: removed with its lock file


def test_claim_never_held_twice_while_claims_come_and_go(tmp_path):
    """Claims released (lock file removed) while others race for it: never two holders at once."""
    folder, held, overlaps, stop = tmp_path / "out", [0], [], time.monotonic() + 1.5
    guard = threading.Lock()

    def worker():
        while time.monotonic() < stop:
            try:
                claim = claim_folder(folder, create=True)
            except TxlError:
                continue
            with guard:
                held[0] += 1
                if held[0] > 1:
                    overlaps.append(held[0])
            time.sleep(0.0005)
            with guard:
                held[0] -= 1
            claim.release()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlaps


def test_claim_is_exclusive_between_processes(tmp_path):
    folder = tmp_path / "out"
    script = ("import sys, time\nfrom txl.fileio import claim_folder\nfrom txl.errors import TxlError\n"
              "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
              "try:\n    c = claim_folder(sys.argv[1])\nexcept TxlError:\n    print('busy'); sys.exit(2)\n"
              "print('claimed', flush=True)\ntime.sleep(2)\nc.release()\n")
    start = time.time() + 2.0  # all start claiming at the same moment
    procs = [subprocess.Popen([sys.executable, "-c", script, str(folder), str(start)], stdout=subprocess.PIPE,
                              text=True, env=ENV) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outs) == ["busy", "busy", "busy", "claimed"]


def test_a_killed_holder_does_not_block_a_later_claim(tmp_path):
    folder = tmp_path / "out"
    proc = holder(folder)
    with pytest.raises(TxlError, match=rf"in use by another txl process \(pid {proc.pid}\)"):
        claim_folder(folder)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / f".out{LOCK_SUFFIX}").exists()  # the stale lock file is left behind ...
    with claim_folder(folder) as claim:  # ... and taken over: held, so a second claim is refused
        assert not claim.created
        with pytest.raises(TxlError, match=rf"in use by another txl process \(pid {os.getpid()}\)"):
            claim_folder(folder)
    assert not (tmp_path / f".out{LOCK_SUFFIX}").exists()


def test_claim_refusals_change_nothing(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(TxlError, match="is a file"):
        claim_folder(tmp_path / "file")
    full = tmp_path / "full"
    full.mkdir()
    (full / "a.txt").write_text("keep")
    with pytest.raises(TxlError, match="not empty"):
        claim_folder(full, empty=True)
    ckpt = tmp_path / "run"
    ckpt.mkdir()
    (ckpt / "run.json").write_text("{}")
    with pytest.raises(TxlError, match="inside the txl checkpoint or run folder"):
        claim_folder(ckpt / "sub")
    with pytest.raises(TxlError, match="input folder"):
        claim_folder(full / "sub", inputs=[full])
    with pytest.raises(TxlError, match="does not exist"):
        claim_folder(tmp_path / "missing", create=False)
    assert (full / "a.txt").read_text() == "keep" and not (ckpt / "sub").exists()
    assert not list(tmp_path.glob(f".*{LOCK_SUFFIX}")) and not (tmp_path / "missing").exists()


def test_a_folder_that_must_be_new_or_empty_is_refused_by_one_rule(tmp_path):
    from txl.training.runlog import check_new_run_folder

    full = tmp_path / "full"
    (full / "sub").mkdir(parents=True)
    for name in ("e.txt", "a.txt", "d.txt", "c.txt"):
        (full / name).write_text("keep")
    listing = "a.txt, c.txt, d.txt, e.txt and 1 more"  # sorted, folders marked, four shown
    with pytest.raises(TxlError) as err:
        claim_folder(full, flag="DST", empty=True)
    assert str(err.value) == (f"DST {full} already exists and is not empty ({listing}); choose a new or empty "
                              "folder (nothing was changed)")
    with pytest.raises(TxlError) as err:  # the training run's folder: the same rule, its own advice
        check_new_run_folder(full)
    assert str(err.value) == (f"{full} is not empty ({listing}) and is not a txl run; a new run needs a new or empty "
                              "folder, and txl never overwrites files it did not write: choose another train.out_dir "
                              "(--out)")
    assert sorted(p.name for p in full.iterdir()) == ["a.txt", "c.txt", "d.txt", "e.txt", "sub"]
    assert not list(tmp_path.glob(f".*{LOCK_SUFFIX}"))
    empty = tmp_path / "empty"
    empty.mkdir()
    check_new_run_folder(empty)  # new or empty: both pass
    check_new_run_folder(tmp_path / "new")
    with claim_folder(empty, empty=True) as claim:
        assert not claim.created
        with pytest.raises(TxlError, match="in use by another txl process"):
            claim_folder(empty)


# --- the output check helper -------------------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    (tmp_path / "in.txt").write_text("input")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("doc")
    ckpt = tmp_path / "run" / "last"
    ckpt.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "state.json"):
        (ckpt / name).write_text("{}")
    (tmp_path / "free").mkdir()
    (tmp_path / "free" / "old.json").write_text("old")
    os.symlink(tmp_path / "in.txt", tmp_path / "free" / "link.txt")
    os.link(tmp_path / "in.txt", tmp_path / "free" / "hard.txt")
    os.link(tmp_path / "docs" / "a.txt", tmp_path / "free" / "hard_doc.txt")
    os.symlink(ckpt, tmp_path / "free" / "ckpt_link")
    return tmp_path


COMPONENTS = ["in.txt", "docs", "a.txt", "run", "last", "state.json", "free", "old.json", "link.txt", "hard.txt",
              "hard_doc.txt", "ckpt_link", "new.json", ".", ".."]


def expected_refusal(root: Path, rel: str, force: bool) -> str | None:
    """What check_output_path must say about ``root/rel`` (written independently of it)."""
    path = root / rel
    real = Path(os.path.realpath(path))
    if path.is_dir():
        return "is a folder"
    folder = os.path.dirname(path)  # as the kernel reads it: it must be an existing folder
    if not os.path.isdir(folder):
        above = folder
        while not os.path.exists(above):
            above = os.path.dirname(above)
        return "is a file, not a folder" if not os.path.isdir(above) else "does not exist; create it first"
    if real.exists() and any(real.samefile(i) for i in (root / "in.txt", root / "docs" / "a.txt")):
        return "txl never writes over its inputs"
    if real == root / "in.txt" or real == root / "docs" / "a.txt":
        return "txl never writes over its inputs"
    if root / "run" / "last" in real.parents:
        return "inside the txl checkpoint or run folder"
    if os.path.lexists(path) and not force:
        return "already exists"
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=4), force=st.booleans())
@example(parts=["free", "in.txt", "..", "hard.txt"], force=False)  # a missing folder before "..": kernel != realpath
def test_check_output_path_over_the_space_of_paths(tree, parts, force):
    rel = os.path.join(*parts)
    if not os.path.realpath(tree / rel).startswith(str(tree)):
        return  # above the test tree
    want = expected_refusal(tree, rel, force)
    try:
        check_output_path(tree / rel, [tree / "in.txt", tree / "docs"], force=force)
        got = None
    except TxlError as err:
        got = str(err)
    except OSError:  # a file used as a folder (in.txt/x): refused later by the writer, never written
        got = "oserror"
    if want is None:
        # ``missing/..`` cannot be opened; refusing it (realpath reads it lexically) is safe too
        odd = ".." in parts and not os.path.exists(tree / rel)
        assert got is None or got == "oserror" or odd, (rel, got)
    else:
        assert got is not None and (want in got or got == "oserror"), (rel, want, got)


# --- the commands ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run and its corpus."""
    root = tmp_path_factory.mktemp("trained")
    corpus = root / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    run = root / "run"
    assert main(["train", str(corpus), "--tokenizer", "char", "--out", str(run), "-q", *TINY]) == 0
    return run, corpus


def test_two_trains_started_together_on_one_folder(tmp_path, trained):
    """Two real processes: exactly one trains, the other exits 2 with one line; the folder is the winner's."""
    _, corpus = trained
    out = tmp_path / "run"
    procs = [subprocess.Popen([sys.executable, "-m", "txl", "train", str(corpus), "--tokenizer", "char", "--out",
                               str(out), "-q", *TINY, f"train.seed={seed}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path) for seed in (11, 22)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    winner = [seed for seed, (code, _, _) in zip((11, 22), results) if code == 0][0]
    loser_err = [err for code, _, err in results if code == 2][0]
    line = one_error_line(loser_err)
    assert "in use by another txl process" in line or "already holds a run" in line
    saved = json.loads((out / "run.json").read_text())
    assert saved["train"]["seed"] == winner
    for name in ("last", "best"):
        assert json.loads((out / name / "run.json").read_text())["train"]["seed"] == winner
    assert not list(tmp_path.glob(f".*{LOCK_SUFFIX}"))  # released


def test_train_on_a_claimed_folder_is_refused_and_changes_nothing(tmp_path, trained, capsys):
    run, corpus = trained
    before = tree_digest(run)
    proc = holder(run)
    try:
        code = main(["train", "--resume", str(run), "--allow-config-change", "train.max_steps=9"])
        assert code == 2 and "in use by another txl process" in one_error_line(capsys.readouterr().err)
        fresh = tmp_path / "fresh"
        proc2 = holder(fresh)
        try:
            code = main(["train", str(corpus), "--tokenizer", "char", "--out", str(fresh), "-q", *TINY])
            assert code == 2 and "in use by another txl process" in one_error_line(capsys.readouterr().err)
        finally:
            proc2.kill()
            proc2.wait()
    finally:
        proc.kill()
        proc.wait()
    assert tree_digest(run) == before


def test_resume_takes_over_the_lock_of_a_killed_run(tmp_path, trained, capsys):
    run, corpus = trained
    copy = tmp_path / "run"
    subprocess.run(["cp", "-a", str(run), str(copy)], check=True)
    proc = holder(copy)
    proc.send_signal(signal.SIGKILL)  # a crashed run: its lock file stays, unheld
    proc.wait()
    assert (tmp_path / f".run{LOCK_SUFFIX}").exists()
    code = main(["train", "--resume", str(copy), "--allow-config-change", "train.max_steps=9", "-q"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert json.loads((copy / "last" / "state.json").read_text())["step"] == 9
    # a new run on the existing run folder is still refused
    code = main(["train", str(corpus), "--tokenizer", "char", "--out", str(copy), "-q", *TINY])
    assert code == 2 and "already holds a run" in one_error_line(capsys.readouterr().err)


def _inputs(tmp_path: Path, corpus: Path) -> tuple[Path, Path]:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "the quick brown fox"}\n', encoding="utf-8")
    text = tmp_path / "in.txt"
    text.write_text(corpus.read_text()[:400], encoding="utf-8")
    return jsonl, text


# (command line with OUT standing for the output, the input it reads that OUT may be set to)
COMMANDS = {
    "score --out": (lambda run, j, t, out: ["score", run, j, "--out", out], "jsonl"),
    "eval --json": (lambda run, j, t, out: ["eval", run, "--data", t, "--json", out], "text"),
    "eval --plot": (lambda run, j, t, out: ["eval", run, "--data", t, "--sweep-mem", "0,8", "--plot", out], "text"),
    "recl --json": (lambda run, j, t, out: ["recl", run, "--data", t, "--max-context", "32", "--positions", "20",
                                            "--json", out], "text"),
    "bench --json": (lambda run, j, t, out: ["bench", "--json", out], None),
}


CASES = [(command, case) for command in COMMANDS for case in ("input", "symlink", "hardlink", "checkpoint", "existing")
         if COMMANDS[command][1] is not None or case in ("checkpoint", "existing")]  # bench reads no file


@pytest.mark.parametrize("command, case", CASES)
def test_outputs_are_never_written_over_inputs_checkpoints_or_existing_files(tmp_path, trained, capsys, command,
                                                                             case):
    run, corpus = trained
    jsonl, text = _inputs(tmp_path, corpus)
    make, reads = COMMANDS[command]
    source = {"jsonl": jsonl, "text": text, None: None}[reads]
    out = tmp_path / "result.json"
    if command == "eval --plot":
        out = tmp_path / "result.png"
    if case == "input":
        out = source
    elif case == "symlink":
        os.symlink(source, out)
    elif case == "hardlink":
        os.link(source, out)
    elif case == "checkpoint":
        out = run / "last" / "state.json"
    else:
        out.write_text("keep me")
    before = {p: p.read_bytes() for p in (jsonl, text) if p.exists()}
    checkpoint = tree_digest(run)
    code = main([str(a) for a in make(run, jsonl, text, out)])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2
    expect = {"input": "never writes over its inputs", "symlink": "never writes over its inputs",
              "hardlink": "never writes over its inputs", "checkpoint": "inside the txl checkpoint or run folder",
              "existing": "already exists; add --force"}[case]
    assert expect in line
    assert {p: p.read_bytes() for p in before} == before
    assert tree_digest(run) == checkpoint
    if case == "existing":
        assert out.read_text() == "keep me"
    if case in ("input", "checkpoint"):  # --force never allows these
        code = main([str(a) for a in make(run, jsonl, text, out)] + ["--force"])
        assert code == 2 and expect in one_error_line(capsys.readouterr().err)
        assert tree_digest(run) == checkpoint and {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("command", ["score --out", "eval --json", "recl --json"])
def test_force_replaces_an_existing_output(tmp_path, trained, capsys, command):
    run, corpus = trained
    jsonl, text = _inputs(tmp_path, corpus)
    out = tmp_path / "result.json"
    out.write_text("old")
    argv = [str(a) for a in COMMANDS[command][0](run, jsonl, text, out)]
    assert main(argv + ["--force"]) == 0, capsys.readouterr().err
    assert out.read_text() != "old" and out.read_text().strip()


@pytest.mark.parametrize("command", ["score --out", "eval --json"])
@pytest.mark.parametrize("kind", ["FIFO", "symbolic link"])
def test_force_never_puts_a_file_in_place_of_a_fifo_or_a_link(tmp_path, trained, capsys, command, kind):
    run, corpus = trained
    jsonl, text = _inputs(tmp_path, corpus)
    out, target = tmp_path / "result.json", tmp_path / "elsewhere.json"
    target.write_text("keep me")
    os.mkfifo(out) if kind == "FIFO" else os.symlink(target, out)
    mode = os.lstat(out).st_mode
    code = main([str(a) for a in COMMANDS[command][0](run, jsonl, text, out)] + ["--force"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"is a {kind}, not a regular file" in line, line
    assert os.lstat(out).st_mode == mode and target.read_text() == "keep me"


def test_plot_outputs_need_force_and_stay_out_of_runs(tmp_path, trained, capsys):
    pytest.importorskip("matplotlib")
    run, _ = trained
    plots = tmp_path / "plots"
    assert main(["plot", str(run), "--out", str(plots)]) == 0
    first = tree_digest(plots)
    capsys.readouterr()
    assert main(["plot", str(run), "--out", str(plots)]) == 2
    assert "already exists; add --force" in one_error_line(capsys.readouterr().err)
    assert tree_digest(plots) == first
    assert main(["plot", str(run), "--out", str(plots), "--force"]) == 0
    checkpoint = tree_digest(run)
    capsys.readouterr()
    assert main(["plot", str(run), "--out", str(run)]) == 2
    assert "inside the txl checkpoint or run folder" in one_error_line(capsys.readouterr().err)
    assert tree_digest(run) == checkpoint


@pytest.mark.parametrize("argv", [
    lambda run, tmp: ["convert", "to-hf", run, tmp / "hf"],
    lambda run, tmp: ["recl", run, "--max-context", "32", "--positions", "20", "--no-plot", "--out", tmp / "hf"],
    lambda run, tmp: ["classify", "train", run, "--data", tmp / "labelled.jsonl", "--out", tmp / "hf"],
    lambda run, tmp: ["data", "prepare", "enwik8", "--source", tmp / "enwik8.zip", "--out", tmp / "hf"],
    lambda run, tmp: ["ablate", "--budget-tokens", "1000", "--out", tmp / "hf"],
])
def test_folder_commands_refuse_a_folder_in_use(tmp_path, trained, capsys, argv):
    run, _ = trained
    (tmp_path / "labelled.jsonl").write_text('{"text": "a b", "label": "x"}\n{"text": "c d", "label": "y"}\n')
    (tmp_path / "enwik8.zip").write_bytes(b"")  # an input that exists: the folder claim is what is tested
    proc = holder(tmp_path / "hf")
    try:
        code = main([str(a) for a in argv(run, tmp_path)])
        assert code == 2 and "in use by another txl process" in one_error_line(capsys.readouterr().err)
        assert not any((tmp_path / "hf").iterdir())
    finally:
        proc.kill()
        proc.wait()
    (tmp_path / "hf").rmdir()


def test_convert_into_a_checkpoint_is_refused(tmp_path, trained, capsys):
    run, _ = trained
    checkpoint = tree_digest(run)
    assert main(["convert", "to-hf", str(run), str(run / "last" / "hf")]) == 2
    assert "inside the txl checkpoint or run folder" in one_error_line(capsys.readouterr().err)
    assert tree_digest(run) == checkpoint and not (run / "last" / "hf").exists()
