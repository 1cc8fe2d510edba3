"""txl serve under hostile traffic (issue 23): bounded and linear stop matching off the event loop, bounded
counters, bounded texts read in turns, exact answers at the edges, JSON for malformed HTTP, safe keys.

Each fault has a test of the reported case and of a sibling of the same kind (sessions and shutdown:
test_serve_lifecycle.py).
"""

import asyncio
import contextlib
import json
import logging
import signal
import socket
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
from txl.errors import TxlError  # noqa: E402
from txl.evaluation.scoring import score_tokens  # noqa: E402
from txl.generation import StopText, generate  # noqa: E402
from txl.config import AttentionSpan  # noqa: E402
from txl_recipes.serve import engine as engine_module  # noqa: E402
from txl_recipes.serve.app import create_app  # noqa: E402
from txl_recipes.serve.engine import ServeError  # noqa: E402
from txl_recipes.serve.metrics import Metrics, route_of  # noqa: E402
from txl_recipes.serve.server import build_engine  # noqa: E402
from txl.training.checkpoint import save_checkpoint  # noqa: E402
from txl.config import RunConfig  # noqa: E402

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


def test_stop_text_is_linear_in_the_text_whatever_the_stop_length():
    """A 200,000-character stop that stays one character short of complete for 200,000 one-character pieces
    (the CLI's --stop has no length bound): a matcher that re-checks or copies its held text per piece does
    ~4e10 character steps here (minutes); a linear one a few hundred thousand (well under a second)."""
    n = 200_000
    cut = StopText(["a" * (n - 1) + "b"])
    t0 = time.perf_counter()
    shown = [cut.push("a") for _ in range(n)]
    assert time.perf_counter() - t0 < 10
    assert "".join(shown) == "a" and cut.finish() == "a" * (n - 1)  # all but the possible stop's start is shown


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


def test_requests_beyond_the_concurrency_bound_get_503_and_health_still_answers():
    """Requests in progress hold their bodies: beyond --max-concurrent-requests a request is refused at once."""
    engine = byte_engine()
    with served_app(create_app(engine, max_concurrent_requests=2)) as url, \
            httpx.Client(base_url=url, timeout=60) as c1, httpx.Client(base_url=url, timeout=60) as c2:
        body = {"prompt": "x", "max_tokens": 4000, "seed": 1, "stream": True}
        with c1.stream("POST", "/v1/completions", json=body) as r1, c2.stream("POST", "/v1/completions", json=body) as r2:
            assert r1.status_code == r2.status_code == 200
            r = httpx.post(f"{url}/v1/sessions", timeout=30)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "--max-concurrent-requests" in r.json()["error"]["message"]
            assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        assert httpx.post(f"{url}/v1/sessions", timeout=30).status_code == 201  # the two are done: room again


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
    from txl.cli.common import model_name

    assert model_name(Path("/home/u/runs/cpu-tiny/best")) == "cpu-tiny"
    assert model_name(Path("/home/u/runs/cpu-tiny/last.700")) == "cpu-tiny"
    assert model_name(Path("/home/u/converted")) == "converted"


# --- more hostile bodies: slow, huge in keys, not JSON, NaN; friendly to plain curl ----------------------

def test_a_body_that_stops_arriving_gets_408_and_frees_its_slot():
    engine = byte_engine()
    with served_app(create_app(engine, read_timeout=0.5, max_concurrent_requests=1)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"pro")
            raw = b""
            while b"--read-timeout" not in raw:  # the headers and the body may come in separate packets
                chunk = s.recv(65536)
                if not chunk:
                    break
                raw += chunk
        assert raw.startswith(b"HTTP/1.1 408") and b"--read-timeout" in raw
        assert httpx.post(f"{url}/v1/sessions", timeout=10).status_code == 201  # the one slot is free again


