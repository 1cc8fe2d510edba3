"""txl serve, tested as a client would: the real server on a loopback port, spoken to over HTTP with httpx.

References are the library functions the server must agree with, run in this process on a copy of
the model: ``generate`` (same seed), ``score_tokens(carry_memory=True)`` (what ``txl score
--carry-memory`` computes) and, in the subprocess test, the ``txl score --carry-memory`` command itself.
"""

import copy
import json
import math
import signal
import threading
import time

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from conftest import run_cli, serve_process, served_app, tiny_model  # noqa: E402
from txl.data import ByteTokenizer  # noqa: E402
from txl_recipes.serve.cursor import TextCursor  # noqa: E402
from txl.evaluation.scoring import score_tokens, token_text  # noqa: E402
from txl.generation import generate  # noqa: E402
from txl.config import AttentionSpan  # noqa: E402
from txl_recipes.serve.app import create_app  # noqa: E402
from txl_recipes.serve.server import build_engine, listen  # noqa: E402
from txl_recipes.serve.sessions import SessionState, SessionStore, StoreFull, read_tokens  # noqa: E402
from txl.training.checkpoint import save_checkpoint  # noqa: E402
from txl.config import RunConfig  # noqa: E402

SPAN = AttentionSpan(tgt_len=6, mem_len=10)
TEXT = ("Transformer-XL reads text segment by segment; the memory carries the past. "
        "Café, naïve, 日本語 — bytes of every length.\n" * 3)
TOK = ByteTokenizer()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one thread


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3, dtype=torch.float64, vocab_size=256)


@pytest.fixture(scope="module")
def ref(model):
    """A copy of the served model for the references (never touched by the server's thread)."""
    return copy.deepcopy(model)


@pytest.fixture(scope="module")
def url(model):
    """The real server (uvicorn, in a thread of this process) serving a float64 byte model on a free port."""
    engine = build_engine(model, TOK, span=SPAN, max_sessions=40, idle_timeout=300, max_tokens=5000)
    with served_app(create_app(engine, max_request_bytes=20000)) as base:
        yield base


@pytest.fixture
def client(url):
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def ids_of(text):
    return TOK.encode(text)


def reference_generate(ref, prompt_ids, n, seed, **sampling):
    gen = torch.Generator().manual_seed(seed)
    out = generate(ref, torch.as_tensor(prompt_ids)[None], n, generator=gen, span=SPAN, **sampling)
    return out[0, len(prompt_ids):].tolist()


def reference_scores(ref, ids):
    """Per-token log-probabilities of one stream (NaN first), as txl score --carry-memory computes them."""
    (s,) = score_tokens(ref, [ids], carry_memory=True, span=SPAN)
    return s.logprobs


def new_session(client):
    r = client.post("/v1/sessions")
    assert r.status_code == 201, r.text
    return r.json()["id"]


def append(client, sid, text, **extra):
    r = client.post(f"/v1/sessions/{sid}/append", json={"text": text, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def logprobs_of(reply):
    return [math.nan if t["logprob"] is None else t["logprob"] for t in reply["tokens"]]


# --- stateless completions ------------------------------------------------------------------------

@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9),
                                      dict(temperature=0.0), dict(temperature=1.3, top_k=20),
                                      dict(temperature=0.0, no_repeat_ngram_size=2),
                                      dict(temperature=0.8, top_k=12, repetition_penalty=1.5)])
