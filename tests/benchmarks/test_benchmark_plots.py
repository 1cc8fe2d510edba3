"""The plot a benchmark script draws (benchmarks/serve_latency.py)."""

import sys
from pathlib import Path

import pytest

from txl.errors import TxlError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_serve_latency_plot_returns_its_data(tmp_path):
    from serve_latency import plot_serve_latency  # (it imports httpx, a test dependency)

    data = plot_serve_latency(([0, 10, 100], [5.0, 6.0, 5.5]), ([10, 100], [6.0, 5.5]), ([10, 100], [7.0, 40.0]),
                              tmp_path / "l.png", title="t")
    assert data["stateless"] == ([10, 100], [7.0, 40.0]) and (tmp_path / "l.png").stat().st_size > 5_000
    with pytest.raises(TxlError, match="stateless: 2 history lengths but 1 latencies"):
        plot_serve_latency(([], []), ([], []), ([1, 2], [1.0]), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
