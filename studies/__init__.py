"""txl's studies: each measures one claim end to end, its data builder, task, scoring, command and report
in one folder, built on the library (``txl``), which never imports them. Installed with txl as
``txl_studies``; the commands they add to ``txl`` are entry points (``txl.commands`` in pyproject.toml).

- :mod:`.speed`: throughput and memory against references (``txl bench``, docs/benchmarks.md);
- :mod:`.long_range`: how far back the memory carries a fact (``txl bench --long-range``);
- :mod:`.ablation`: the paper's Table 6 at small scale (``txl ablate``);
- :mod:`.recl`: relative effective context length, the paper's section 4.3 (``txl recl``);
- :mod:`.summaries`: summaries of long documents (``txl data docstrings``, ``python -m txl_studies.summaries.run``);
- :mod:`.classification`: long-document classification, its data (``txl data packages``), readings
  against TF-IDF (``python -m txl_studies.classification.run``).
"""
