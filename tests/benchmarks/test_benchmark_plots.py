"""The plots two benchmark scripts draw (benchmarks/serve_latency.py, benchmarks/compressive.py)."""

import sys
from pathlib import Path

import pytest

from txl.errors import TxlError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from compressive import plot_compressive  # noqa: E402


def test_serve_latency_plot_returns_its_data(tmp_path):
    from serve_latency import plot_serve_latency  # (it imports httpx, a test dependency)

    data = plot_serve_latency(([0, 10, 100], [5.0, 6.0, 5.5]), ([10, 100], [6.0, 5.5]), ([10, 100], [7.0, 40.0]),
                              tmp_path / "l.png", title="t")
    assert data["stateless"] == ([10, 100], [7.0, 40.0]) and (tmp_path / "l.png").stat().st_size > 5_000
    with pytest.raises(TxlError, match="stateless: 2 history lengths but 1 latencies"):
        plot_serve_latency(([], []), ([], []), ([1, 2], [1.0]), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_compressive_plot_averages_the_seeds_curves(tmp_path):
    run = lambda curve: {"value": curve[-1][2], "unit": "bpc", "tokens_per_s": 1.0, "curve": curve}
    results = {"c/a/0": run([[1, 100, 3.0], [2, 200, 2.0]]), "c/a/1": run([[1, 100, 3.5], [2, 200, 2.5]]),
               "c/b/0": run([[1, 100, 4.0], [2, 200, 1.0]]), "speed": {"a": {"tokens_per_s": 9.0}}}
    points = plot_compressive(results, tmp_path / "c.png")
    assert points == {"c/a": [(100, 3.25), (200, 2.25)], "c/b": [(100, 4.0), (200, 1.0)]}
    assert (tmp_path / "c.png").stat().st_size > 5_000
    for r in results.values():  # without curves: the final value against training tokens/s, one point per run
        r.pop("curve", None)
    assert plot_compressive(results, tmp_path / "d.png") == {"c/a": [(9.0, 2.0), (9.0, 2.5)], "c/b": [(1.0, 1.0)]}