def test_bodies_with_many_keys_or_that_are_not_json_are_refused_off_the_event_loop(served, client):
    _, url = served
    many = "{" + ",".join(f'"k{i}":0' for i in range(290_000)) + "}"
    assert len(many) < 4 << 20
    result = {}

    def send():
        result["r"] = httpx.post(f"{url}/v1/completions", content=many, headers={"content-type": "application/json"},
                                 timeout=60)

    thread = threading.Thread(target=send)
    thread.start()
    worst = 0.0
    while thread.is_alive():
        t0 = time.monotonic()
        assert client.get("/health").status_code == 200
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.02)
    thread.join()
    assert result["r"].status_code == 400 and "290,000 fields" in result["r"].json()["error"]["message"]
    assert worst < 1.0
    for body, words in [("1" * 5000, "not valid JSON"), ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
                        ('["prompt"]', "must be a JSON object, not list"), ("{\"prompt\": \"a\",}", "not valid JSON")]:
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and words in r.json()["error"]["message"], (body[:20], r.text)


def test_non_finite_numbers_are_named_as_such_and_plain_curl_bodies_are_read(client):
    for field in ("temperature", "top_p"):
        r = client.post("/v1/completions", content='{"prompt": "a", "%s": NaN}' % field,
                        headers={"content-type": "application/json"})
        assert r.status_code == 400 and "finite number" in r.json()["error"]["message"], r.text
    # curl -d without -H sends application/x-www-form-urlencoded: the JSON it holds is read as JSON
    r = client.post("/v1/completions", content='{"prompt": "a", "max_tokens": 2, "seed": 1}',
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert client.post("/v1/sessions", json={"x": 1}).status_code == 400  # a route without fields takes none
    assert client.post("/v1/sessions", json={}).status_code == 201


def test_the_bearer_scheme_is_case_insensitive():
    engine = byte_engine()
    with served_app(create_app(engine, api_key="k3y")) as url:
        for header in ("Bearer k3y", "bearer k3y", "BEARER k3y"):
            assert httpx.get(f"{url}/metrics", headers={"Authorization": header}, timeout=10).status_code == 200
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "Basic k3y"}, timeout=10).status_code == 401


def test_sigterm_while_the_model_loads_is_one_line(tmp_path, capsys, monkeypatch):
    """Before uvicorn handles signals, a SIGTERM stops txl serve as an interrupted command, not silently."""
    from txl_recipes.serve import server

    model = tiny_model(seed=4, dtype=torch.float32, vocab_size=256)
    save_checkpoint(tmp_path / "ckpt", model, TOK, RunConfig(model=model.config), {"step": 0})

    class NotHandled(Exception):
        pass

    def unhandled(signum, frame):
        raise NotHandled  # what runs if txl serve installed no handler of its own

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        monkeypatch.setattr(server, "build_engine", lambda *a, **k: signal.raise_signal(signal.SIGTERM))
        code, _, err = run_cli(capsys, "serve", tmp_path / "ckpt")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 130 and err.strip().splitlines()[-1] == "txl: interrupted"


# --- 2b. resident memory: the heap's free pages go back after a large answer ----------------------------

def test_a_large_answer_hands_its_peak_back_and_a_small_one_does_not(served, client, monkeypatch):
    from txl_recipes.serve import app as app_module

    calls = []
    monkeypatch.setattr(app_module, "release_free_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(app_module, "LARGE_ANSWER_BYTES", 4000)
    sid = new_session(client)
    small = client.post(f"/v1/sessions/{sid}/append", json={"text": "ab\n"})
    assert small.status_code == 200 and len(small.content) < 4000 and calls == []
    large = client.post(f"/v1/sessions/{sid}/append", json={"text": TEXT})  # a token entry per byte
    assert large.status_code == 200 and len(large.content) >= 4000
    wait_for(lambda: calls == [1])  # after the answer was sent: a background task
    scored = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 1, "echo": True, "logprobs": 0,
                                                  "seed": 0})
    assert scored.status_code == 200 and len(scored.content) >= 4000  # a scored prompt: a token entry per byte too
    wait_for(lambda: calls == [1, 1])
    assert client.post(f"/v1/sessions/{sid}/append", json={"text": "c\n"}).status_code == 200
    time.sleep(0.2)
    assert calls == [1, 1]


def wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.01)


