"""txl serve under hostile and unlucky traffic: bounded work per job, bounded counters, sessions that are
never lost while in use, a shutdown no client can hold, and exact answers at the edges (issue 23).

Each fault has a test of the reported case and of a sibling of the same kind.
"""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from conftest import one_error_line, run_cli, served_app, tiny_model  # noqa: E402
from txl.data import ByteTokenizer  # noqa: E402
from txl.data.tokenizers.simple import WordTokenizer  # noqa: E402
from txl.evaluation.scoring import score_tokens  # noqa: E402
from txl.generation import StopText, generate  # noqa: E402
from txl.model.span import AttentionSpan  # noqa: E402
from txl.serving import engine as engine_module  # noqa: E402
from txl.serving.app import create_app  # noqa: E402
from txl.serving.engine import ServeError  # noqa: E402
from txl.serving.metrics import Metrics, route_of  # noqa: E402
from txl.serving.server import build_engine, listen  # noqa: E402
from txl.training.checkpoint import save_checkpoint  # noqa: E402
from txl.training.config import RunConfig  # noqa: E402

SPAN = AttentionSpan(tgt_len=6, mem_len=10)
TOK = ByteTokenizer()
TEXT = "Transformer-XL reads text segment by segment; the memory carries the past.\n" * 4

pytestmark = pytest.mark.usefixtures("one_thread")


def byte_engine(**kw):
    kw = {"span": SPAN, "max_sessions": 8, "idle_timeout": 300, "max_tokens": 5000, **kw}
    return build_engine(tiny_model(seed=3, dtype=torch.float64, vocab_size=256), TOK, **kw)


@pytest.fixture(scope="module")
def served():
    engine = byte_engine()
    with served_app(create_app(engine, max_request_bytes=4 << 20)) as url:
        yield engine, url


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served[1], timeout=60) as c:
        yield c


def new_session(c):
    r = c.post("/v1/sessions")
    assert r.status_code == 201, r.text
    return r.json()["id"]


# --- 1. stop strings: bounded, linear, off the event loop; one matcher everywhere -------------------------

def test_a_megabyte_stop_string_is_refused_at_once_and_the_server_stays_responsive(client):
    t0 = time.monotonic()
    r = client.post("/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 2, "seed": 1, "stop": "Q" * 1_000_000})
    assert r.status_code == 400 and "at most 1000 characters" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": "a", "stop": ["x", ""]})
    assert r.status_code == 400 and "must not be empty" in r.json()["error"]["message"]
    assert client.get("/health").status_code == 200 and time.monotonic() - t0 < 5


def test_health_answers_quickly_while_long_stop_strings_are_matched(served, client):
    """Sibling: 4 stops of the largest allowed length, on a long generation. The matching runs on the model
    thread, one token at a time, so /health (on the event loop) never waits for it."""
    _, url = served
    stops = ["ab" * 499 + "c", "\x00" * 1000, "xyz" * 333, "é" * 1000]
    result = {}

    def long_request():
        with httpx.Client(base_url=url, timeout=120) as c:
            result["r"] = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1500, "seed": 1, "stop": stops})

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(0.3)
    worst = 0.0
    while thread.is_alive():
        t0 = time.monotonic()
        assert client.get("/health").status_code == 200
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.05)
    thread.join()
    assert result["r"].status_code == 200 and worst < 1.0


def _brute_cut(text, stops):
    hits = [(k + len(s), k) for s in stops if (k := text.find(s)) >= 0]
    return text[:min(hits)[1]] if hits else text


@pytest.mark.parametrize("cut_every", [1, 2, 3, 7, 1000])
def test_stop_text_equals_a_brute_force_cut_on_self_overlapping_stops(cut_every):
    """The KMP matcher against ``str.find`` on stops whose failure links matter (aab in aaab, abab...)."""
    rng = np.random.default_rng(cut_every)
    for _ in range(200):
        text = "".join(rng.choice(list("ab"), size=int(rng.integers(0, 40))))
        stops = ["".join(rng.choice(list("ab"), size=int(rng.integers(1, 6)))) for _ in range(int(rng.integers(1, 4)))]
        cut = StopText(stops)
        shown = "".join(cut.push(text[i:i + cut_every]) for i in range(0, len(text), cut_every)) + cut.finish()
        assert shown == _brute_cut(text, stops), (text, stops)
    # the case where the two matchers disagreed: "bcd" complete at the same place as nothing earlier
    for pieces in (["abcd"], ["abc", "d"], ["a", "b", "c", "d"]):
        cut = StopText(["bcd", "c"])
        assert "".join(cut.push(p) for p in pieces) + cut.finish() == "ab"


