import os

# One CPU thread for torch everywhere in the suite (here, in the txl commands it runs in this process and in
# every subprocess or torchrun rank it starts), unless OMP_NUM_THREADS is set: txl's own choice follows the
# machine's load (txl.runtime.choose_threads), and two runs that a test compares (a resumed run and an
# uninterrupted one) must not differ in the last digits because the load changed between them; the tiny
# models of the tests are fastest on one thread anyway. Set before torch is imported, which reads it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings

# CI runs a fixed set of examples (HYPOTHESIS_PROFILE=ci in .ci/run) so that a result is reproducible;
# local runs draw new examples each time and add a failure found that way as an @example.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from txl.model import TransformerXLConfig, TransformerXLLM  # noqa: E402

# the repository (the tests sit in folders that mirror src/txl: tests/model, tests/generation, ...)
ROOT = Path(__file__).resolve().parents[1]
# tiny Shakespeare ships with the repository (data/); TXL_SHAKESPEARE points the tests at another copy
SHAKESPEARE = Path(os.environ.get("TXL_SHAKESPEARE", ROOT / "data" / "tinyshakespeare.txt"))
needs_shakespeare = pytest.mark.skipif(
    not SHAKESPEARE.is_file(), reason=f"tiny Shakespeare not found at {SHAKESPEARE} (TXL_SHAKESPEARE names it)")


def tiny_config(**overrides) -> TransformerXLConfig:
    values = dict(vocab_size=37, n_layer=3, d_model=16, n_head=2, d_head=6, d_inner=24, dropout=0.0,
                  dropatt=0.0, tgt_len=5, mem_len=7)
    values.update(overrides)
    return TransformerXLConfig(**values)


def tiny_model(seed: int = 0, dtype=torch.float64, **overrides) -> TransformerXLLM:
    torch.manual_seed(seed)
    model = TransformerXLLM(tiny_config(**overrides)).to(dtype)
    model.eval()
    return model


def layer_attention(d_model, n_head, d_head, pre_lnorm, attn_type, **overrides):
    """One attention sub-layer alone, of the scheme ``attn_type``, built as a model builds it (no dropout)."""
    from txl.model.attention import MultiHeadAttention
    from txl.model.positions import SCHEMES

    config = tiny_config(d_model=d_model, n_head=n_head, d_head=d_head, pre_lnorm=pre_lnorm, attn_type=attn_type,
                         **overrides)
    return MultiHeadAttention(config, SCHEMES[attn_type](config))


def reference_attention(attn, h, mem, mask, clamp_len=0):
    """One attention sub-layer as :mod:`txl.model.reference` computes it for the layer ``attn`` (its kind
    ``attn.pos.name``): input ``h`` [B, T, d] after ``mem`` [B, M, d] or None, hidden keys ``mask`` [T, M + T]."""
    from txl.model import reference

    mem = h[:, :0] if mem is None else mem
    out, _ = reference.attention(attn, h, mem, reference.key_distances(h.size(1), mem.size(1)), mask,
                                 attn_type=attn.pos.name, clamp_len=clamp_len, d_model=h.size(-1))
    return out


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Every device this machine has: a test that takes it runs its equality checks on the CPU and, where a
    GPU exists, again on it, so the CUDA branches of the fast paths meet the same invariants."""
    return torch.device(request.param)


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny models: one thread is much faster than several fighting over busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_model():
    return tiny_model


@pytest.fixture
def corpus(tmp_path):
    """A small repetitive text file (15 kB, 37 distinct characters) for short training runs."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} dogs.\n"
                            for i in range(300)))
    return path


@contextlib.contextmanager
def served_app(app):
    """The ASGI ``app`` served in a thread of this process by uvicorn with txl serve's own settings
    (:func:`txl_recipes.serve.server.uvicorn_config`) on a free loopback port; yields its base URL."""
    import uvicorn

    from txl_recipes.serve.server import listen, uvicorn_config

    server = uvicorn.Server(uvicorn_config(app))
    sock = listen("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"


def serve_process(*args, env: dict | None = None):
    """``python -m txl serve ARGS --port 0`` in a process of its own (this checkout's src first on the path, torch
    on one thread), answering ``/health``. The port is the one the server announces on stderr: no other process
    (another pytest-xdist worker) can take it between a choice and the bind. Returns the process, its base URL
    and the stderr read so far; the process is killed if it is not up within 60 s."""
    import re
    import subprocess
    import sys

    import httpx

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "txl", "serve", *map(str, args), "--port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        seen = []
        for line in proc.stderr:  # the server announces its address once the model is loaded
            seen.append(line)
            found = re.search(r"txl: serving on (http://\S+:\d+) ", line)
            if found:
                base = found.group(1)
                while True:
                    assert proc.poll() is None, "".join(seen) + proc.stderr.read()
                    with contextlib.suppress(httpx.TransportError):
                        if httpx.get(base + "/health", timeout=2).status_code == 200:
                            return proc, base, "".join(seen)
                    time.sleep(0.2)
        raise AssertionError("txl serve did not start: " + "".join(seen))
    finally:
        watchdog.cancel()


def run_cli(capsys, *argv):
    """Run ``txl ARGV`` in this process: (exit status, stdout, stderr)."""
    from txl.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    """The single ``txl: error:`` line of ``err`` (asserts there is exactly one and no traceback)."""
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert lines[0].startswith("txl: error: ") and "Traceback" not in err
    return lines[0]


def run_segments(model, ids, lengths, mems=None):
    """Feed the first ``sum(lengths)`` columns of ``ids`` through ``model`` in segments of ``lengths``,
    carrying the memory: (logits [B, sum(lengths), V], the last memory)."""
    logits = []
    start = 0
    for n in lengths:
        out = model(ids[:, start:start + n], mems=mems)
        mems = out.mems
        logits.append(out.logits)
        start += n
    return torch.cat(logits, 1), mems