def test_completion_equals_generate_with_the_same_seed(client, ref, sampling):
    prompt = TEXT[:40]
    body = {"prompt": prompt, "max_tokens": 25, "seed": 11, "logprobs": 0, **sampling}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    expected = reference_generate(ref, ids_of(prompt), 25, 11, **sampling)
    assert choice["logprobs"]["tokens"] == [token_text(TOK, i) for i in expected]
    assert choice["text"] == TOK.decode(expected) and choice["finish_reason"] == "length"
    assert r.json()["usage"] == {"prompt_tokens": len(ids_of(prompt)), "completion_tokens": 25,
                                 "total_tokens": len(ids_of(prompt)) + 25}
    # each sampled token's log-probability: the model's, from one causal pass over everything before it
    # (prompt + sample fit in the memory here, so every earlier token is visible)
    short = reference_generate(ref, ids_of(prompt[:3]), 6, 11, **sampling)
    r = client.post("/v1/completions", json={**body, "prompt": prompt[:3], "max_tokens": 6})
    lps = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    all_ids = torch.as_tensor([*ids_of(prompt[:3]), *short])[None]
    with torch.no_grad():
        full = torch.log_softmax(ref(all_ids[:, :-1], span=AttentionSpan(64, 64)).logits[0], -1)
    expected_lp = [float(full[2 + k, t]) for k, t in enumerate(short)]
    assert lps == pytest.approx(expected_lp, abs=1e-10)


def test_completion_stop_strings_and_echo_scores(client, ref):
    prompt = TEXT[:30]
    full = TOK.decode(reference_generate(ref, ids_of(prompt), 40, 5, temperature=0.0))
    stop = full[7:9]  # a string the greedy sample contains
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 40, "seed": 5, "temperature": 0,
                                             "stop": [stop, "\u2603never"]})
    choice = r.json()["choices"][0]
    assert choice["text"] == full[:full.index(stop)] and choice["finish_reason"] == "stop"
    # min_tokens (the decoding rules' min_new_tokens): stop strings count only from that many tokens on
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 40, "seed": 5, "temperature": 0,
                                             "stop": [stop], "min_tokens": 40})
    choice = r.json()["choices"][0]
    assert choice["text"] == full and choice["finish_reason"] == "length"
    # echo + logprobs with max_tokens 0 scores the prompt: the stateless way to read a history
    r = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 0})
    choice = r.json()["choices"][0]
    assert choice["text"] == TEXT
    got = [math.nan if v is None else v for v in choice["logprobs"]["token_logprobs"]]
    np.testing.assert_allclose(got, reference_scores(ref, ids_of(TEXT)), atol=1e-10)


def test_streaming_delivers_tokens_as_they_are_drawn(client, url, ref):
    before = client.get("/metrics").json()["tokens_generated"]
    body = {"prompt": "x", "max_tokens": 4000, "seed": 1, "stream": True}
    with httpx.Client(base_url=url, timeout=60) as streamer:
        with streamer.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            event = json.loads(first[len("data: "):])
            assert event["object"] == "text_completion" and event["choices"][0]["finish_reason"] is None
            # the first token arrived while the generation was still far from done
            during = client.get("/metrics").json()["tokens_generated"] - before
            assert 1 <= during < 4000
    # the client went away: the generation stops, and the server goes on serving
    time.sleep(0.5)
    settled = client.get("/metrics").json()["tokens_generated"] - before
    time.sleep(0.5)
    assert client.get("/metrics").json()["tokens_generated"] - before == settled < 4000
    r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3, "seed": 2, "stream": True})
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) == 3 + 2  # 3 tokens, the finish event, [DONE]
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == TOK.decode(reference_generate(ref, ids_of("ab"), 3, 2))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 3


# --- sessions -------------------------------------------------------------------------------------

def test_append_in_100_pieces_equals_scoring_the_whole_stream(client, ref):
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, len(TEXT)), size=99, replace=False))
    pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)])]
    sid = new_session(client)
    got, surprise = [], 0.0
    for piece in pieces:
        reply = append(client, sid, piece)
        assert reply["pending_text"] == "" and [t["id"] for t in reply["tokens"]] == ids_of(piece).tolist()
        got += logprobs_of(reply)
        surprise += reply["surprise_bits"]
    expected = reference_scores(ref, ids_of(TEXT))
    np.testing.assert_allclose(got, expected, atol=1e-10)
    assert math.isnan(got[0]) and surprise == pytest.approx(-np.nansum(expected) / math.log(2), rel=1e-10)
    assert client.get(f"/v1/sessions/{sid}").json()["n_tokens"] == len(ids_of(TEXT))