# --- issue 42: internal errors say nothing of the machine; failed streams end with an event; long ids ------------

class _LogLines(logging.Handler):
    """The records of the server's log (uvicorn's logger, which does not propagate to pytest's)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def server_log():
    """The records of uvicorn's error logger while the block runs (added once the server has started:
    uvicorn's logging set-up replaces the handlers it finds)."""
    handler = _LogLines()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


SECRET = "mixed dtype (CPU) in /home/alice/models/secret-run"


def _failing_after(engine, calls: int, monkeypatch) -> None:
    """The engine's model raises a RuntimeError (whose text names a path) on every call after the first ``calls``."""
    forward, count = type(engine.model).forward.__get__(engine.model), [0]  # the model's own, not a patched one

    def fails(*args, **kwargs):
        count[0] += 1
        if count[0] > calls:
            raise RuntimeError(SECRET)
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", fails)


def _logged(records, request_id: str) -> logging.LogRecord:
    found = [r for r in records if request_id in r.getMessage()]
    assert len(found) == 1 and found[0].exc_info and SECRET in str(found[0].exc_info[1])
    return found[0]


def _internal(body: dict) -> str:
    error = body["error"]
    assert error["code"] == 500 and error["type"] == "internal_error" and SECRET not in json.dumps(body)
    assert "RuntimeError" not in error["message"] and error["request_id"] in error["message"]
    return error["request_id"]


