"""The benchmarks that compare commits (benchmarks/compare_commits.py and the scripts on its helpers) name a
revision git does not know in one line, not a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import compare_commits  # noqa: E402


def test_an_unknown_revision_is_one_line():
    with pytest.raises(SystemExit) as err:
        compare_commits.git("rev-parse", "--verify", "no-such-revision-here")
    assert "git rev-parse --verify no-such-revision-here failed: fatal:" in str(err.value)
    assert "\n" not in str(err.value)


def test_eval_launches_exits_with_one_line_for_an_unknown_base():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_launches.py"), "--base", "no-such-revision-here"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("eval_launches.py: git rev-parse no-such-revision-here failed: fatal:")
    assert "Traceback" not in done.stderr