def test_stop_text_holds_back_only_what_may_still_become_a_stop():
    cut = StopText(["END"])
    assert cut.push("abE") == "ab" and cut.push("x") == "Ex"  # "Ex" can no longer start END
    cut = StopText(["Q" * 1000])
    assert cut.push("QQQa") == "QQQa"  # a long stop holds back only a matching tail
    assert cut.push("QQ") == "" and cut.finish() == "QQ"


# --- 2. metrics stay bounded ----------------------------------------------------------------------------

def test_metrics_keys_stay_few_whatever_the_paths_methods_and_keys():
    engine = byte_engine()
    with served_app(create_app(engine, api_key="s3cret")) as url, httpx.Client(base_url=url, timeout=30) as c:
        for i in range(600):
            c.get(f"/nowhere/{i}")  # unauthenticated 401s on unique paths
        for i in range(200):
            c.request(f"FOO{i}", f"/v1/sessions/{i}/append", headers={"Authorization": "Bearer s3cret"})
            c.get(f"/v1/sessions/{i}x/generate/{i}", headers={"Authorization": "Bearer s3cret"})
        m = c.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    stats = m.json()
    assert set(stats["requests"]) <= {"GET other", "OTHER /v1/sessions/{id}/append", "GET /metrics"}
    assert stats["requests"]["GET other"] == 800 and stats["requests"]["OTHER /v1/sessions/{id}/append"] == 200
    assert set(stats["responses_by_status"]) <= {"401", "404", "405", "200"} and len(m.content) < 2000


def test_route_templates_and_the_token_window_are_fixed_sizes():
    assert route_of("POST", "/v1/sessions/abc/append") == "POST /v1/sessions/{id}/append"
    assert route_of("DELETE", "/v1/sessions/abc") == "DELETE /v1/sessions/{id}"
    assert route_of("BREW", "/v1/sessions/abc/x") == "OTHER other"
    now = [0.0]
    m = Metrics(window=60, clock=lambda: now[0])
    for step in range(100_000):  # 100,000 tokens over 1,000 s
        now[0] = step / 100
        m.add_tokens(generated=1)
    assert len(m._recent._stamp) == 60 and m.tokens_generated == 100_000
    assert m.tokens_per_s() == pytest.approx(100, rel=0.02)  # the last 60 s hold ~6,000 tokens
    now[0] += 120  # nothing for two minutes
    assert m.tokens_per_s() == 0


# --- 3. pending text bounded; long texts read in turns ---------------------------------------------------

def test_a_word_session_refuses_an_unbounded_unfinished_line():
    tok = WordTokenizer.build(["the cat sat on the mat\n"])
    engine = build_engine(tiny_model(seed=1, vocab_size=tok.vocab_size), tok, span=SPAN, max_sessions=2,
                          idle_timeout=300, max_pending_bytes=1000)

    async def run():
        sid = engine.new_session()["id"]
        await engine.append(sid, "the cat " * 100)  # 800 bytes pending: allowed
        with pytest.raises(ServeError) as err:
            await engine.append(sid, "sat " * 60)  # 1,040 bytes: refused, the session as it was
        assert err.value.status == 413 and "--max-pending-bytes" in err.value.message
        assert engine.describe(engine.session(sid))["pending_text"] == "the cat " * 100
        with pytest.raises(ServeError) as err:  # sibling: one append alone over the bound
            await engine.append(engine.new_session()["id"], "mat " * 300)
        assert err.value.status == 413
        return await engine.append(sid, "on the mat\n")  # the line ends: everything is decided

    reply = asyncio.run(run())
    assert reply["pending_text"] == "" and reply["n_tokens"] == 200 + 3 + 1


