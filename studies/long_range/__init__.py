"""How far back does the memory carry a fact? (``txl bench --long-range``, docs/long-range.md)

- :mod:`.episodes`: the episodes (a fact, filler from real text, a question) and the training streams;
- :mod:`.task`: the training task that scores only the answers;
- :mod:`.scoring`: exact retrieval of the answer, read with the memory;
- :mod:`.suite`: the rows, their training and evaluation, the tables and JSON;
- :mod:`.plot`: accuracy against distance; :mod:`.merge`: results run apart, merged into one JSON
  (``python -m txl_studies.long_range.merge``).
"""
