"""Merge the results of `txl bench --long-range` runs made as parts (rows or seeds run apart) into one JSON.

    python -m txl_studies.long_range.merge benchmarks/results/long-range.json \\
        runs/lr-cmem-seed2/results.json runs/lr-rest-seed2/results.json \\
        --out benchmarks/results/long-range.json --table runs/long_range.md --plot docs/images/long_range.png

The first file is the base: its keys other than the rows are kept (the command, the machine, notes).
Each later file's seeds are added to the row of the same name (a row the base lacks is added whole);
a seed already present in that row, a row whose settings differ, a budget that differs, a file that
is not such results, or an output folder that does not exist is refused with one line (exit status
2), before anything is written. ``seeds_per_row`` is brought up to date. The merged JSON
is written atomically; ``--table`` writes the markdown tables of the suite and ``--plot`` its plot
(accuracy against distance, one line per row) from the merged results, with the rows of the
``--plot-with`` files (other budgets, e.g. the 3,000-step mem64-bptt2) drawn beside them.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path


class Refused(Exception):
    """A merge that would mix what does not belong together (the message names it)."""


def merge(base: dict, parts: list[tuple[str, dict]]) -> dict:
    """``base`` with the rows and seeds of ``parts`` added (a new dict; neither input is changed).

    Raises:
        Refused: a budget, row settings or a seed that conflict with the base.
    """
    merged = copy.deepcopy(base)
    rows = {r["name"]: r for r in merged["rows"]}
    for name, part in parts:
        if part.get("budget") != merged.get("budget"):
            raise Refused(f"{name}: its budget {part.get('budget')} differs from the base's "
                             f"{merged.get('budget')}; results of different budgets are not one table")
        for row in part["rows"]:
            if row["name"] not in rows:
                merged["rows"].append(copy.deepcopy(row))
                rows[row["name"]] = merged["rows"][-1]
                continue
            have = rows[row["name"]]
            settings = [k for k in row if k not in ("seeds", "distances")]  # the row's fields, reach, training
            if any(have.get(k) != row[k] for k in settings):
                raise Refused(f"{name}: row {row['name']} was run with other settings than the base's; "
                                 "merge only runs of the same row")
            seen = {s["seed"] for s in have["seeds"]}
            for s in row["seeds"]:
                if s["seed"] in seen:
                    raise Refused(f"{name}: row {row['name']} seed {s['seed']} is already in the base; "
                                     "leave that file out or run another seed (--first-seed)")
                have["seeds"].append(copy.deepcopy(s))
                seen.add(s["seed"])
            have["seeds"].sort(key=lambda s: s["seed"])
            have["distances"] = sorted(set(have["distances"]) | set(row["distances"]))
    merged["seeds_per_row"] = {r["name"]: [s["seed"] for s in r["seeds"]] for r in merged["rows"]}
    merged["seeds"] = sorted({s for seeds in merged["seeds_per_row"].values() for s in seeds})
    return merged


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m txl_studies.long_range.merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="results JSON to add to (kept as it is; --out may name it)")
    ap.add_argument("parts", nargs="+", help="results.json files of `txl bench --long-range` runs")
    ap.add_argument("--out", required=True, help="merged JSON to write")
    ap.add_argument("--table", help="also write the markdown tables here (a new file)")
    ap.add_argument("--plot", help="also draw the plot here (.png; replaced if it exists)")
    ap.add_argument("--plot-with", nargs="+", default=[], metavar="JSON",
                    help="results JSONs of other budgets whose rows the plot draws too (not merged)")
    args = ap.parse_args()
    loaded = []
    for path in [args.base, *args.parts, *args.plot_with]:
        p = Path(path)
        if not p.is_file():
            ap.error(f"{path} is not a file: give results.json files written by txl bench --long-range")
        try:
            loaded.append((path, json.loads(p.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            ap.error(f"{path} is not JSON ({e}); give results.json files written by txl bench --long-range")
        results = loaded[-1][1]
        if not (isinstance(results, dict) and isinstance(results.get("rows"), list) and all(
                isinstance(r, dict) and {"name", "seeds", "distances"} <= r.keys() for r in results["rows"])):
            ap.error(f"{path} has no rows of the suite: give results.json files written by txl bench --long-range")
    for flag, path in (("--out", args.out), ("--table", args.table), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            ap.error(f"{flag} {path}: its folder does not exist (nothing was written)")
    if args.table and Path(args.table).exists():
        ap.error(f"--table {args.table} exists; choose a new file (nothing was written)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("--plot needs matplotlib: .venv/bin/python -m pip install -e '.[plot]' (nothing was written)")
    extra = [results for _, results in loaded[len(loaded) - len(args.plot_with):]] if args.plot_with else []
    try:
        merged = merge(loaded[0][1], loaded[1:len(loaded) - len(args.plot_with)])
    except Refused as e:
        ap.error(f"{e} (nothing was written)")

    from txl_studies.long_range.suite import format_table, plot_series
    from txl.fileio import atomic_write, write_json

    write_json(args.out, merged)
    if args.table:
        table = format_table(merged)
        atomic_write(args.table, lambda tmp: Path(tmp).write_text(table, encoding="utf-8"), overwrite=False)
    if args.plot:
        from txl_studies.long_range.plot import plot_long_range

        drawn = {**merged, "rows": merged["rows"] + [r for results in extra for r in results["rows"]]}
        plot_long_range(plot_series(drawn), args.plot)
    print(f"wrote {args.out}: " + ", ".join(f"{k} seeds {v}" for k, v in merged["seeds_per_row"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
