"""``txl data prepare``: the standard language-modelling benchmarks (enwik8, text8, WikiText, PTB, lm1b,
PG-19) from their official archives into folders txl trains on.

:mod:`.prepare` (each dataset's layout and how it is cut), :mod:`.download` (resumable download, sha256
checks, safe extraction), :mod:`.output` (the folders a prepare may write into, the staging of archive
members) and :mod:`.command` (the flags). The library reads the prepared folders
(:func:`txl.data.files.dataset_info`, :func:`txl.data.corpus.load_corpus`).
"""
