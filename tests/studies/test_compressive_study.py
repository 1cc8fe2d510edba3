"""The compressive-memory study's plot (studies/compressive/run.py)."""

from txl_studies.compressive.run import plot_compressive


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