def test_a_long_append_is_read_in_turns_and_scores_as_one_read(served, client, monkeypatch):
    """A long append is a sequence of jobs of whole segments: another client's append finishes while it
    runs, and its scores equal one read of the whole stream."""
    engine, url = served
    sizes = []
    read = engine_module.read_tokens

    def recording(model, state, ids, **kw):
        sizes.append(len(ids))
        time.sleep(0.01)  # makes the long append last long enough to interleave
        return read(model, state, ids, **kw)

    monkeypatch.setattr(engine_module, "read_tokens", recording)
    long_text = TEXT * 25  # 7,600 bytes: ~30 jobs
    sid, other = new_session(client), new_session(client)
    done = {}

    def long_append():
        with httpx.Client(base_url=url, timeout=120) as c:
            done["long"] = c.post(f"/v1/sessions/{sid}/append", json={"text": long_text})
            done["long_at"] = time.monotonic()

    thread = threading.Thread(target=long_append)
    thread.start()
    time.sleep(0.2)
    r = client.post(f"/v1/sessions/{other}/append", json={"text": "a short line\n"})
    short_at = time.monotonic()
    thread.join()
    assert r.status_code == 200 and done["long"].status_code == 200
    assert short_at < done["long_at"]  # it did not wait for the whole long append
    budget = (256 // SPAN.tgt_len) * SPAN.tgt_len + 1
    assert max(sizes) <= budget and sum(sizes) >= len(long_text)
    ids = TOK.encode(long_text)
    (whole,) = score_tokens(engine.model, [ids], carry_memory=True, span=SPAN)
    got = [np.nan if t["logprob"] is None else t["logprob"] for t in done["long"].json()["tokens"]]
    np.testing.assert_allclose(got, whole.logprobs, atol=1e-10)


def test_texts_over_the_token_bound_are_refused_before_any_work():
    engine = byte_engine(max_request_tokens=100)
    with served_app(create_app(engine)) as url, httpx.Client(base_url=url, timeout=30) as c:
        sid = new_session(c)
        r = c.post(f"/v1/sessions/{sid}/append", json={"text": "x" * 101})
        assert r.status_code == 413 and "--max-request-tokens" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": "x" * 101})  # sibling: a prompt
        assert r.status_code == 413 and c.get(f"/v1/sessions/{sid}").json()["n_tokens"] == 0
        assert c.get("/metrics").json()["tokens_read"] == 0


def test_a_long_prompt_is_read_in_jobs_and_samples_as_generate(served, client, monkeypatch):
    engine, _ = served
    prompt = TEXT * 3  # 912 tokens: longer than one job
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "seed": 3, "logprobs": 0})
    gen = torch.Generator().manual_seed(3)
    ids = torch.as_tensor(TOK.encode(prompt))[None]
    expected = generate(engine.model, ids, 8, generator=gen, span=SPAN)[0, ids.size(1):].tolist()
    assert r.json()["choices"][0]["text"] == TOK.decode(expected)


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


def test_requests_on_a_session_deleted_meanwhile_get_404_never_200():
    engine = byte_engine()

    async def run():
        sid = engine.new_session()["id"]
        tasks = [asyncio.create_task(engine.append(sid, TEXT)) for _ in range(3)]
        await asyncio.sleep(0.05)  # the first is reading, the others wait
        engine.delete(sid)
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


# --- 13. finish_reason at the last allowed token --------------------------------------------------------

