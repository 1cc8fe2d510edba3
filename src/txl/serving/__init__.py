"""``txl serve``: an HTTP server whose sessions keep their Transformer-XL memory between requests.

:mod:`~txl.serving.sessions` (session state, the store), :mod:`~txl.serving.engine` (model worker
thread, sampling, session requests), :mod:`~txl.serving.metrics` (bounded counters),
:mod:`~txl.serving.http` (error bodies, the API key rule), :mod:`~txl.serving.app` (the FastAPI routes) and
:mod:`~txl.serving.server` (uvicorn). FastAPI and uvicorn are the optional ``serve`` extra
(``pip install -e '.[serve]'`` in the txl folder); only :mod:`~txl.serving.app` and :mod:`~txl.serving.server`
import them.
"""
