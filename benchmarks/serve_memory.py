"""Where does `txl serve`'s resident memory go after long appends? Python objects against the C heap.

Starts `txl serve` (the word-level model of serve_hostile.py: random weights, the default model's
shape) in a child process that answers two signals: SIGUSR2 starts ``tracemalloc``, SIGUSR1 writes
one JSON line with the Python objects still alive since then (``tracemalloc`` current and peak, the
five largest allocation sites) and the resident memory (VmRSS). Then it warms the server up with
--warmup completions, starts tracing, and sends --appends appends of the largest allowed text
(131,072 words, each to a session of its own), reading both figures after each.

It does this twice: with the server as shipped (after an answer of 1 MiB or more the C heap's free
pages go back to the system, ``txl_recipes.serve.heap.release_free_memory``) and with that step turned off
(``--keep`` runs only the second, ``--shipped`` only the first). A leak shows as Python objects that stay alive or
resident memory that grows append after append; a high-water mark as a rise that stops.

    python benchmarks/serve_memory.py --json benchmarks/results/cpu-serve-memory.json

Needs the serve extra and httpx.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_hostile import AUTH, KEY, build_checkpoint, free_port, long_append, rss_bytes  # noqa: E402


def child(report: str, keep: bool, argv: list[str]) -> int:
    """The server process: ``txl serve ARGV`` with the two signals (and the release turned off with ``keep``)."""
    import tracemalloc

    def write_report(*_):
        line = {"rss_mib": round(rss_bytes(os.getpid()) / 2**20, 1), "tracing": tracemalloc.is_tracing()}
        if tracemalloc.is_tracing():
            current, peak = tracemalloc.get_traced_memory()
            top = tracemalloc.take_snapshot().statistics("lineno")[:5]
            line.update(python_alive_mib=round(current / 2**20, 2), python_peak_mib=round(peak / 2**20, 1),
                        python_alive_top=[f"{s.traceback[0].filename.split('/')[-1]}:{s.traceback[0].lineno} "
                                          f"{s.size} B in {s.count}" for s in top])
        with open(report, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    signal.signal(signal.SIGUSR1, write_report)
    signal.signal(signal.SIGUSR2, lambda *_: tracemalloc.start(4))
    if keep:
        from txl_recipes.serve import app

        app.release_free_memory = lambda: False
    from txl.cli import main as txl_main

    return txl_main(argv)


def measure(ckpt: str, keep: bool, args) -> dict:
    """Warm-up, tracing on, then the long appends; the child's report after each phase."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TXL_API_KEY": KEY}
        cmd = [sys.executable, __file__, "--child", str(report), *(["--keep"] if keep else []), "--", "serve", ckpt,
               "--port", str(port), "--threads", "1"]
        proc = subprocess.Popen(cmd, env=env)
        base = f"http://127.0.0.1:{port}"
        phases = []

        def snapshot(label: str, seconds: float = 0.0):
            n = len(report.read_text().splitlines()) if report.exists() else 0
            os.kill(proc.pid, signal.SIGUSR1)
            while not report.exists() or len(report.read_text().splitlines()) == n:
                time.sleep(0.2)
            phases.append({"phase": label, "seconds": round(seconds, 1),
                           **json.loads(report.read_text().splitlines()[-1])})
            print(phases[-1], flush=True)

        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(base + "/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("txl serve did not start")
                time.sleep(0.3)
            with httpx.Client(base_url=base, timeout=900) as c:
                snapshot("started")
                t0 = time.monotonic()
                for i in range(args.warmup):
                    r = c.post("/v1/completions", headers=AUTH,
                               json={"prompt": "def main ( ) :", "max_tokens": 4, "seed": i})
                    assert r.status_code == 200, r.text
                snapshot(f"{args.warmup} completions", time.monotonic() - t0)
                os.kill(proc.pid, signal.SIGUSR2)
                time.sleep(1)
                snapshot("tracing on")
                for k in range(args.appends):
                    t0 = time.monotonic()
                    status = long_append(c, [])
                    assert status == 200, status
                    snapshot(f"long append {k + 1}", time.monotonic() - t0)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return {"release_after_large_answers": not keep, "phases": phases}


def main() -> None:
    if "--child" in sys.argv:
        i, end = sys.argv.index("--child"), sys.argv.index("--")
        sys.exit(child(sys.argv[i + 1], "--keep" in sys.argv[:end], sys.argv[end + 1:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--appends", type=int, default=3, help="long appends (131,072 words each)")
    p.add_argument("--warmup", type=int, default=200, help="completions before tracing starts")
    p.add_argument("--keep", action="store_true", help="only the run with the release turned off")
    p.add_argument("--shipped", action="store_true", help="only the run of the server as shipped")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(Path(tmp))
        modes = (True,) if args.keep else (False,) if args.shipped else (False, True)
        runs = [measure(ckpt, keep, args) for keep in modes]
    result = {"appends": args.appends, "warmup_completions": args.warmup, "runs": runs,
              "python": sys.version.split()[0]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
