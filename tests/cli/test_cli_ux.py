"""What a user sees: streamed text equals the decoded sample, which checkpoint a command used,
resuming a finished run or a checkpoint folder, the flags and keys named in errors, slow-dtype
warnings, and SIGINT ending every command even when the shell started it with SIGINT ignored."""

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import txl.generation
import txl.runtime
from conftest import ROOT, one_error_line, run_cli, tiny_model
from txl.cli import build_parser
from txl.data import BPETokenizer, ByteTokenizer, CharTokenizer, WordTokenizer
from txl.data.corpus import load_corpus
from txl.errors import TxlError
from txl.generation import stream_text
from txl.training.checkpoint import save_checkpoint
from txl.config import RunConfig, parse_override

TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
        "model.tgt_len=8", "model.mem_len=8", "train.batch_size=4", "train.max_steps=4", "train.eval_interval=2",
        "train.log_interval=2", "train.sample_tokens=0", "train.warmup_steps=1"]


def make_checkpoint(folder: Path, tokenizer, step: int, seed: int = 0) -> Path:
    """A checkpoint of a tiny model for ``tokenizer`` written as training writes one."""
    model = tiny_model(seed, dtype=torch.float32, vocab_size=tokenizer.vocab_size, n_layer=1)
    save_checkpoint(folder, model, tokenizer, RunConfig(), {"step": step})
    return folder


def make_run(root: Path, tokenizer, best_step: int = 600, last_step: int = 700) -> Path:
    """A run folder whose best/ is older than its last/ (as after an interrupted run)."""
    root.mkdir()
    (root / "run.json").write_text(json.dumps(RunConfig().to_dict()), encoding="utf-8")
    make_checkpoint(root / "best", tokenizer, best_step, seed=0)
    make_checkpoint(root / "last", tokenizer, last_step, seed=1)
    return root


# --- item 10: the streamed text is the decoded text --------------------------------------------------


def streamed(tokenizer, ids, cut):
    return "".join(stream_text(tokenizer, ids[cut:], ids[:cut]))


def test_byte_stream_keeps_a_character_after_an_invalid_byte():
    ids = list(bytes.fromhex("80F09F90956F6B"))
    tok = ByteTokenizer()
    assert tok.decode(ids) == "\ufffd\U0001F415ok"
    for cut in range(len(ids) + 1):
        assert streamed(tok, ids, cut) == "\ufffd\U0001F415ok"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40), st.data())
def test_byte_stream_equals_decode_of_all_tokens(data, draw):
    ids = list(data)
    cut = draw.draw(st.integers(0, len(ids)))
    assert streamed(ByteTokenizer(), ids, cut) == ByteTokenizer().decode(ids)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_char_and_word_streams_equal_decode(draw):
    char = CharTokenizer(list("ab\n\u00e9\U0001F415 "))
    word = WordTokenizer(["<unk>", "<eos>", "the", "dog", "\U0001F415"])
    for tok in (char, word):
        ids = draw.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=30))
        cut = draw.draw(st.integers(0, len(ids)))
        assert streamed(tok, ids, cut) == tok.decode(ids)


@pytest.fixture(scope="module")
def bpe():
    pytest.importorskip("tokenizers")
    return BPETokenizer.build(["h\u00e9llo w\u00f6rld \U0001F415\U0001F415 \u4e2d\u6587 caf\u00e9\n" * 3,
                               "\u00e9\u00e9\u00e9 \U0001F415 dog\n"], vocab_size=300, min_frequency=1)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_bpe_stream_equals_decode_even_when_tokens_split_characters(bpe, draw):
    ids = draw.draw(st.lists(st.integers(0, bpe.vocab_size - 1), max_size=30))
    cut = draw.draw(st.integers(0, len(ids)))
    assert streamed(bpe, ids, cut) == bpe.decode(ids)


