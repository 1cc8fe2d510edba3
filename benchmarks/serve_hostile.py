"""`txl serve` under hostile traffic: does it stay responsive, and does its memory stay flat?

Builds a word-level model (random weights, the default model's shape: 4 layers, d_model 256) on a
vocabulary of the Python standard library's words, starts `txl serve` on it with an API key, and
sends --requests requests from --clients threads, cycling through the kinds a red team used:

- unique paths without the key (401), custom methods on session routes, unknown routes;
- completions with 4 stop strings of the longest allowed length, and with a 1 MB stop string (400);
- session churn past --max-sessions (evictions), deletes;
- appends of 20 kB without a newline to one session (its pending text grows to the bound, then 413);
- streamed generations the client abandons after the first event;
- every 1,000 requests, one append of the largest allowed text to a new session (a long sequence of
  model jobs that must interleave with everyone else's).

A monitor thread times GET /health every 0.1 s throughout; the server's resident memory (VmRSS)
is read every 500 requests. The JSON written with --json holds the RSS curve, the /health
latencies (max, 99th percentile, while long appends ran), the statuses, and /metrics at the end.

    python benchmarks/serve_hostile.py --json benchmarks/results/cpu-serve-hostile.json

Needs the serve extra and httpx.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

KEY = "hostile-bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_checkpoint(folder: Path) -> str:
    """A word-level model with the default model's shape and random weights (memory, not quality, is measured)."""
    import torch

    from txl.data.files import default_corpus_files
    from txl.data.tokenizers.simple import WordTokenizer
    from txl.model import TransformerXLConfig, TransformerXLLM
    from txl.training.checkpoint import save_checkpoint
    from txl.config import RunConfig

    texts = [p.read_text(encoding="utf-8", errors="replace") for p in default_corpus_files()[:20]]
    tok = WordTokenizer.build(texts, max_size=8000)
    torch.manual_seed(0)
    config = TransformerXLConfig(vocab_size=tok.vocab_size, n_layer=4, d_model=256, n_head=8, d_head=32,
                                 d_inner=1024, tgt_len=64, mem_len=256)
    model = TransformerXLLM(config)
    run = RunConfig.from_dict({"eval": {"tgt_len": 64, "mem_len": 256}})
    run.model = config
    save_checkpoint(folder / "ckpt", model, tok, run, {"step": 0})
    return str(folder / "ckpt")


