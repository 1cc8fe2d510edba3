"""txl serve's lifecycle under unlucky timing (issue 23): sessions in use are never lost and a deleted one
never answers 200, compressed memory is refused or counted at start, and a shutdown no client can hold.

Each fault has a test of the reported case and of a sibling of the same kind (traffic faults: test_serve_faults.py).
"""

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from conftest import one_error_line, run_cli, serve_process, tiny_model  # noqa: E402
from test_serve_faults import TEXT, TOK, byte_engine, new_session  # noqa: E402
from txl_recipes.serve.engine import ServeError  # noqa: E402
from txl_recipes.serve.server import listen  # noqa: E402
from txl.training.checkpoint import save_checkpoint  # noqa: E402
from txl.config import RunConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def served():
    from conftest import served_app
    from txl_recipes.serve.app import create_app

    engine = byte_engine()
    with served_app(create_app(engine, max_request_bytes=4 << 20)) as url:
        yield engine, url


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[1], timeout=60) as c:
        yield c


# --- 5, 16. sessions in use are never lost; a deleted one never answers 200 --------------------------------

def test_a_session_with_queued_appends_is_never_evicted():
    engine = byte_engine(max_sessions=2)

    async def run():
        sid = engine.new_session()["id"]
        tasks = [asyncio.create_task(engine.append(sid, f"piece {i};")) for i in range(20)]
        created = 0
        while not all(t.done() for t in tasks):
            engine.new_session()  # evicts a session nobody uses, never the busy one
            created += 1
            await asyncio.sleep(0.0005)  # between the appends' jobs, and between one's end and the next's start
        replies = [t.result() for t in tasks]
        assert created > 20 and engine.store.evicted >= created - 1
        return sid, replies

    sid, replies = asyncio.run(run())
    assert sorted(r["n_tokens"] for r in replies) == [sum(len(f"piece {i};") for i in range(k + 1)) for k in range(20)]
    assert engine.session(sid).state.n_tokens == replies[-1]["n_tokens"]


def test_a_session_with_queued_requests_does_not_expire():
    """Sibling: the idle timeout passes while requests wait for the session."""
    now = [0.0]
    engine = byte_engine(idle_timeout=10)
    engine.store.clock = lambda: now[0]

    async def run():
        sid = engine.new_session()["id"]
        tasks = [asyncio.create_task(engine.append(sid, "abc")) for _ in range(5)]
        await asyncio.sleep(0)
        now[0] = 100.0  # far past the idle timeout, while the appends queue
        assert engine.store.expire() == 0
        return sid, await asyncio.gather(*tasks)

    sid, replies = asyncio.run(run())
    assert replies[-1]["n_tokens"] == 15 and engine.session(sid).state.n_tokens == 15


def test_requests_on_a_session_deleted_meanwhile_get_404_never_200(monkeypatch):
    import txl_recipes.serve.engine as engine_module

    engine = byte_engine()
    reading, release = threading.Event(), threading.Event()
    real_read = engine_module.read_tokens

    def held_read(*args, **kwargs):  # the first job reads only once the session is deleted
        if not reading.is_set():
            reading.set()
            release.wait(10)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(engine_module, "read_tokens", held_read)

    async def run():
        sid = engine.new_session()["id"]
        tasks = [asyncio.create_task(engine.append(sid, TEXT)) for _ in range(3)]
        while not reading.is_set():  # the first is reading, the others wait
            await asyncio.sleep(0.005)
        engine.delete(sid)
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(run())
    assert all(isinstance(r, ServeError) and r.status == 404 and "deleted" in r.message for r in results)


def test_delete_during_a_streamed_generation_ends_it_with_a_session_deleted_event(served, client):
    _, url = served
    sid = new_session(client)
    client.post(f"/v1/sessions/{sid}/append", json={"text": "To be"})
    queued = {}
    with httpx.Client(base_url=url, timeout=60) as streamer:
        with streamer.stream("POST", f"/v1/sessions/{sid}/generate",
                             json={"max_tokens": 4000, "seed": 1, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))

            def queued_append():
                with httpx.Client(base_url=url, timeout=60) as c:
                    queued["r"] = c.post(f"/v1/sessions/{sid}/append", json={"text": "!"})

            waiter = threading.Thread(target=queued_append)
            waiter.start()
            time.sleep(0.2)
            assert client.delete(f"/v1/sessions/{sid}").status_code == 200
            rest = [line for line in lines if line.startswith("data: ")]
    waiter.join()
    assert rest[-1] == "data: [DONE]" and len(rest) < 4000
    last = json.loads(rest[-2][6:])
    assert last["error"]["type"] == "session_deleted" and last["error"]["code"] == 404
    assert queued["r"].status_code == 404
    assert client.get(f"/v1/sessions/{sid}").status_code == 404


