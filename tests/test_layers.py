"""The house's floors hold: tools/check_layers.py passes on src/txl and catches each kind of breach."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

TOOL = ROOT / "tools" / "check_layers.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("check_layers", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_txl_itself_has_no_cycle_no_upward_import_and_every_module_on_a_floor():
    run = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no cycle, no upward or outward import" in run.stdout


def test_the_recipes_have_no_cycle_and_never_import_a_study():
    run = subprocess.run([sys.executable, str(TOOL), str(ROOT / "recipes"), "--name", "txl_recipes",
                          "--layers", "classify,datasets,export,plot,serve,summarize", "--forbid", "txl_studies"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no cycle, no upward or outward import" in run.stdout


def test_an_import_of_a_forbidden_package_is_named(tmp_path):
    tool = load_tool()  # the library below the studies: txl never imports txl_studies
    pkg = write_package(tmp_path, {"low/__init__.py": "", "low/a.py": "def f():\n    from studies_pkg.x import y\n"})
    found, _, _ = tool.problems(pkg, "low", forbidden="studies_pkg")
    assert found == ["outward: pkg.low.a -> studies_pkg.x (the package never imports studies_pkg)"]
    assert tool.problems(pkg, "low")[0] == []


def test_each_kind_of_breach_is_named(tmp_path):
    tool = load_tool()
    pkg = write_package(tmp_path, {
        "top/__init__.py": "",
        "top/cmd.py": "from pkg.low import b\n",  # downward: allowed
        "low/__init__.py": "",
        "low/util.py": "def f():\n    from ..top import cmd  # inside a function still counts\n",
        "low/a.py": "import pkg.low.b\n",
        "low/b.py": "from pkg.low import a\n",
        "stray.py": "",
    })
    found, n_modules, n_imports = tool.problems(pkg, "top > low")
    assert n_modules == 8
    # the relative import runs pkg/top/__init__.py and pkg/top/cmd.py: two upward edges
    assert sorted(line.split(":")[0] for line in found) == ["cycle", "no floor", "upward", "upward"]
    assert "cycle: pkg.low.a <-> pkg.low.b" in found
    assert "upward: pkg.low.util -> pkg.top.cmd (low imports top, a higher floor)" in found
    assert any(line.startswith("no floor: pkg.stray") for line in found)
    assert tool.main([str(pkg), "--layers", "top > low"]) == 1


def test_a_clean_package_passes_and_a_folder_without_init_is_refused(tmp_path, capsys):
    tool = load_tool()
    pkg = write_package(tmp_path, {"top/x.py": "from pkg.low import y\n", "low/__init__.py": "", "low/y.py": ""})
    (pkg / "top" / "__init__.py").write_text("")
    assert tool.main([str(pkg), "--layers", "top > low"]) == 0
    assert tool.main([str(tmp_path / "nowhere")]) == 2
    assert "is not a package folder" in capsys.readouterr().err


def test_dynamic_imports_and_lazy_names_of_the_package_count(tmp_path):
    tool = load_tool()
    pkg = write_package(tmp_path, {
        "__init__.py": '_LAZY = {"run": "pkg.top.cmd", "util": "pkg.low.b"}\n',
        "top/__init__.py": "", "top/cmd.py": "def run():\n    pass\n",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from pkg import run  # loads pkg.top.cmd on first use\n",
        "low/b.py": "import importlib\nimportlib.import_module('pkg.top.cmd')\n",
        "low/c.py": "def f():\n    return __import__('pkg.top')\n",
        "low/d.py": "from pkg import util\nimport importlib\nimportlib.import_module(util.__name__)\n",
    })
    found, _, _ = tool.problems(pkg, "top > low")
    assert sorted(found) == ["upward: pkg.low.a -> pkg.top.cmd (low imports top, a higher floor)",
                             "upward: pkg.low.b -> pkg.top.cmd (low imports top, a higher floor)",
                             "upward: pkg.low.c -> pkg.top (low imports top, a higher floor)"]