def test_a_stop_completed_by_the_last_allowed_token_finishes_with_stop(served, client):
    engine, _ = served
    prompt, n = "To be, or", 12
    gen = torch.Generator().manual_seed(0)
    ids = torch.as_tensor(TOK.encode(prompt))[None]
    sample = TOK.decode(generate(engine.model, ids, n, temperature=0.0, generator=gen, span=SPAN)[0, ids.size(1):].tolist())
    stop = next(sample[-k:] for k in range(1, n + 1) if sample[-k:] not in sample[:-1])  # first seen at the end
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stop": stop}
    r = client.post("/v1/completions", json=body).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["text"] == sample[:-len(stop)]
    events = [json.loads(x[6:]) for x in client.post("/v1/completions", json={**body, "stream": True}).text.splitlines()
              if x.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    r = client.post("/v1/completions", json={**body, "stop": "\x00never"}).json()["choices"][0]
    assert r["finish_reason"] == "length" and r["text"] == sample
    sid = new_session(client)  # sibling: a session's generation, whole and streamed
    client.post(f"/v1/sessions/{sid}/append", json={"text": prompt})
    gen_body = {"max_tokens": n, "temperature": 0, "stop": stop, "append": False}
    assert client.post(f"/v1/sessions/{sid}/generate", json=gen_body).json()["finish_reason"] == "stop"
    events = client.post(f"/v1/sessions/{sid}/generate", json={**gen_body, "stream": True}).text.splitlines()
    assert json.loads([e for e in events if "session.generation" in e][0][6:])["finish_reason"] == "stop"


# --- 11, 15. JSON for malformed HTTP; keys compared as bytes; nothing internal without the key ----------

def test_malformed_http_gets_a_json_error(served):
    _, url = served
    port = int(url.rsplit(":", 1)[1])
    for request in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):  # sibling: a header without a colon
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(request)
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower()
        assert json.loads(body)["error"]["code"] == 400


def test_api_keys_are_ascii_compared_as_bytes_and_health_keeps_internals_for_key_holders(tmp_path, capsys):
    for key in ("clé", " k3y", "k3y\n"):
        code, _, err = run_cli(capsys, "serve", tmp_path, "--api-key", key)
        assert code == 2 and "--api-key must be printable ASCII" in one_error_line(err)
    engine = byte_engine(name="tiny")
    with served_app(create_app(engine, api_key="k3y")) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/health").json() == {"status": "ok"}
        full = c.get("/health", headers={"Authorization": "Bearer k3y"}).json()
        assert full["model"] == "tiny" and full["vocab_size"] == 256
        assert c.get("/metrics", headers={"Authorization": "Bearer k3Y"}).status_code == 401
        assert c.get("/metrics", headers={"Authorization": b"Bearer k3y\xc3\xa9"}).status_code == 401


def test_the_model_name_is_the_run_not_a_path():
    from txl.cli.serve import model_name

    assert model_name(Path("/home/u/runs/cpu-tiny/best")) == "cpu-tiny"
    assert model_name(Path("/home/u/runs/cpu-tiny/last.700")) == "cpu-tiny"
    assert model_name(Path("/home/u/converted")) == "converted"


# --- 14. compressed memory: refused without one, counted in the bound -------------------------------------

def test_cmem_len_without_a_compressed_memory_is_refused_at_start(tmp_path, capsys, monkeypatch):
    from txl.serving import server

    model = tiny_model(seed=4, dtype=torch.float32, vocab_size=256)
    save_checkpoint(tmp_path / "ckpt", model, TOK, RunConfig(model=model.config), {"step": 0})
    monkeypatch.setattr(server, "serve", lambda *a, **k: pytest.fail("the server must not start"))
    code, _, err = run_cli(capsys, "serve", tmp_path / "ckpt", "--cmem-len", "8")
    assert code == 2 and "--cmem-len 8 needs a model with a compressed memory" in one_error_line(err)


def test_a_compressive_session_stays_within_its_announced_bound(tmp_path, capsys, monkeypatch):
    from txl.serving import server

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
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "txl", "serve", str(ckpt), "--port", str(port), *flags],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, port
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "txl serve did not start"
        time.sleep(0.2)


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


def test_a_second_sigterm_exits_at_once(tmp_path):
    with stuck_server(tmp_path, "300") as proc:
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)
        assert proc.poll() is None  # the graceful shutdown waits for the clients ...
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # ... until a second signal
        assert proc.wait(timeout=30) == 1 and time.monotonic() - t0 < 10
    err = proc.stderr.read()
    assert "stopped at once by a second signal" in err and "Traceback" not in err