def test_an_internal_error_is_a_500_with_a_request_id_and_the_details_in_the_log(monkeypatch):
    engine = byte_engine()
    with served_app(create_app(engine)) as url, httpx.Client(base_url=url, timeout=30) as c, server_log() as log:
        sid = new_session(c)
        _failing_after(engine, 0, monkeypatch)
        r = c.post("/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 3})
        assert r.status_code == 500 and r.headers["x-request-id"] == _internal(r.json())
        _logged(log, r.headers["x-request-id"])
        r = c.post(f"/v1/sessions/{sid}/append", json={"text": "some text"})  # sibling: a session's append
        assert r.status_code == 500
        _logged(log, _internal(r.json()))
        assert c.get("/health").status_code == 200  # on the same keep-alive connection
        assert len(log) == 2  # each failure logged once (uvicorn's own report of it left out)


def _events(c, path: str, body: dict) -> list:
    with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def test_a_stream_that_fails_ends_with_an_error_event_never_a_cut_connection(monkeypatch):
    engine = byte_engine()
    with served_app(create_app(engine)) as url, httpx.Client(base_url=url, timeout=30) as c, server_log() as log:
        sid = new_session(c)
        assert c.post(f"/v1/sessions/{sid}/append", json={"text": "ROMEO: "}).status_code == 200
        _failing_after(engine, 3, monkeypatch)  # the prompt's segment and two tokens, then the failure
        events = _events(c, "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 20, "stream": True})
        assert events[-1] == "[DONE]" and len(events) >= 3
        assert all("choices" in json.loads(e) for e in events[:-2])  # the tokens drawn before the failure
        _logged(log, _internal(json.loads(events[-2])))
        _failing_after(engine, 2, monkeypatch)  # sibling: a session's streamed generation
        events = _events(c, f"/v1/sessions/{sid}/generate", {"max_tokens": 20, "stream": True})
        assert events[-1] == "[DONE]" and json.loads(events[0])["object"] == "session.token"
        _logged(log, _internal(json.loads(events[-2])))


def test_bf16_weights_with_a_float16_server_dtype_are_refused_when_the_engine_is_built():
    from txl.kernels.int8 import to_bfloat16

    model = to_bfloat16(tiny_model(seed=3, dtype=torch.float32, vocab_size=256))
    with pytest.raises(TxlError, match="bfloat16 weights cannot run with dtype float16"):
        build_engine(model, TOK, span=SPAN, dtype="float16")
    assert build_engine(model, TOK, span=SPAN, dtype="bfloat16").dtype == "bfloat16"


def _raw_answer(port: int, request: bytes, piece: int) -> tuple[bytes, bytes]:
    """Send ``request`` in pieces of ``piece`` bytes (pausing between them, so the server reads it in
    parts); the answer's head and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for start in range(0, len(request), piece):
            s.sendall(request[start:start + piece])
            if piece < len(request):
                time.sleep(0.001)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, body


def test_no_error_answer_quotes_more_than_about_100_characters_of_the_request(served, client):
    port = int(served[1].rsplit(":", 1)[1])
    request = f"GET /v1/sessions/{'a' * 100_000} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    for piece in (len(request), 4096):  # the reported case, a 100 KB id: at once, and read in parts
        head, body = _raw_answer(port, request, piece)
        message = json.loads(body)["error"]["message"]
        assert head.startswith(b"HTTP/1.1 404") and "(100,000 characters)" in message and len(message) < 400, piece
    long_id = "b" * 50_000  # siblings (httpx sends at most 64 KB of URL)
    for method, path, body in (("DELETE", f"/v1/sessions/{long_id}", None),
                               ("POST", f"/v1/sessions/{long_id}/append", {"text": "x"}),
                               ("POST", "/v1/completions", {"prompt": "x", long_id: 1})):
        r = client.request(method, path, json=body)
        message = r.json()["error"]["message"]
        assert r.status_code in (400, 404) and "b" * 120 not in message and len(message) < 400, (method, message)
        assert "(50,00" in message and "characters)" in message, message  # (the key's colon may count)
    spaced = "b " * 20_000  # a field name with spaces: cut where the message is written
    r = client.post("/v1/completions", json={"prompt": "x", spaced: 1})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "(40,000 characters)" in message and len(message) < 300, message[:400]


def test_the_server_limits_have_one_set_of_defaults_and_rules(capsys, tmp_path):
    """ServeConfig holds the limits' defaults and rules: the flags, build_engine, serve and the session
    store take both from it, and each refusal names the flag on the command line, the field in Python."""
    import dataclasses
    import inspect

    from txl.cli import build_parser
    from txl_recipes.serve.config import ServeConfig
    from txl_recipes.serve.server import serve
    from txl_recipes.serve.sessions import SessionStore

    defaults = ServeConfig()
    args = build_parser().parse_args(["serve", str(tmp_path)])
    taken = {**inspect.signature(build_engine).parameters, **inspect.signature(serve).parameters}
    for field in dataclasses.fields(ServeConfig):
        assert getattr(args, field.name) == getattr(defaults, field.name), field.name
        assert taken[field.name].default == getattr(defaults, field.name), field.name
    for flag, value, message in [("--max-sessions", "0", "--max-sessions must be >= 1, got 0"),
                                 ("--idle-timeout", "0", "--idle-timeout must be > 0 seconds, got 0.0"),
                                 ("--max-tokens", "-1", "--max-tokens must be >= 0, got -1"),
                                 ("--max-request-bytes", "0", "--max-request-bytes must be >= 1, got 0"),
                                 ("--read-timeout", "0", "--read-timeout must be > 0 seconds, got 0.0"),
                                 ("--shutdown-timeout", "-1", "--shutdown-timeout must be >= 0 seconds, got -1.0")]:
        code, _, err = run_cli(capsys, "serve", tmp_path, flag, value)  # refused before the checkpoint is read
        assert code == 2 and one_error_line(err) == f"txl: error: {message}"
    model = tiny_model(seed=3, vocab_size=256)
    with pytest.raises(TxlError, match=r"^max_tokens must be >= 0, got -1$"):
        build_engine(model, TOK, span=SPAN, max_tokens=-1)
    with pytest.raises(TxlError, match=r"^max_request_tokens must be an integer, got 2.5$"):
        build_engine(model, TOK, span=SPAN, max_request_tokens=2.5)
    with pytest.raises(TxlError, match=r"^idle_timeout must be a finite number, got nan$"):
        SessionStore(max_sessions=2, idle_timeout=float("nan"))
    with pytest.raises(TxlError, match=r"^max_concurrent_requests must be >= 1, got 0$"):
        serve(None, None, max_concurrent_requests=0)