def test_generate_prints_the_decoded_sample_of_a_byte_model(tmp_path, capsys, monkeypatch):
    ckpt = make_checkpoint(tmp_path / "byte", ByteTokenizer(), step=5)
    sample = list(bytes.fromhex("80F09F90956F6B"))

    def fake_steps(model, ids, n, **kw):  # the model "draws" these bytes
        for b in sample:
            yield txl.generation.GenerationStep(torch.tensor([b]), torch.zeros(1, 256))

    monkeypatch.setattr(txl.generation, "generate_steps", fake_steps)
    code, out, err = run_cli(capsys, "generate", ckpt, "--prompt", "x", "-n", "7", "--device", "cpu")
    assert code == 0, err
    assert out == "x\ufffd\U0001F415ok\n"


# --- item 15: --resume with a checkpoint folder, and on a finished run --------------------------------


def test_resume_takes_the_last_checkpoint_folder_and_says_a_finished_run_is_complete(tmp_path, capsys,
                                                                                      monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    run = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", corpus, "--tokenizer", "char", "--out", run, "-q", *TINY)
    assert code == 0, err

    code, out, err = run_cli(capsys, "train", "--resume", run, "-q")
    assert code == 0, err
    assert "already complete at step 4" in out and "trained" not in out
    code, out, err = run_cli(capsys, "train", "--resume", run / "last", "-q")  # the checkpoint stands for its run
    assert code == 0, err
    assert "already complete at step 4" in out

    code, out, err = run_cli(capsys, "train", "--resume", run / "last", "-q", "--allow-config-change",
                             "train.max_steps=6")
    assert code == 0, err
    assert "trained steps 5-6 (resumed after step 4)" in out
    assert json.loads((run / "last" / "state.json").read_text())["step"] == 6

    code, out, err = run_cli(capsys, "train", "--resume", run / "best", "-q")
    line = one_error_line(err)
    assert code == 2 and f"--resume {run}" in line
    code, out, err = run_cli(capsys, "train", "--resume", tmp_path / "nowhere", "-q")
    assert code == 2 and "does not exist" in one_error_line(err)


# --- item 16: which checkpoint, and choosing it -----------------------------------------------------------


def used(err: str) -> list[str]:
    """The ``txl: using ...`` lines of ``err`` without the threads that end them (``; threads 2 (...)``)."""
    return [line.split("; threads ")[0] for line in err.splitlines() if line.startswith("txl: using ")
            and "; threads " in line]


def test_eval_score_generate_say_which_checkpoint_and_let_the_user_choose(tmp_path, capsys):
    tok = CharTokenizer(list("abc \n"))
    run = make_run(tmp_path / "run", tok)
    text = tmp_path / "doc.txt"
    text.write_text("abc abc cab\nbca abc\n" * 4, encoding="utf-8")
    commands = {"generate": ["generate", run, "--prompt", "a", "-n", "3", "--device", "cpu"],
                "eval": ["eval", run, "--data", text, "--device", "cpu"],
                "score": ["score", run, text, "--device", "cpu"]}
    for name, argv in commands.items():
        code, out, err = run_cli(capsys, *argv)
        assert code == 0, err
        assert f"txl: using {run / 'best'} (step 600; last/ is at step 700)" in used(err), (name, err)
        code, out, err = run_cli(capsys, *argv, "--checkpoint-name", "last")
        assert code == 0, err
        assert f"txl: using {run / 'last'} (step 700; best/ is at step 600)" in used(err), (name, err)
    code, out, err = run_cli(capsys, "generate", run / "last", "-n", "2", "--device", "cpu")
    assert code == 0 and f"txl: using {run / 'last'} (step 700; best/ is at step 600)" in err
    code, out, err = run_cli(capsys, "generate", run / "last", "-n", "2", "--checkpoint-name", "best")
    assert code == 2 and "not a run directory" in one_error_line(err)
    code, out, err = run_cli(capsys, "generate", run, "-n", "2", "--checkpoint-name", "newest")
    assert code == 2 and "--checkpoint-name" in one_error_line(err)


# --- item 17: documented defaults, flags and keys named in errors, slow dtypes -----------------------------


def test_generate_without_prompt_is_documented(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Without --prompt or --prompt-file the prompt is a single newline" in help_text
    docs = (ROOT / "docs" / "generation.md").read_text(encoding="utf-8")
    assert "Without `--prompt`" in docs and "-n/--max-new-tokens" in docs


def test_errors_name_the_flag_as_the_user_sees_it(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "c", ByteTokenizer(), step=1)
    code, out, err = run_cli(capsys, "generate", ckpt, "-n", "-1")
    assert code == 2 and "-n/--max-new-tokens must be >= 0" in one_error_line(err)
    code, out, err = run_cli(capsys, "eval", ckpt, "--max-tokens", "-5")
    assert code == 2 and "--max-tokens must be >= 0" in one_error_line(err)


@pytest.mark.parametrize("override, hint", [("model.n_layers=2", "model.n_layer"), ("n_layers=2", "n_layer"),
                                            ("train.n_layer=2", "model.n_layer"), ("max_step=3", "max_steps"),
                                            ("trian.lr=1", "train")])
def test_unknown_override_keys_get_a_did_you_mean(override, hint, capsys):
    with pytest.raises(TxlError, match=f"did you mean {hint}"):
        parse_override(override)
    code, out, err = run_cli(capsys, "train", override)
    assert code == 2 and f"did you mean {hint}" in one_error_line(err)


def test_unknown_config_file_keys_get_a_did_you_mean(tmp_path, capsys):
    with pytest.raises(TxlError, match="did you mean d_model"):
        RunConfig.from_dict({"model": {"d_modle": 16}})
    config = tmp_path / "c.toml"
    config.write_text("[train]\nmax_step = 3\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "train", "--config", config)
    assert code == 2 and "did you mean max_steps" in one_error_line(err)


def test_too_small_split_names_the_key_to_change(tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("abcdefghij" * 3, encoding="utf-8")
    with pytest.raises(TxlError, match=r"data\.split=\[0\.9, 0\.05, 0\.05\]"):
        load_corpus(small, "char", split=(0.9, 0.05, 0.05))
    lines = tmp_path / "lines.txt"
    lines.write_text("one line\ntwo line\n", encoding="utf-8")
    with pytest.raises(TxlError, match=r"data\.split"):
        load_corpus(lines, "word", split=(0.9, 0.05, 0.05))
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text("abcdefghij" * 10, encoding="utf-8")
    valid.write_text("a", encoding="utf-8")
    with pytest.raises(TxlError, match=r"data\.valid"):
        load_corpus(train=train, valid=valid, tokenizer="char")


def test_native_dtype_support_reads_the_cpu_flags(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(txl.runtime, "cpu_flags", lambda: {"avx2", "fma"})
    assert not txl.runtime.native_dtype_support(cpu, "bfloat16")
    assert not txl.runtime.native_dtype_support(cpu, "float16")
    assert txl.runtime.native_dtype_support(cpu, "float32")
    assert not txl.runtime.native_dtype_support(cpu, "int8")  # no VNNI: int8 products emulated
    monkeypatch.setattr(txl.runtime, "cpu_flags", lambda: {"avx2", "avx512_bf16", "avx512_vnni"})
    assert txl.runtime.native_dtype_support(cpu, "bfloat16") and txl.runtime.native_dtype_support(cpu, "int8")
    monkeypatch.setattr(txl.runtime, "cpu_flags", lambda: None)  # unknown: no false alarm
    assert txl.runtime.native_dtype_support(cpu, "bfloat16") and txl.runtime.native_dtype_support(cpu, "int8")


@pytest.mark.parametrize("native", [False, True])
def test_int8_weights_on_a_cpu_without_vnni_warn_once(tmp_path, capsys, monkeypatch, native):
    ckpt = make_checkpoint(tmp_path / "c", CharTokenizer(list("abc \n")), step=1)
    monkeypatch.setattr(txl.runtime, "native_dtype_support", lambda device, dtype: native or dtype != "int8")
    code, out, err = run_cli(capsys, "generate", ckpt, "-n", "2", "--quantize", "int8", "--device", "cpu")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("txl: warning:")]
    assert warnings == ([] if native else [
        "txl: warning: this CPU has no int8 dot-product instructions (VNNI): int8 weights run several times "
        "slower than float32 here (use the float checkpoint, or drop --quantize int8)"]), err


@pytest.mark.parametrize("native", [False, True])
def test_half_precision_on_a_cpu_without_it_warns_once(tmp_path, capsys, monkeypatch, native):
    ckpt = make_checkpoint(tmp_path / "c", CharTokenizer(list("abc \n")), step=1)
    text = tmp_path / "doc.txt"
    text.write_text("abc cab\n" * 4, encoding="utf-8")
    monkeypatch.setattr(txl.runtime, "native_dtype_support", lambda device, dtype: native)
    for argv in (["generate", ckpt, "-n", "2"], ["eval", ckpt, "--data", text], ["score", ckpt, text]):
        code, out, err = run_cli(capsys, *argv, "--dtype", "bfloat16", "--device", "cpu")
        assert code == 0, err
        warnings = [line for line in err.splitlines() if line.startswith("txl: warning:")]
        assert len(warnings) == (0 if native else 1), err
        assert native or "bfloat16" in warnings[0] and "slower" in warnings[0]


# --- item 18: SIGINT ends a command started with SIGINT ignored ------------------------------------------


def test_sigint_stops_generate_started_with_sigint_ignored(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c", ByteTokenizer(), step=1)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "txl", "generate", str(ckpt), "--prompt", "go", "-n", "100000000",
                             "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.read(2) == b"go"  # loaded and sampling
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert code == 130, err
    assert err.splitlines()[-1] == "txl: interrupted" and "Traceback" not in err
    # the sample's line is ended, so that on a terminal the message starts a line of its own
    assert proc.stdout.read().endswith(b"\n")



def test_sigint_during_an_import_that_swallows_it_is_raised_after(tmp_path, monkeypatch):
    """torch's import swallows a KeyboardInterrupt raised inside it: while a command runs, SIGINT is held
    back during torch's import and raised once the module's code has run (else a Ctrl-C then is lost)."""
    from txl.cli.common import interrupts_held_while_importing

    (tmp_path / "swallows_interrupts.py").write_text(
        "import os, pathlib, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.2)\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "pathlib.Path(__file__).with_suffix('.done').touch()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupts_held_while_importing("swallows_interrupts"), pytest.raises(KeyboardInterrupt):
            importlib.import_module("swallows_interrupts")
        assert (tmp_path / "swallows_interrupts.done").exists()  # the module's code ran to its end first
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler found is back
        importlib.import_module("swallows_interrupts")  # the finder is gone: the module swallows it again
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.modules.pop("swallows_interrupts", None)


def test_sigint_while_a_command_imports_torch_ends_it(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c", ByteTokenizer(), step=1)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    script = ("import os, signal, sys, threading, time\n"
              "def interrupt_once_torch_imports():  # as torch's import starts numpy's, where torch swallows it\n"
              "    while 'torch' not in sys.modules or 'numpy' not in sys.modules:\n"
              "        time.sleep(0.001)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "threading.Thread(target=interrupt_once_torch_imports, daemon=True).start()\n"
              "from txl.cli import main\n"
              f"sys.exit(main(['generate', {str(ckpt)!r}, '--prompt', 'go', '-n', '100000000', '--device', 'cpu']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines()[-1] == "txl: interrupted" and "Traceback" not in proc.stderr
