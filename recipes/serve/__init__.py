"""``txl serve``: an HTTP server whose sessions keep their Transformer-XL memory between requests.

:mod:`.sessions` (session state, the store), :mod:`.cursor` (text that arrives in pieces, tokenised as a
whole), :mod:`.engine` (model worker thread, sampling, session requests), :mod:`.metrics` (bounded
counters), :mod:`.http` (error bodies, the API key rule), :mod:`.app` (the FastAPI routes), :mod:`.heap`
(free pages back to the system after large answers), :mod:`.server` (uvicorn), :mod:`.config` (the
limits) and :mod:`.command` (the flags). FastAPI and uvicorn are the optional ``serve`` extra (``pip
install -e '.[serve]'`` in the txl folder); only :mod:`.app` and :mod:`.server` import them.
"""