def start_server(ckpt: str, port: int, max_sessions: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "TXL_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "txl", "serve", ckpt, "--port", str(port), "--max-sessions",
                             str(max_sessions), "--threads", "1"], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"txl serve exited with status {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("txl serve did not start within 120 s")


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` in bytes (0 where the system does not say)."""
    from txl.runtime import resident_bytes

    return resident_bytes(pid) or 0


def one_request(c: httpx.Client, i: int, shared: dict) -> int:
    """Request number ``i`` of the hostile mix; returns its status (0 for an abandoned stream)."""
    kind = i % 10
    if kind == 0:
        return c.get(f"/nowhere/{i}").status_code  # no key, a path never seen
    if kind == 1:
        return c.request(f"X{i % 97}", f"/v1/sessions/s{i}/append", headers=AUTH).status_code
    if kind == 2:
        stops = ["Q" * 1000, "é" * 1000, "ab" * 500, "\n" * 1000]
        return c.post("/v1/completions", headers=AUTH, json={"prompt": "def main ( ) :", "max_tokens": 4,
                                                             "seed": i, "stop": stops}).status_code
    if kind == 3:
        return c.post("/v1/completions", headers=AUTH,
                      json={"prompt": "x", "max_tokens": 2, "stop": "Q" * 1_000_000}).status_code
    if kind == 4:  # churn: a new session each time, past --max-sessions
        r = c.post("/v1/sessions", headers=AUTH)
        if r.status_code == 201:
            sid = r.json()["id"]
            c.post(f"/v1/sessions/{sid}/append", headers=AUTH, json={"text": "import os\nimport sys\n"})
            if i % 20 == 4:
                c.delete(f"/v1/sessions/{sid}", headers=AUTH)
        return r.status_code
    if kind == 5:  # one session's unfinished line grows to the bound, then is refused
        r = c.post(f"/v1/sessions/{shared['pending']}/append", headers=AUTH, json={"text": "word " * 4000})
        if r.status_code == 404:  # evicted while idle between our requests: start another
            fresh = c.post("/v1/sessions", headers=AUTH)
            if fresh.status_code == 201:
                shared["pending"] = fresh.json()["id"]
        return r.status_code
    if kind == 6:  # a stream abandoned after its first event
        with c.stream("POST", "/v1/completions", headers=AUTH,
                      json={"prompt": "class A :", "max_tokens": 2000, "stream": True, "seed": i}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
        return 0
    if kind == 7:
        return c.get("/metrics", headers=AUTH).status_code
    if kind == 8:
        return c.delete(f"/v1/sessions/never{i}", headers=AUTH).status_code
    return c.get("/health").status_code


def long_append(c: httpx.Client, windows: list) -> int:
    """The longest allowed append (131,072 words) to a session of its own; its time window is kept when it
    was read (200), for the /health latencies while long appends ran."""
    r = c.post("/v1/sessions", headers=AUTH)
    if r.status_code != 201:
        return r.status_code
    sid = r.json()["id"]
    try:
        t0 = time.monotonic()
        r = c.post(f"/v1/sessions/{sid}/append", headers=AUTH, json={"text": "return self\n" * 43690 + "pass"})
        if r.status_code == 200:
            windows.append((t0, time.monotonic()))
        return r.status_code
    finally:
        c.delete(f"/v1/sessions/{sid}", headers=AUTH)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-sessions", type=int, default=16)
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(Path(tmp))
        port = free_port()
        proc = start_server(ckpt, port, args.max_sessions)
        base = f"http://127.0.0.1:{port}"
        try:
            result = run(base, proc.pid, args)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    result["server_exit_status"] = proc.returncode
    text = json.dumps(result, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("rss_curve", "metrics")}, indent=1))
    if args.json:
        Path(args.json).write_text(text + "\n")


def run(base: str, pid: int, args) -> dict:
    statuses: Counter = Counter()  # HTTP status, 0 for an abandoned stream, or a client error's name
    latencies: list[tuple[float, float]] = []  # (time, /health seconds)
    long_windows: list[tuple[float, float]] = []
    stop = threading.Event()
    lock = threading.Lock()
    counter = {"next": 0}

    def monitor():
        with httpx.Client(base_url=base, timeout=60) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                c.get("/health")
                latencies.append((t0, time.monotonic() - t0))
                time.sleep(0.1)

    with httpx.Client(base_url=base, timeout=120) as c:
        shared = {"pending": c.post("/v1/sessions", headers=AUTH).json()["id"]}
    rss = [(0, rss_bytes(pid))]

    def worker():
        with httpx.Client(base_url=base, timeout=300) as c:
            while True:
                with lock:
                    i = counter["next"]
                    counter["next"] += 1
                if i >= args.requests:
                    return
                try:
                    status = long_append(c, long_windows) if i % 1000 == 250 else one_request(c, i, shared)
                except Exception as e:  # noqa: BLE001 - counted by kind, never fatal to the load generator
                    status = type(e).__name__
                with lock:
                    statuses[status] += 1
                    if i % 500 == 499:
                        rss.append((i + 1, rss_bytes(pid)))

    mon = threading.Thread(target=monitor, daemon=True)
    mon.start()
    t_start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t_start
    if sum(statuses.values()) != args.requests:
        raise SystemExit(f"only {sum(statuses.values())} of {args.requests} requests were counted: a client died")
    stop.set()
    mon.join()
    with httpx.Client(base_url=base, timeout=60) as c:
        metrics = c.get("/metrics", headers=AUTH)
    during_long = [s for t, s in latencies if any(a <= t <= b for a, b in long_windows)]
    health = sorted(s for _, s in latencies)
    warm = min(1000, rss[-1][0])  # the RSS after the first 1,000 requests: caches and arenas warmed up
    after_warmup = [b for n, b in rss if n >= warm]
    return {
        "requests": args.requests, "clients": args.clients, "wall_s": round(wall, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))},
        "health_checks": len(health), "health_max_s": round(health[-1], 4),
        "health_p99_s": round(health[int(0.99 * (len(health) - 1))], 4),
        "health_median_s": round(statistics.median(health), 4),
        "health_checks_during_long_appends": len(during_long),
        "health_max_s_during_long_appends": round(max(during_long), 4) if during_long else None,
        "long_appends": len(long_windows),
        "long_append_s": [round(b - a, 2) for a, b in long_windows],
        "rss_warmup_requests": warm,
        "rss_mib_after_warmup": round(after_warmup[0] / 2**20, 1),
        "rss_mib_at_end": round(rss[-1][1] / 2**20, 1),
        "rss_mib_max_after_warmup": round(max(after_warmup) / 2**20, 1),
        "metrics_body_bytes": len(metrics.content),
        "rss_curve": [[n, round(b / 2**20, 1)] for n, b in rss],
        "metrics": metrics.json(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_flags": sorted(f for f in _cpu_flags() if f.startswith(("avx", "amx"))),
    }


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


if __name__ == "__main__":
    main()
