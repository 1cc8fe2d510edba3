"""``txl data``: the group of data builders. Its subcommands are plug-ins: ``txl data prepare`` (the
standard benchmarks, ``recipes/datasets``) and the studies' data sets (``txl data docstrings``, ``txl data
packages``); see :mod:`txl.cli`'s plug-in commands."""

NAME = "data"
HELP = "standard datasets (enwik8, text8, wikitext, ptb, lm1b, pg19) and the studies' data sets"
EXAMPLE = "txl data prepare enwik8 --source enwik8.zip --out data/enwik8"
SUBCOMMANDS = ()  # all of them plug-ins
