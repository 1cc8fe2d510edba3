"""What the distribution installs: every package folder, and the recipes' and studies' commands found by ``txl``."""

from __future__ import annotations

import importlib
import importlib.metadata
import tomllib

from conftest import ROOT

import txl.cli as cli

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_folders() -> set[str]:
    """Every folder with an __init__.py below src/txl, recipes/ and studies/, by import name."""
    found = set()
    for base, name in ((ROOT / "src" / "txl", "txl"), (ROOT / "recipes", "txl_recipes"), (ROOT / "studies", "txl_studies")):
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base).parts
            found.add(".".join((name, *parts)))
    return found


def test_the_package_list_names_every_package_folder():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert listed == package_folders()


def test_every_recipe_and_study_command_is_an_entry_point_that_loads_and_is_named_as_its_command():
    points = PYPROJECT["project"]["entry-points"][cli.PLUGIN_GROUP]
    assert set(points) == {"classify", "export", "plot", "serve", "summarize", "bench", "ablate", "recl", "data.docstrings", "data.packages", "data.prepare"}
    for name, value in points.items():
        module, _, attr = value.partition(":")
        spec = importlib.import_module(module)
        spec = getattr(spec, attr) if attr else spec
        assert spec.NAME == name.rpartition(".")[2]
    # the installed metadata agrees with pyproject.toml (a stale install would miss a command)
    installed = {p.name: p.value for p in importlib.metadata.entry_points(group=cli.PLUGIN_GROUP)}
    assert installed == points


def test_txl_lists_the_recipes_and_studies_commands_after_its_own():
    parsers = cli.all_parsers()
    for prog in ("txl classify train", "txl classify predict", "txl summarize", "txl serve", "txl export", "txl plot", "txl bench", "txl ablate", "txl recl",
                 "txl data docstrings", "txl data packages", "txl data prepare", "txl train"):
        assert prog in parsers
    names = [module.NAME for module in cli.command_modules()]
    # txl's own, then the recipes' (the applications), then the studies'
    assert names[-8:] == ["classify", "export", "plot", "serve", "summarize", "ablate", "bench", "recl"], names


def test_a_plugin_that_fails_to_import_is_left_out_with_one_warning(monkeypatch, capsys):
    good = importlib.metadata.EntryPoint("recl", "txl_studies.recl.command", cli.PLUGIN_GROUP)
    bad = importlib.metadata.EntryPoint("broken", "no_such_module_for_txl.command", cli.PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [bad, good] if group == cli.PLUGIN_GROUP else [])
    found = cli.plugin_commands.__wrapped__()
    assert list(found) == ["recl"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["txl: warning: command 'broken' (no_such_module_for_txl.command) could not be loaded: "
                   "ModuleNotFoundError: No module named 'no_such_module_for_txl'"]


def test_a_group_whose_plugins_are_all_missing_names_the_reinstall(monkeypatch, capsys):
    """txl data with no data.* entry point installed (a stale install): one error line naming pip install -e ."""
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [p for p in real(group=group) if not p.name.startswith("data.")])
    cli.plugin_commands.cache_clear()
    try:
        for argv in (["data"], ["data", "prepare", "enwik8"]):
            assert cli.main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert err == ["txl: error: no txl data subcommands are installed: in the txl folder, run "
                           ".venv/bin/python -m pip install -e . (it registers the commands of recipes/ and studies/)"]
    finally:
        cli.plugin_commands.cache_clear()
