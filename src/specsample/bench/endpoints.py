"""`specsample bench serve --url [NAME=]URL`: the serving load against endpoints the
user already runs: `specsample serve`, llama-server, vLLM, a hosted API; anything
that speaks OpenAI's streaming /v1/chat/completions and /v1/completions.

Nothing is started and no model is loaded here: prompts go out as text, a chat task's
as `messages` to /v1/chat/completions (the endpoint applies its own chat template), a
raw-prompt task's (humaneval) as `prompt` to /v1/completions. Only OpenAI's own
fields are sent (model, max_tokens, temperature, top_p, seed, stop), so that every
endpoint reads the same request; greedy is temperature 0. The model is the first that
GET /v1/models lists, unless --model-name names one. Draft counts are read where an
endpoint reports them (our `usage.speculative`, llama-server's `timings`); no figure
needs them.

Loads run in load.Load.rounds' order: --repeats passes
over every (clients, task, setting), each round starting one endpoint further on. An
endpoint keeps whatever prompt cache it holds (nothing here can clear another
server's), so the warm-up and first repeat may leave prompts that later repeats find,
every endpoint alike; a server of ours can be run with --no-cache-prompt to rule that
out (docs/results/serve-url/ does).
"""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace

from ..app.arguments import UsageError
from .load import Load, run_load, unanswered_notes
from .modes import SETTINGS
from .records import ServedRecord
from .tasks import TASKS, Prompt, Task

_NAMED = re.compile(r"^([\w.-]+)=(.+)$")


@dataclass(frozen=True)
class Endpoint:
    name: str  # the row label
    api_base: str  # ".../v1", as OpenAI clients take it
    model: str | None = None  # the model requests name, once connect() has asked


def parse_endpoints(specs: list[str]) -> list[Endpoint]:
    """--url values as endpoints: "NAME=URL", or "URL" named by its host and port.
    "ours=http://127.0.0.1:8080" -> Endpoint("ours", "http://127.0.0.1:8080/v1")."""
    endpoints = []
    for spec in specs:
        named = _NAMED.match(spec)
        name, url = named.groups() if named else (None, spec)
        base = api_base(url)
        endpoints.append(Endpoint(name or urllib.parse.urlsplit(base).netloc, base))
    names = [e.name for e in endpoints]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--url names {', '.join(twice)} more than once; label each as NAME=URL")
    return endpoints


def api_base(url: str) -> str:
    """A server's URL as the API base: "http://h:8000" and "http://h:8000/" -> "http://h:8000/v1";
    a URL with a path ("http://h/v1", "https://h/api/v1") is kept as given."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--url takes [NAME=]http(s)://host[:port][/path]; got {url!r}")
    path = parts.path.rstrip("/") or "/v1"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def connect(endpoint: Endpoint, api_key: str, model_name: str | None = None, timeout: float = 30.0) -> Endpoint:
    """The endpoint with the model its requests name: model_name, or the first that
    /v1/models lists. An endpoint that does not answer is a UsageError in one line."""
    if model_name:
        return replace(endpoint, model=model_name)
    request = urllib.request.Request(f"{endpoint.api_base}/models", headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            listed = json.loads(r.read())["data"]
        return replace(endpoint, model=listed[0]["id"])
    except urllib.error.HTTPError as e:
        reason = f"HTTP {e.code} {e.reason}"
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        reason = f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
    raise UsageError(f"endpoint {endpoint.name}: GET {endpoint.api_base}/models failed ({reason}); "
                     "is it running, and is --url its OpenAI API base?")


def request_body(model: str, prompt: Prompt, task: Task, max_tokens: int, setting: str, seed: int) -> dict:
    """One request, in OpenAI's fields alone: a chat task's prompt as messages, a raw
    one's as text."""
    sampling = SETTINGS[setting]
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0 if sampling.greedy else sampling.temperature,
            "seed": seed}
    if not sampling.greedy and sampling.top_p < 1:
        body["top_p"] = sampling.top_p
    if task.stop_strings:
        body["stop"] = list(task.stop_strings)
    if prompt.messages is not None or task.chat:
        body["messages"] = [dict(m) for m in prompt.messages or ({"role": "user", "content": prompt.text},)]
    else:
        body["prompt"] = prompt.text
    return body


def check_tasks(prompts: dict[str, list[Prompt]]) -> None:
    """Tasks an endpoint can be asked in OpenAI's fields: none held to a grammar, with
    tools, or asked in the model's fill-in-the-middle tokens."""
    for name, group in prompts.items():
        if TASKS[name].held or any(p.suffix is not None or p.tools for p in group):
            raise UsageError(f"bench serve --url sends plain chat or completion requests; the {name} task is not one")


def run_endpoints(endpoints: list[Endpoint], load: Load, *, api_key: str = "none", model_name: str | None = None,
                  log=None, keep=lambda records: None) -> tuple[list[ServedRecord], list[str]]:
    """Every endpoint connected and warmed up (a UsageError names the first that
    fails), then every load sent to each in Load.rounds' order. `load.prompts` holds
    tasks.Prompt lists. Returns a record per request and notes on requests not
    answered; `keep` sees each load's records when it ends."""
    log = log or (lambda msg: print(f"specsample: {msg}", file=sys.stderr, flush=True))
    ready = []
    for endpoint in endpoints:
        endpoint = connect(endpoint, api_key, model_name)
        task = next(iter(load.prompts))
        warm = request_body(endpoint.model, load.prompts[task][0], TASKS[task], 8, "greedy", 0)
        [timing], _ = run_load(endpoint.api_base, [warm], 1, api_key)
        if timing.outcome != "answered":
            raise UsageError(f"endpoint {endpoint.name} ({endpoint.api_base}, model {endpoint.model}): "
                             f"the warm-up request was not answered: {timing.error}")
        log(f"endpoint {endpoint.name}: {endpoint.api_base}, model {endpoint.model}")
        ready.append(endpoint)
    records, notes = [], []
    for repeat, (clients, task, setting), order in load.rounds(ready):
        for endpoint in order:
            group = load.prompts[task]
            bodies = [request_body(endpoint.model, p, TASKS[task], load.new_tokens(task), setting, i)
                      for i, p in enumerate(group)]
            log(f"serve load: {endpoint.name}, {clients} clients, {task} {setting}, repeat {repeat + 1} of "
                f"{load.repeats}: {len(bodies)} requests")
            timings, wall = run_load(endpoint.api_base, bodies, clients, api_key)
            done = [ServedRecord(mode=endpoint.name, family="endpoint", k=None, task=task, setting=setting,
                                 prompt_id=p.id, clients=clients, wall_seconds=wall, timing=t, repeat=repeat)
                    for t, p in zip(timings, group)]
            records += done
            keep(done)
            notes += unanswered_notes(done)
    return records, notes