@pytest.mark.parametrize("span", [AttentionSpan(6, 10), AttentionSpan(6, 10, same_length=True),
                                  AttentionSpan(5, 3, clamp_len=2), AttentionSpan(4, 0), AttentionSpan(1, 7)])
def test_read_tokens_keeps_the_segment_grid(ref, span):
    """Any cut of the stream gives the whole stream's scores, for spans with same_length, clamping,
    memory shorter than a segment, no memory, one-token segments."""
    ids = ids_of(TEXT[:70])
    (whole,) = score_tokens(ref, [ids], carry_memory=True, span=span)
    state, got = SessionState(TextCursor(TOK)), []
    for a, b in [(0, 1), (1, 1), (1, 9), (9, 10), (10, 30), (30, 31), (31, 70)]:
        lp, state = read_tokens(ref, state, ids[a:b], span=span)
        got += lp.tolist()
        assert 1 <= state.tail.size <= span.tgt_len and state.n_tokens == b
    np.testing.assert_allclose(got, whole.logprobs, atol=1e-10)


def test_two_interleaved_sessions_give_what_each_gives_alone(client):
    texts = {"a": ["The memory of ", "session A, ", "and more of A."], "b": ["B's text is ", "different: ", "xyz"]}

    def run(order):
        sids = {k: new_session(client) for k in texts}
        out = {k: [] for k in texts}
        for key, step in order:
            if step < 3:
                reply = append(client, sids[key], texts[key][step])
                out[key].append((logprobs_of(reply), reply["n_tokens"]))
            else:
                r = client.post(f"/v1/sessions/{sids[key]}/generate", json={"max_tokens": 12, "seed": step})
                assert r.status_code == 200, r.text
                out[key].append((r.json()["text"], [t["id"] for t in r.json()["tokens"]], r.json()["session"]["n_tokens"]))
        for sid in sids.values():
            assert client.delete(f"/v1/sessions/{sid}").status_code == 200
        return out

    steps = [0, 1, 3, 2, 4]
    interleaved = run([(k, s) for s in steps for k in ("a", "b")])
    alone = run([(k, s) for k in ("a", "b") for s in steps])
    assert interleaved == alone
    assert interleaved["a"] != interleaved["b"]


def test_session_generation_continues_the_memory(client, ref):
    sid = new_session(client)
    for piece in (TEXT[:33], TEXT[33:50]):
        append(client, sid, piece)
    r = client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 15, "seed": 9, "temperature": 0.9})
    reply = r.json()
    expected = reference_generate(ref, ids_of(TEXT[:50]), 15, 9, temperature=0.9)
    assert [t["id"] for t in reply["tokens"]] == expected and reply["text"] == TOK.decode(expected)
    assert reply["session"]["n_tokens"] == 50 + 15  # the sample joined the session
    # the session now reads on after its own sample, exactly as a stream holding both
    more = append(client, sid, TEXT[50:60])
    stream = np.concatenate([ids_of(TEXT[:50]), expected, ids_of(TEXT[50:60])])
    np.testing.assert_allclose(logprobs_of(more), reference_scores(ref, stream)[-10:], atol=1e-10)
    # append=false leaves the session as it was
    r = client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 4, "seed": 1, "append": False})
    assert r.json()["session"]["n_tokens"] == 75