def test_a_streamed_generation_refused_before_its_first_token_gets_its_status_not_200(client):
    """The stream's status goes out with its first event: a session that is gone, or holds no text yet,
    answers 404 / 400 as a whole response would, never a 200 stream holding only an error."""
    sid = new_session(client)
    r = client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 3, "stream": True})
    assert r.status_code == 400 and "no text yet" in r.json()["error"]["message"]
    assert client.delete(f"/v1/sessions/{sid}").status_code == 200
    r = client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 3, "stream": True})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"


# --- 14. compressed memory: refused without one, counted in the bound -------------------------------------

def test_cmem_len_without_a_compressed_memory_is_refused_at_start(tmp_path, capsys, monkeypatch):
    from txl_recipes.serve import server

    model = tiny_model(seed=4, dtype=torch.float32, vocab_size=256)
    save_checkpoint(tmp_path / "ckpt", model, TOK, RunConfig(model=model.config), {"step": 0})
    monkeypatch.setattr(server, "serve", lambda *a, **k: pytest.fail("the server must not start"))
    code, _, err = run_cli(capsys, "serve", tmp_path / "ckpt", "--cmem-len", "8")
    assert code == 2 and "cmem_len=8 needs a model with a compressed memory" in one_error_line(err)
    (tmp_path / "doc.txt").write_text(TEXT)  # sibling: scoring is refused by the same one check, before reading
    code, out, err = run_cli(capsys, "score", tmp_path / "ckpt", tmp_path / "doc.txt", "--cmem-len", "8")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1].startswith("txl: error: cmem_len=8 needs a model with a compressed memory")


def test_a_compressive_session_stays_within_its_announced_bound(tmp_path, capsys, monkeypatch):
    from txl_recipes.serve import server

    model = tiny_model(seed=4, dtype=torch.float32, vocab_size=256, mem_len=5, cmem_len=4, cmem_ratio=3)
    run = RunConfig.from_dict({"eval": {"tgt_len": 6, "mem_len": 5}})
    run.model = model.config
    save_checkpoint(tmp_path / "ckpt", model, TOK, run, {"step": 0})
    engines = []
    monkeypatch.setattr(server, "listen", lambda host, port: listen("127.0.0.1", 0))
    monkeypatch.setattr(server, "serve", lambda engine, sock, announce=None, **kw: engines.append((engine, announce))
                        or sock.close() or 0)
    code, _, err = run_cli(capsys, "serve", tmp_path / "ckpt", "--max-pending-bytes", "0")
    assert code == 0, err
    engine, announce = engines[0]
    assert "cmem_len=4" in announce
    # 3 layers x (5 memory + 4 compressed + 2 pending) x d_model 16 x 4 bytes, 6 tail ids
    assert engine.session_bytes == 3 * (5 + 4 + 2) * 16 * 4 + 6 * 8

    async def fill():
        sid = engine.new_session()["id"]
        sizes = []
        for i in range(12):  # the memory, compressed memory and pending states fill up, then stay
            sizes.append((await engine.append(sid, TEXT[i * 7:(i + 1) * 7 + 1]))["memory_bytes"])
        return sizes

    sizes = asyncio.run(fill())
    assert max(sizes) <= engine.session_bytes and max(sizes) > 3 * (5 + 4) * 16 * 4


# --- 4. shutdown: bounded by a timeout; a second signal exits at once -------------------------------------

def _start(tmp_path, *flags):
    model = tiny_model(seed=4, dtype=torch.float32, vocab_size=256)
    ckpt = tmp_path / "ckpt"
    if not ckpt.exists():
        save_checkpoint(ckpt, model, TOK, RunConfig(model=model.config), {"step": 0})
    proc, base, _ = serve_process(ckpt, *flags)
    return proc, int(base.rsplit(":", 1)[1])


def _stuck_clients(port):
    """A client that sent half a body, and one that asked for a long stream and reads nothing."""
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    mute = socket.create_connection(("127.0.0.1", port))
    mute.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"prompt": "x", "max_tokens": 4000, "seed": 1, "stream": True}).encode()
    mute.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return half, mute


@contextlib.contextmanager
def stuck_server(tmp_path, timeout: str):
    """``txl serve --shutdown-timeout TIMEOUT`` in a process of its own, held by two stuck clients;
    yields the process (killed at the end if still alive)."""
    proc, port = _start(tmp_path, "--shutdown-timeout", timeout)
    clients = []
    try:
        clients = _stuck_clients(port)
        time.sleep(0.5)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for c in clients:
            c.close()


def test_sigterm_exits_after_the_shutdown_timeout_whatever_the_clients_do(tmp_path):
    with stuck_server(tmp_path, "1") as proc:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0 and time.monotonic() - t0 < 10
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once(tmp_path, sig):
    with stuck_server(tmp_path, "300") as proc:
        proc.send_signal(sig)
        time.sleep(1.5)
        assert proc.poll() is None  # the graceful shutdown waits for the clients ...
        t0 = time.monotonic()
        proc.send_signal(sig)  # ... until a second signal
        assert proc.wait(timeout=30) == 1 and time.monotonic() - t0 < 10
    err = proc.stderr.read()
    assert "stopped at once by a second signal" in err and "Traceback" not in err
