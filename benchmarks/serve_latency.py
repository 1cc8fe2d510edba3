"""Latency per appended line against the history length: a `txl serve` session vs re-sending the history.

Starts `txl serve RUN` on a free loopback port and streams the Python standard library's source
into one session, file by file, line by line (POST /v1/sessions/ID/append), timing every line.
At each history length of --points it also times, for the next --repeats lines, what a stateless
server must do to score the same line: re-send the whole history plus the line
(POST /v1/completions with echo and logprobs, max_tokens 0), alternating the two kinds of
request so that both see the same load (the machine may be shared), and reports medians. The two
answers' log-probabilities of the line are compared (they must agree). The most surprising lines
of the stream (bits per byte) are listed. ``--generate N`` then times N greedy session generations;
``--serve-args`` passes more arguments to ``txl serve`` (``--quantize int8``: docs/quantization.md).

    python benchmarks/serve_latency.py RUN --json benchmarks/results/cpu-serve-latency.json \\
        --plot docs/images/serve-latency.png

Needs the serve and plot extras (FastAPI, uvicorn, httpx, matplotlib).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from txl.analysis.plots import pyplot, save_figure  # noqa: E402
from txl.data.files import default_corpus_files  # noqa: E402
from txl.errors import TxlError  # noqa: E402


def plot_serve_latency(session: tuple[list[int], list[float]], session_medians: tuple[list[int], list[float]],
                       stateless: tuple[list[int], list[float]], path, title: str = "") -> dict:
    """Latency of one appended line against the history length, for a ``txl serve`` session and for
    re-sending the whole history (a stateless server), log-log, as a PNG (docs/serving.md).

    Args:
        session: (history length in tokens, latency in ms) of every appended line (drawn as dots).
        session_medians: (history length, median latency in ms) of the session at the measured points.
        stateless: (history length, median latency in ms) of the stateless requests at the same points.

    Returns the plotted series ``{"session": ..., "session_medians": ..., "stateless": ...}``.

    Raises:
        TxlError: series whose two lists differ in length, or matplotlib missing.
    """
    series = {"session": session, "session_medians": session_medians, "stateless": stateless}
    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise TxlError(f"{name}: {len(xs)} history lengths but {len(ys)} latencies")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.2, 3.9))
    ax.scatter([max(x, 1) for x in session[0]], session[1], s=2, alpha=0.25, color="tab:blue",
               label="session: every appended line")
    ax.plot(session_medians[0], session_medians[1], marker="o", color="tab:blue", label="session (median)")
    ax.plot(stateless[0], stateless[1], marker="s", color="tab:red", label="stateless: re-send the history (median)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("history before the line (tokens)")
    ax.set_ylabel("latency per appended line (ms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    save_figure(fig, path)
    return series


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: str, port: int, threads: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-m", "txl", "serve", run, "--port", str(port), *extra], env=env)
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


def stdlib_lines(skip_fraction: float):
    """(file name, line number, line text) of the standard library's *.py files in sorted order, starting
    at the file where the last ``skip_fraction`` of the corpus bytes begins (the default corpus's
    held-out test split starts there)."""
    files = default_corpus_files()
    sizes = [f.stat().st_size for f in files]
    start, total, acc = 0, sum(sizes), 0
    for i, size in enumerate(sizes):
        if acc + size > total * (1 - skip_fraction):
            start = i
            break
        acc += size
    for f in files[start:]:
        text = f.read_text(encoding="utf-8", errors="surrogateescape")
        for number, line in enumerate(text.splitlines(keepends=True), 1):
            yield f.name, number, line


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1e3, result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a byte-level txl run or checkpoint directory")
    p.add_argument("--tokens", type=int, default=100_000, help="history to reach, in tokens (default 100000)")
    p.add_argument("--points", default="1000,3000,10000,30000,100000",
                   help="history lengths at which the stateless requests are timed")
    p.add_argument("--repeats", type=int, default=5, help="lines timed both ways at each point (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server (default 1)")
    p.add_argument("--held-out", type=float, default=0.05,
                   help="start at the file where this last fraction of the standard library begins (default 0.05)")
    p.add_argument("--top", type=int, default=10, help="surprising lines to list (default 10)")
    p.add_argument("--serve-args", default="", help="more txl serve arguments, e.g. '--quantize int8'")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="then time N greedy session generations of --generate-tokens tokens (default 0: none)")
    p.add_argument("--generate-tokens", type=int, default=32, metavar="T", help="tokens per generation (default 32)")
    p.add_argument("--json", default=None, help="write the measurements here")
    p.add_argument("--plot", default=None, help="draw the plot here (PNG)")
    args = p.parse_args()
    points = sorted(int(v) for v in args.points.split(","))

    port = free_port()
    proc = start_server(args.run, port, args.threads, tuple(args.serve_args.split()))
    lines, session_points, stateless_points, mismatch = [], [], [], 0.0
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
            health = c.get("/health").json()
            if health["tokenizer"] != "byte":
                raise SystemExit("this benchmark counts bytes: give a byte-level run")
            sid = c.post("/v1/sessions").json()["id"]
            history, text, pending = 0, [], list(points)
            source = stdlib_lines(args.held_out)
            while history < args.tokens or pending:  # the last point may lie at --tokens itself
                point = pending[0] if pending and history >= pending[0] else None
                pairs = []
                for _ in range(args.repeats if point is not None else 1):
                    name, number, line = next(source)
                    if point is not None:  # stateless first, then the session, line by line
                        prompt = "".join(text) + line
                        t_stateless, reply = timed(lambda: c.post("/v1/completions", json={
                            "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0}))
                        reply.raise_for_status()
                        stateless_lp = reply.json()["choices"][0]["logprobs"]["token_logprobs"]
                    t_session, reply = timed(lambda: c.post(f"/v1/sessions/{sid}/append", json={"text": line}))
                    reply.raise_for_status()
                    body = reply.json()
                    n = len(body["tokens"])
                    lines.append({"file": name, "line": number, "history": history, "n_tokens": n,
                                  "ms": t_session, "bits": body["surprise_bits"], "bpb": body["bits_per_token"],
                                  "text": line.rstrip("\n")})
                    if point is not None:
                        tail = stateless_lp[len(stateless_lp) - n:]
                        mine = [t["logprob"] for t in body["tokens"]]
                        mismatch = max([mismatch] + [abs(a - b) for a, b in zip(tail, mine)
                                                     if a is not None and b is not None])
                        pairs.append((t_session, t_stateless, history))
                    history += n
                    text.append(line)
                if point is not None:
                    pending.pop(0)
                    row = {"point": point, "history": pairs[0][2],
                           "session_ms": statistics.median(a for a, _, _ in pairs),
                           "stateless_ms": statistics.median(b for _, b, _ in pairs),
                           "session_all_ms": [a for a, _, _ in pairs], "stateless_all_ms": [b for _, b, _ in pairs]}
                    stateless_points.append(row)
                    print(f"history {row['history']:7d} tokens: session {row['session_ms']:8.1f} ms/line, "
                          f"stateless {row['stateless_ms']:9.1f} ms/line ({row['stateless_ms'] / row['session_ms']:.0f}x)",
                          flush=True)
            generations = []
            for _ in range(args.generate):  # the session's memory holds the whole stream; nothing appended
                ms, reply = timed(lambda: c.post(f"/v1/sessions/{sid}/generate", json={
                    "max_tokens": args.generate_tokens, "temperature": 0, "append": False}))
                reply.raise_for_status()
                generations.append(ms)
            if generations:
                print(f"session generation of {args.generate_tokens} tokens: median "
                      f"{statistics.median(generations):.1f} ms ({generations})", flush=True)
            metrics = c.get("/metrics").json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    # the session's curve: medians of the lines between consecutive measured points
    bounds = [0, *points]
    for lo, hi in zip(bounds, bounds[1:]):
        ms = [r["ms"] for r in lines if lo <= r["history"] < hi]
        if ms:
            session_points.append({"from": lo, "to": hi, "lines": len(ms), "median_ms": statistics.median(ms)})
    scored = [r for r in lines if r["bpb"] is not None and len(r["text"].strip()) >= 16]
    top = sorted(scored, key=lambda r: -r["bpb"])[:args.top]
    result = {"run": args.run, "health": health, "tokens": history, "lines": len(lines),
              "repeats": args.repeats, "server_threads": args.threads, "serve_args": args.serve_args,
              "generate_tokens": args.generate_tokens, "generate_ms": generations, "max_logprob_difference": mismatch,
              "points": stateless_points, "session_bins": session_points,
              "stream_bpb": sum(r["bits"] for r in lines) / max(1, history - 1), "most_surprising": top,
              "server_metrics": metrics, "per_line": [[r["history"], round(r["ms"], 3)] for r in lines]}
    print(f"\n{len(lines)} lines, {history} tokens; session and stateless log-probabilities differ by at most "
          f"{mismatch:.2e} nats; stream {result['stream_bpb']:.3f} bpb")
    print("\n| history (tokens) | session (ms/line) | stateless (ms/line) | ratio |\n|---|---|---|---|")
    for r in stateless_points:
        print(f"| {r['history']:,} | {r['session_ms']:.1f} | {r['stateless_ms']:.1f} | "
              f"{r['stateless_ms'] / r['session_ms']:.0f}x |")
    print("\n| bpb | file:line | text |\n|---|---|---|")
    for r in top:
        print(f"| {r['bpb']:.2f} | {r['file']}:{r['line']} | `{r['text'].strip()[:70]}` |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.plot:
        plot_serve_latency(([r["history"] for r in lines], [r["ms"] for r in lines]),
                           ([r["history"] for r in stateless_points], [r["session_ms"] for r in stateless_points]),
                           ([r["history"] for r in stateless_points], [r["stateless_ms"] for r in stateless_points]),
                           args.plot, title=f"txl serve, {health['n_layer']} layers, d_model {health['d_model']}, "
                                            f"mem_len {health['span']['mem_len']}, {args.threads} thread(s)")
    return 0 if math.isfinite(mismatch) else 1


if __name__ == "__main__":
    sys.exit(main())