def test_16_concurrent_clients_all_get_correct_answers(url, ref):
    n_clients, errors = 16, []
    words = ["alpha ", "beta ", "gamma ", "delta ", "é ", "\n"]
    plans = []
    for i in range(n_clients):
        text = "".join(words[(i * j + j) % len(words)] for j in range(8 + i % 5)) + f"client {i}."
        cuts = sorted({len(text) // 4 * k for k in (1, 2, 3)})
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        ids = ids_of(text)
        plans.append((pieces, reference_scores(ref, ids), reference_generate(ref, ids, 6, 100 + i),
                      reference_generate(ref, ids_of(text[:12]), 5, i)))

    def client_loop(i):
        pieces, scores, sample, completion = plans[i]
        try:
            with httpx.Client(base_url=url, timeout=60) as c:
                for _ in range(2):  # a bounded loop of requests per client
                    sid = new_session(c)
                    got = []
                    for piece in pieces:
                        got += logprobs_of(append(c, sid, piece))
                    np.testing.assert_allclose(got, scores, atol=1e-10)
                    r = c.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 6, "seed": 100 + i})
                    assert [t["id"] for t in r.json()["tokens"]] == sample
                    r = c.post("/v1/completions", json={"prompt": "".join(pieces)[:12], "max_tokens": 5, "seed": i,
                                                         "logprobs": 0})
                    assert r.json()["choices"][0]["logprobs"]["tokens"] == [token_text(TOK, t) for t in completion]
                    assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        except Exception as err:  # reported below, with the client's number
            errors.append((i, repr(err)))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == []


def test_bad_requests_and_unknown_sessions_get_clean_4xx(client):
    sid = new_session(client)
    cases = [
        ("POST", "/v1/completions", b"{not json", 400, "not valid JSON"),
        ("POST", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("POST", "/v1/completions", {"prompt": 5}, 400, "prompt"),
        ("POST", "/v1/completions", {"prompt": "a", "max_tokens": "3"}, 400, "max_tokens"),
        ("POST", "/v1/completions", {"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 5001}, 400, "--max-tokens"),
        ("POST", "/v1/completions", {"prompt": "a", "temperature": -1}, 400, "temperature"),
        ("POST", "/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p"),
        ("POST", "/v1/completions", {"prompt": "a", "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
        ("POST", "/v1/completions", {"prompt": "a", "top_k": 0}, 400, "top_k must be an integer >= 1"),
        ("POST", f"/v1/sessions/{sid}/generate", {"temperature": -0.5}, 400, "temperature must be a finite number"),
        ("POST", "/v1/completions", {"prompt": "a", "repetition_penalty": 0}, 400, "repetition_penalty"),
        ("POST", "/v1/completions", {"prompt": "a", "no_repeat_ngram_size": -1}, 400, "no_repeat_ngram_size"),
        ("POST", "/v1/completions", {"prompt": "a", "min_tokens": -2}, 400, "min_tokens"),
        ("POST", "/v1/completions", {"prompt": "a", "n": 2}, 400, "n"),
        ("POST", "/v1/completions", {"prompt": "a", "bogus": 1}, 400, "bogus"),
        ("POST", "/v1/completions", {"prompt": ""}, 400, "empty"),
        ("POST", "/v1/completions", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ("POST", "/v1/completions", {"prompt": "\ud800"}, 400, "surrogate"),
        ("POST", "/v1/completions", {"prompt": "a" * 30000}, 413, "--max-request-bytes"),
        ("POST", f"/v1/sessions/{sid}/append", {"text": 3}, 400, "text"),
        ("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 2}, 400, "no text yet"),
        ("POST", "/v1/sessions/nope/append", {"text": "a"}, 404, "no session"),
        ("POST", "/v1/sessions/nope/generate", {"max_tokens": 2}, 404, "no session"),
        ("POST", "/v1/sessions/nope/generate", {"max_tokens": 2, "stream": True}, 404, "no session"),
        ("GET", "/v1/sessions/nope", None, 404, "no session"),
        ("DELETE", "/v1/sessions/nope", None, 404, "no session"),
        ("GET", "/v2/anything", None, 404, "Not Found"),
        ("GET", "/v1/completions", None, 405, "Method Not Allowed"),
    ]
    for method, path, body, status, words in cases:
        if isinstance(body, bytes):
            r = client.request(method, path, content=body, headers={"content-type": "application/json"})
        elif body is not None:
            r = client.request(method, path, content=json.dumps(body), headers={"content-type": "application/json"})
        else:
            r = client.request(method, path)
        assert r.status_code == status, (path, body, r.text)
        error = r.json()["error"]
        assert words in error["message"] and error["code"] == status, (path, body, error)
    assert append(client, sid, "still fine")["n_tokens"] == 10  # the refused requests changed nothing
    stats = client.get("/metrics").json()
    assert stats["responses_by_status"]["404"] >= 6 and stats["queue_length"] == 0
    # n_layer * mem_len * d_model * float64, the tail's ids (tgt_len int64), the pending text's bound
    assert stats["session_memory_bytes_max_each"] == 3 * 10 * 16 * 8 + 6 * 8 + 65536


def test_session_store_is_bounded_lru_and_expires():
    now = [0.0]
    store = SessionStore(max_sessions=2, idle_timeout=10, clock=lambda: now[0])
    state = SessionState(TextCursor(TOK))
    a, b = store.create(state), store.create(state)
    now[0] = 1
    assert store.get(a.id) is a  # a is now the most recently used
    c = store.create(state)  # evicts b, the least recently used
    assert store.get(b.id) is None and store.evicted == 1 and len(store) == 2
    assert a.id != c.id and len(a.id) >= 20
    now[0] = 5
    store.get(c.id)
    now[0] = 11.5  # a idle for 10.5 s, c for 6.5 s
    assert store.expire() == 1 and store.get(a.id) is None and store.get(c.id) is c

    c.users += 1  # a request holds or waits for c: only sessions nobody uses are evicted
    d = store.create(state)
    d.users += 1
    with pytest.raises(StoreFull):
        store.create(state)
    c.users -= 1
    d.users -= 1
    assert store.get(c.id) is c


# --- the command, in a process of its own ---------------------------------------------------------

def test_txl_serve_command_matches_txl_score_and_stops_cleanly_on_sigterm(tmp_path, capsys):
    """`txl serve` (API key, float32 checkpoint) agrees with `txl score --carry-memory`, and SIGTERM lets a
    streaming request in progress finish before the process exits with status 0."""
    model = tiny_model(seed=4, dtype=torch.float32, vocab_size=256)
    run = RunConfig.from_dict({"eval": {"tgt_len": 6, "mem_len": 10}})
    run.model = model.config
    save_checkpoint(tmp_path / "ckpt", model, TOK, run, {"step": 0})
    (tmp_path / "doc.txt").write_text(TEXT, encoding="utf-8")
    code, out, err = run_cli(capsys, "score", tmp_path / "ckpt", tmp_path / "doc.txt", "--carry-memory")
    assert code == 0, err
    expected = [math.nan if t["logprob"] is None else t["logprob"] for t in json.loads(out)["tokens"]]

    proc, base, started = serve_process(tmp_path / "ckpt", env={"TXL_API_KEY": "k3y"})
    try:
        assert httpx.post(base + "/v1/sessions").status_code == 401
        with httpx.Client(base_url=base, timeout=60, headers={"Authorization": "Bearer k3y"}) as c:
            sid = new_session(c)
            cuts = np.linspace(0, len(TEXT), 101).astype(int)
            got = []
            for a, b in zip(cuts, cuts[1:]):
                got += logprobs_of(append(c, sid, TEXT[a:b]))
            np.testing.assert_allclose(got, expected, atol=2e-5)
            # a long streaming generation is in progress when SIGTERM arrives: it still completes
            with c.stream("POST", f"/v1/sessions/{sid}/generate", json={"max_tokens": 200, "seed": 1,
                                                                         "stream": True}) as r:
                lines = r.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                proc.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and len(rest) == 199 + 2
        assert json.loads(rest[-2][6:])["session"]["n_tokens"] == len(ids_of(TEXT)) + 200
        assert proc.wait(timeout=30) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(base + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = started + proc.stderr.read()
    assert "txl: serving on http://127.0.0.1:" in err and "Traceback" not in err


def test_an_empty_api_key_is_refused(capsys, tmp_path):
    from conftest import one_error_line, run_cli

    code, _, err = run_cli(capsys, "serve", tmp_path, "--api-key", "")
    assert code == 2 and "--api-key is empty" in one_error_line(err)


def test_generate_without_append_keeps_the_pending_text():
    """A char model's session holding a lone "\\r" (perhaps half of a CRLF) keeps it pending through a
    generation with append=false: "\\r" then "\\nor not" still reads as one line end."""
    import asyncio

    from txl.data.tokenizers.simple import CharTokenizer
    from txl.generation import DecodingRules
    from txl_recipes.serve.engine import SamplingParams

    tok = CharTokenizer.build("To be\nor not")
    engine = build_engine(tiny_model(seed=2, vocab_size=len(tok.chars)), tok, span=SPAN, max_sessions=2,
                          idle_timeout=300, max_tokens=50)

    async def run():
        sid = engine.new_session()["id"]
        await engine.append(sid, "To be\r")
        async for _ in engine.generate(sid, SamplingParams(max_tokens=3, rules=DecodingRules(temperature=0.0)), append=False):
            pass
        assert engine.describe(engine.session(sid))["pending_text"] == "\r"
        return await engine.append(sid, "\nor not")

    reply = asyncio.run(run())
    assert reply["n_tokens"] == len(tok.encode("To be\r\nor not")) == 12


def test_serve_refuses_one_session_beyond_memory_and_notes_many(tmp_path, capsys, monkeypatch):
    """One session whose full memory cannot fit is refused at start; sessions that could only all together
    outgrow the memory start the server with a note on stderr."""
    from conftest import one_error_line, run_cli
    from txl import runtime
    from txl_recipes.serve import server

    model = tiny_model(seed=4, dtype=torch.float32, vocab_size=256)
    run = RunConfig.from_dict({"eval": {"tgt_len": 6, "mem_len": 10}})
    run.model = model.config
    save_checkpoint(tmp_path / "ckpt", model, TOK, run, {"step": 0})
    served = []
    monkeypatch.setattr(server, "listen", lambda host, port: listen("127.0.0.1", 0))
    def fake_serve(engine, sock, **kw):
        served.append(engine)
        sock.close()
        return 0

    monkeypatch.setattr(server, "serve", fake_serve)
    per_session = 3 * 16 * 1000 * 4 + 6 * 8 + 65536  # n_layer * d_model * mem_len * float32, tail ids, pending text
    monkeypatch.setattr(runtime, "available_memory_bytes", lambda *device: per_session * 10)
    code, _, err = run_cli(capsys, "serve", tmp_path / "ckpt", "--mem-len", "100000")
    assert code == 2 and "one session with mem_len 100,000 would hold" in one_error_line(err)
    code, _, err = run_cli(capsys, "serve", tmp_path / "ckpt", "--mem-len", "1000", "--max-sessions", "11")
    assert code == 0 and len(served) == 1, err
    assert "txl: note: 11 sessions with full memories would hold" in err
    code, _, err = run_cli(capsys, "serve", tmp_path / "ckpt", "--mem-len", "1000", "--max-sessions", "10")
    assert code == 0 and len(served) == 2 and "txl: note" not in err


def test_a_request_the_memory_cannot_hold_is_a_503_and_the_session_stays(client, monkeypatch):
    """An allocation failure inside a request (a text too long for the memory left) answers 503 with a
    message, not 500, and the session keeps its text."""
    from txl_recipes.serve import engine as engine_module

    sid = client.post("/v1/sessions").json()["id"]
    assert client.post(f"/v1/sessions/{sid}/append", json={"text": "To be"}).status_code == 200
    before = client.get(f"/v1/sessions/{sid}").json()

    def allocate(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 81920008192 bytes")

    monkeypatch.setattr(engine_module, "read_tokens", allocate)
    r = client.post(f"/v1/sessions/{sid}/append", json={"text": ", or not"})
    assert r.status_code == 503 and "not enough memory" in r.json()["error"]["message"]
    monkeypatch.undo()
    assert client.get(f"/v1/sessions/{sid}").json() == before


def test_a_whole_response_stops_generating_when_its_client_leaves(client, url):
    """A non-streaming completion whose client gave up stops generating (as a stream does), instead of
    running to max_tokens for nobody."""
    before = client.get("/metrics").json()["tokens_generated"]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/completions", json={"prompt": "To be", "max_tokens": 5000, "seed": 1}, timeout=0.5)
    time.sleep(1.0)
    stopped = client.get("/metrics").json()["tokens_generated"]
    time.sleep(0.5)
    assert client.get("/metrics").json()["tokens_generated"] == stopped < before + 5000


@pytest.mark.parametrize("length", [5, 50], ids=["no-complete-segment", "memory-and-tail"])
def test_a_compiled_engine_samples_what_the_eager_one_does(ref, length):
    """``txl serve --compile``: a session's memory and tail read into the ring, then sampled by the compiled step; the tokens
    of :func:`generate` on the whole text with the same seed (float64: no rounding between the two)."""
    import asyncio

    from txl.generation import DecodingRules
    import torch._dynamo
    from torch._dynamo.utils import counters

    from txl_recipes.serve.engine import Piece, SamplingParams

    torch._dynamo.reset()
    counters.clear()
    engine = build_engine(copy.deepcopy(ref), TOK, span=SPAN, max_sessions=2, idle_timeout=300, max_tokens=50,
                          compile="aot_eager")
    assert counters["stats"]["unique_graphs"] == 1  # the step, compiled before any request

    async def run():
        sid = engine.new_session()["id"]
        await engine.append(sid, TEXT[:length])
        params = SamplingParams(max_tokens=15, seed=9, rules=DecodingRules(temperature=0.9))
        return [piece.token async for piece in engine.generate(sid, params, append=False) if isinstance(piece, Piece)]

    got = asyncio.run(run())
    assert got == reference_generate(ref, ids_of(TEXT[:length]), 15, 9, temperature=0.9)
    assert counters["stats"]["unique_graphs"] == 1  # the request ran the same graph


def test_a_fine_tuned_model_ends_its_sample_at_the_end_marker(ref):
    """As txl generate: the end marker ends the text (finish "stop", not shown) and min_new_tokens holds it back."""
    import asyncio

    from txl.data.pairs import find_markers
    from txl.generation import DecodingRules
    from txl_recipes.serve.engine import Piece, SamplingParams

    model = copy.deepcopy(ref)
    end = find_markers(TOK).end_id
    with torch.no_grad():
        model.crit.out_layers[0].bias[end] = 50.0  # the end marker first, then "x"
        model.crit.out_layers[0].bias[ord("x")] = 40.0
    engine = build_engine(model, TOK, span=SPAN, max_sessions=2, idle_timeout=300, max_tokens=50, end_ids=(end,))

    async def run(min_new_tokens):
        sid = engine.new_session()["id"]
        await engine.append(sid, "ab")
        params = SamplingParams(max_tokens=6, rules=DecodingRules(temperature=0, min_new_tokens=min_new_tokens))
        return [piece async for piece in engine.generate(sid, params, append=False) if isinstance(piece, Piece)]

    pieces = asyncio.run(run(0))
    assert [(p.text, p.token, p.stopped) for p in pieces] == [("", end, True)]
    pieces = asyncio.run(run(3))
    assert "".join(p.text for p in pieces) == "xxx" and pieces[-1].token == end and pieces[-1].stopped
