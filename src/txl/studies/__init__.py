"""Studies: each measures one claim about the memory end to end, with its data builder, task, scoring
and report in one folder, built on the library's mechanisms: :mod:`.long_range` (``txl bench
--long-range``), :mod:`.summaries` (``txl data docstrings``, ``python -m txl.studies.summaries.run``),
:mod:`.packages` (``txl data packages``, the classification benchmark's data)."""
