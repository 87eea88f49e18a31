"""A toy served model (trigram tables behind a word tokenizer with a chat format) and
a uvicorn server on a free loopback port, in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

from specsample.app.assemble import Models
from specsample.decoding.suffix import SuffixIndex
from specsample.serve.app import create_app
from specsample.serve.settings import Settings

from toy import TrigramBackend, TrigramSequences, random_table

SPECIAL = ["<unk>", "<system>", "<user>", "<assistant>", "<end>"]
WORDS = SPECIAL + "the cat sat on a mat dog ran far away and then it was over here there big small red".split()
VOCAB = len(WORDS)  # 26
END = WORDS.index("<end>")


class WordTokenizer:
    """One token per word; each decodes as " word", so text grows token by token."""

    chat_template = None  # no tool-call format: a request with tools is refused

    def encode(self, text: str) -> list[int]:
        return [WORDS.index(w) if w in WORDS else 0 for w in text.split()]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(" " + WORDS[t] for t in token_ids)

    def chat_prompt(self, text: str) -> list[int]:
        return self.chat_messages([{"role": "user", "content": text}])

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None, check=None) -> list[int]:
        ids = []
        for m in messages:
            if check is not None:
                check()
            ids += [WORDS.index(f"<{m['role']}>")] + self.encode(m["content"]) + [END]
        return ids + [WORDS.index("<assistant>")]


class Served:
    """What a served toy model adds to its trigram table: the word tokenizer, an end
    token, a context length, and a `gate` (when cleared, holds every call) and `delay`
    (slows each), so tests can keep the worker busy."""

    def serve_as(self, eos: bool, context_length: int) -> None:
        self.tokenizer = WordTokenizer()
        self.eos_token_ids = frozenset({END}) if eos else frozenset()
        self.context_length = context_length
        self.gate = threading.Event()
        self.gate.set()
        self.delay = 0.0

    def wait_for_gate(self) -> None:
        assert self.gate.wait(timeout=20), "gate never opened"
        if self.delay:
            time.sleep(self.delay)


class ToyBackend(Served, TrigramBackend):
    """A served trigram model. `failure` is raised by the call numbered `fail_at` (the
    prompt's prefill is call 1): an engine failing."""

    def __init__(self, seed: int, eos: bool = True, context_length: int = 256, name: str = "toy"):
        super().__init__(random_table(VOCAB, seed, scale=2.0), name=name)
        self.serve_as(eos, context_length)
        self.calls, self.fail_at, self.failure = 0, None, None

    def score(self, token_ids, num_logits):
        self.wait_for_gate()
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.failure
        return super().score(token_ids, num_logits)


class ToySequences(Served, TrigramSequences):
    """ToyBackend's model holding several sequences, scored together in one call (as a
    llama.cpp backend loaded with sequences=N)."""

    def __init__(self, seed: int, sequences: int, eos: bool = True, context_length: int = 256, name: str = "toy"):
        super().__init__(random_table(VOCAB, seed, scale=2.0), sequences, name=name)
        self.serve_as(eos, context_length)

    def score_many(self, requests):
        self.wait_for_gate()
        return super().score_many(requests)


def toy_pair(eos: bool = True, context_length: int = 256, parallel: int = 1):
    if parallel > 1:
        return (ToySequences(0, parallel, eos, context_length, name="toy"),
                ToySequences(1, parallel, eos, context_length, name="toy-draft"))
    return (ToyBackend(0, eos=eos, context_length=context_length, name="toy"),
            ToyBackend(1, eos=eos, context_length=context_length, name="toy-draft"))


def toy_app(drafter: str = "model", eos: bool = True, context_length: int = 256, **settings):
    """An app over a fresh toy pair (holding settings' `parallel` sequences); returns
    (app, target)."""
    target, draft = toy_pair(eos, context_length, settings.get("parallel", 1))
    models = {"model": Models(target, draft), "hybrid": Models(target, draft, lookup=True),
              "ngram": Models(target, lookup=True), "suffix": Models(target, suffix=SuffixIndex(4096)),
              "none": Models(target)}[drafter]
    settings = Settings(model_name="toy", **{"policy": 3, **settings})
    return create_app(target, models.drafter, models.drafter_name, settings, models.draft), target


@contextlib.contextmanager
def served_pair(make_backend):
    """A server of make_backend(0) drafted by make_backend(1, "draft") (toy.byte_backend
    and its kin), k = 3, as model "toy": its base URL, and an openai client of it."""
    from openai import OpenAI

    from specsample.decoding.drafters import ModelDrafter

    draft = make_backend(1, "draft")
    app = create_app(make_backend(0), lambda sampling, slot, salt: ModelDrafter(slot or draft, sampling), draft.name,
                     Settings(model_name="toy", policy=3))
    with running(app) as base:
        yield base, OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


@contextlib.contextmanager
def running(app, sndbuf: int | None = None, **options):
    """Serve app on 127.0.0.1 on a free port (uvicorn.Config's `options` added); yields
    the base URL. `sndbuf`: each connection's kernel send buffer (a small one fills
    soon when a client stops reading)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sndbuf is not None:  # accepted sockets inherit it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, **{"log_level": "warning", "timeout_graceful_shutdown": 2, **options}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def wait_until(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
