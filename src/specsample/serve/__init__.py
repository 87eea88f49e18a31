"""An OpenAI-compatible HTTP server over the library (`specsample serve`).

A file per job, in the order a request meets them:
  app.py             the app: routes, the doors' middleware, error handlers, the worker's lifespan
  doors.py           who may come in: the Host check, the API key, the JSON content type
  schemas.py         the OpenAI request shapes (pydantic, strict) and reading a body into one
  request_config.py  request -> GenerationConfig and one task per choice: the one path that checks it
  routes.py          the routes, and Follower, the one consumer of the worker's events (JSON and SSE)
  worker.py          the single worker thread that owns the models and runs `stream`
  prompt_cache.py    the slots' earlier texts kept in host memory, restored for a prompt that starts with one
  events.py          what the worker tells a request, as typed values
  replies.py         the OpenAI response shapes, and the answer built from the events
  errors.py          APIError, OpenAI's error shape, and what a job's end means for its request
  settings.py        what the server was started with, and what the routes share
  metrics.py         Prometheus metrics and the middleware that counts requests
  cli.py             `specsample serve`

A bounded queue sits between the routes and the worker. The library never imports
this package, and this file imports nothing, so that `specsample --help` works
without the web stack (the `serve` extra).
"""
