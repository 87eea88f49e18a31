"""An OpenAI-compatible HTTP server over the library (`specsample serve`).

api.py holds the routes and the OpenAI request and response shapes; worker.py the
single worker that owns the models and runs `stream`; a bounded queue sits between
them. The library never imports this package, and this file imports nothing, so
that `specsample --help` works without the web stack (the `serve` extra).
"""
