"""``txl serve``: an HTTP server whose sessions keep their Transformer-XL memory between requests.

:mod:`~txl.serving.sessions` (session state, the store), :mod:`~txl.serving.engine` (model worker
thread, sampling, metrics), :mod:`~txl.serving.app` (the FastAPI routes) and
:mod:`~txl.serving.server` (uvicorn). FastAPI and uvicorn are the optional ``serve`` extra
(``pip install 'txl[serve]'``); only :mod:`~txl.serving.app` and :mod:`~txl.serving.server`
import them.
"""
