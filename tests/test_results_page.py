"""docs/results.md and the README's results table are what tools/results_page.py makes from benchmarks/results,
and a changed measurement makes the check fail."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys

from conftest import ROOT

TOOL = ROOT / "tools" / "results_page.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("results_page", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_of_repository(tmp_path, tool):
    """A root with docs/, a README.md with the markers and a copy of the JSON files; its results folder."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"# txl\n\n{tool.BEGIN}\n{tool.END}\n\nthe rest\n")
    return results


def test_the_committed_pages_are_up_to_date():
    run = subprocess.run([sys.executable, str(TOOL), "--check"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_changed_measurement_changes_the_page_and_fails_the_check(tmp_path, capsys):
    tool = load_tool()
    results = copy_of_repository(tmp_path, tool)
    args = ["--root", str(tmp_path), "--results-dir", str(results)]
    assert tool.main(args) == 0
    assert tool.main([*args, "--check"]) == 0
    page, readme = (tmp_path / "docs" / "results.md").read_text(), (tmp_path / "README.md").read_text()
    assert "3,142" in page and "1.73x" in readme and readme.endswith(f"{tool.END}\n\nthe rest\n")

    path = results / "cpu-avx512-bench-small.json"
    bench = json.loads(path.read_text())
    bench["impls"]["txl"]["train_tokens_per_s"] = 4321.0
    bench["ratios_txl_over_hf"]["train_tokens_per_s"] = 2.38
    path.write_text(json.dumps(bench))
    capsys.readouterr()
    assert tool.main([*args, "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{name} is not what tools/results_page.py makes from benchmarks/results: run python "
                   "tools/results_page.py" for name in ("docs/results.md", "README.md")]
    assert (tmp_path / "docs" / "results.md").read_text() == page  # --check writes nothing
    assert tool.main(args) == 0
    assert "4,321" in (tmp_path / "docs" / "results.md").read_text() and "2.38x" in (tmp_path / "README.md").read_text()


def test_a_readme_without_the_markers_is_refused_and_left_alone(tmp_path, capsys):
    tool = load_tool()
    results = copy_of_repository(tmp_path, tool)
    (tmp_path / "README.md").write_text("# txl\n")
    assert tool.main(["--root", str(tmp_path), "--results-dir", str(results)]) == 1
    assert "README.md needs the lines" in capsys.readouterr().out
    assert (tmp_path / "README.md").read_text() == "# txl\n"
    assert tool.main(["--root", str(tmp_path), "--results-dir", str(results), "--no-readme"]) == 0


def test_a_missing_file_says_not_measured_yet_and_no_date_reaches_the_page(tmp_path):
    tool = load_tool()
    results = copy_of_repository(tmp_path, tool)
    (results / "compressive.json").unlink()
    page, block = tool.build(results)
    assert "Not measured yet: compressive.json is missing." in page
    assert not re.search(r"\d{4}-\d\d-\d\d", page + block)
    assert "the run before" not in page and "earlier run" not in page
