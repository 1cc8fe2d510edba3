"""Studies: each measures one claim about the memory end to end, with its data builder, task, scoring
and report in one folder, built on the library's mechanisms (``txl bench --long-range`` runs
:mod:`txl.studies.long_range`)."""
