"""A target on two llama.cpp RPC workers started here on 127.0.0.1 (rpc.py)."""

import gc
import json
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from specsample.backends.rpc import PROTOCOL, WorkerError, probe

from process_guard import end_group, popen
from tiny_rpc import write_tiny_rpc_gguf

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specsample[llamacpp]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_worker(reply: bytes) -> int:
    """A server that answers the first request of one connection with `reply`."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer():
        with server, server.accept()[0] as conn:
            conn.recv(9)
            conn.sendall(reply)

    threading.Thread(target=answer, daemon=True).start()
    return server.getsockname()[1]


@pytest.mark.system
def test_probe_says_why_a_worker_cannot_serve_unreachable_another_protocol_or_not_a_worker():
    port = free_port()
    with pytest.raises(WorkerError, match=f"127.0.0.1:{port} is unreachable.*rpc-worker --host 127.0.0.1 --port {port}"):
        probe(f"127.0.0.1:{port}")
    older = fake_worker(struct.pack("<QBBB", 3, PROTOCOL[0] - 1, 0, 0))
    with pytest.raises(WorkerError, match=r"speaks protocol 1\.0\.0.*same specsample install"):
        probe(f"127.0.0.1:{older}")
    other = fake_worker(b"HTTP/1.1 400 Bad\r\n")
    with pytest.raises(WorkerError, match="did not answer as a llama.cpp RPC worker"):
        probe(f"127.0.0.1:{other}")
    same = fake_worker(struct.pack("<QBBB", 3, *PROTOCOL))
    assert probe(f"127.0.0.1:{same}") == PROTOCOL


def start_workers(n: int = 2):
    """n workers of one thread each on free local ports, once each answers the probe."""
    ports = [free_port() for _ in range(n)]
    procs = [popen([sys.executable, "-m", "specsample", "rpc-worker", "--port", str(p), "--threads", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for p in ports]
    deadline = time.monotonic() + 60
    for port in ports:
        while True:
            try:
                probe(f"127.0.0.1:{port}", timeout=1)
                break
            except WorkerError:
                if time.monotonic() > deadline:
                    stop(procs)
                    raise
                time.sleep(0.2)
    return ",".join(f"127.0.0.1:{p}" for p in ports), procs


def stop(procs) -> None:
    for proc in procs:
        end_group(proc)


@pytest.fixture(autouse=True)
def collected():
    """Models from the tests before freed now, on this thread. Their backends sit in
    reference cycles (backend and tokenizer), so the cyclic collector frees them when
    it next runs, on whatever thread allocates then: the watch thread of cpushare.py
    or a target call's thread (decoding/overlap.py), possibly in the middle of another
    model's call on the same worker, over the one connection they share. That is the
    likely cause (not proven) of "Remote RPC server crashed or returned malformed
    response" ending the test process twice in the first runs of this module after
    test_rpc.py and test_assemble.py; nine runs since passed without this fixture."""
    gc.collect()
    yield
    gc.collect()


@pytest.fixture(scope="module")
def workers():
    """Two workers, stopped at the end."""
    endpoints, procs = start_workers()
    try:
        yield endpoints
    finally:
        gc.collect()  # the module's models on the workers are freed while the workers still answer
        stop(procs)
    assert "no authentication" in procs[0].stderr.read()  # its start-up line said so


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The path of a one-layer random model (tiny_rpc.py), for the tests that claim
    what holds for any model. The real pair stays where a target call must last: a
    draft on a worker drafts during the target's calls only when they take longer
    than its own (the tiny target's 21 calls took 1.3 ms in all: no round was
    predrafted), and a worker killed mid-generation must find one streaming."""
    return write_tiny_rpc_gguf(tmp_path_factory.mktemp("tiny"))


@pytest.mark.system
def test_greedy_speculation_on_a_target_split_over_two_workers_equals_plain_greedy_there(tiny, workers):
    """A target's layers on two local workers (the tiny model's one block on the first,
    its output layer on the second), batch-invariant kernels; the same model drafts
    here, during the target's calls (decoding/overlap.py). Greedy speculative output is
    plain greedy output."""
    from specsample.backends import load_backend
    from specsample.backends.rpc import parse_workers
    from specsample.decoding.generate import GenerationConfig, generate
    from specsample.decoding.sampling import SamplingConfig

    split = parse_workers(workers, "1,1")
    target = load_backend(tiny, "llamacpp", threads=1, batch_invariant=True, workers=split, n_ctx=512)
    draft = load_backend(tiny, "llamacpp", threads=1, n_ctx=512)
    assert split.key in target.cost_key
    # Local workers share this process's cores, where assembly would not overlap
    # (rpc.apart): placed apart here, its path is the one under test.
    from specsample.decoding.drafters import ModelDrafter

    greedy = SamplingConfig(temperature=0)
    prompt = target.tokenizer.encode("Write a Python function that reverses a string.")
    plain = generate(target, prompt, GenerationConfig(max_new_tokens=40, sampling=greedy))
    spec = generate(target, prompt, GenerationConfig(max_new_tokens=40, sampling=greedy), ModelDrafter(draft, greedy), 4,
                    overlap=True)
    assert spec.stats.accepted > 0 and spec.stats.predrafted_rounds > 0  # blocks drafted during a call were kept
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 40


@pytest.mark.real
def test_greedy_speculation_with_the_draft_on_a_worker_equals_plain_greedy(real_pair, workers):
    """--draft-rpc: the draft's layers on a worker, the target here (batch-invariant),
    assembled from the options as the CLI does; the draft drafts there during the
    target's calls here. Greedy speculative output is plain greedy output."""
    from specsample.app.assemble import ModelOptions, assemble
    from specsample.decoding.generate import GenerationConfig, generate
    from specsample.decoding.sampling import SamplingConfig

    endpoint = workers.split(",")[0]
    models = assemble(ModelOptions(target=real_pair.draft, draft=real_pair.draft, draft_rpc=endpoint, lookup=False,
                                   threads=1, ctx_size=512, batch_invariant=True))
    assert models.target.workers is None and models.draft.workers.endpoints == (endpoint,)
    assert endpoint in models.draft.cost_key
    # The worker is pinned nowhere: it shares this process's cores, where assembly does
    # not overlap (assemble.pair_overlaps); placed apart here, its path is the one under test.
    assert not models.overlap
    greedy = SamplingConfig(temperature=0)
    prompt = models.target.tokenizer.chat_prompt("Write a Python function that reverses a string.")
    config = GenerationConfig(max_new_tokens=40, sampling=greedy)
    plain = generate(models.target, prompt, config)
    spec = generate(models.target, prompt, config, models.drafter(greedy), 4, overlap=True)
    assert spec.stats.accepted > 0 and spec.stats.predrafted_rounds > 0
    assert spec.token_ids == plain.token_ids


@pytest.mark.real
def test_a_target_on_two_workers_scores_the_rows_it_scores_here_to_the_bit(real_pair, workers):
    """With batch-invariant kernels the split target is the local target, number for
    number, in calls of every size: every distribution test of the local engine (and
    `specsample check`'s reference) holds on it as it is. The default kernels differ:
    the local copy's weights are repacked and a worker's are not. So this one needs a
    real quantized model: the tiny model's float32 weights are not repacked, and its
    rows matched to the bit with the default kernels too (tiny_rpc.py's model, split
    "1,1" against local, calls of 1 to 8 tokens), which would let a split target that
    lost its batch-invariant kernels pass."""
    import torch

    from specsample.backends import load_backend
    from specsample.backends.rpc import parse_workers

    split = load_backend(real_pair.draft, "llamacpp", threads=1, batch_invariant=True,
                         workers=parse_workers(workers, "1,1"), n_ctx=512)
    here = load_backend(real_pair.draft, "llamacpp", threads=1, batch_invariant=True, n_ctx=512)
    prompt = here.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    for backend in (split, here):
        backend.score(prompt, 1)
    for tokens in ([100], [200, 300], [400, 500, 600, 700], list(range(1000, 1008))):
        rows = [backend.score(tokens, len(tokens)) for backend in (split, here)]
        assert torch.equal(*rows), len(tokens)
    for backend in (split, here):  # a sequence rolled back on the workers reads as one rolled back here
        backend.rollback(len(prompt) + 1)
    assert torch.equal(split.score([42], 1), here.score([42], 1))


@pytest.mark.system
def test_a_second_model_on_the_same_workers_loads_while_the_first_holds_them(tiny, workers):
    """bench --target-quants: a second model on the same workers in this process. The
    workers are known to answer, and a probe would wait behind the first model's
    connection; the second scores as the first and as the model here do."""
    import torch

    from specsample.backends import load_backend
    from specsample.backends.rpc import parse_workers

    first, again = (load_backend(tiny, "llamacpp", threads=1, batch_invariant=True,
                                 workers=parse_workers(workers, "1,1"), n_ctx=512) for _ in range(2))
    here = load_backend(tiny, "llamacpp", threads=1, batch_invariant=True, n_ctx=512)
    prompt = here.tokenizer.encode("def fibonacci(n):")
    rows = [backend.score(prompt, 1) for backend in (first, again, here)]
    assert torch.equal(rows[0], rows[2]) and torch.equal(rows[1], rows[2])


@pytest.mark.real
@pytest.mark.parametrize("drafting", ["lookup", "overlapped", "draft-on-a-worker"])
def test_a_worker_killed_mid_generation_ends_the_client_with_one_line_not_a_hang_or_a_core_dump(real_pair, drafting):
    """With a draft model the target's calls run on a thread while the draft drafts
    (decoding/overlap.py): the lost call's thread ends the process the same way. A
    draft on a worker (--draft-rpc, the target here) lost mid-draft does too."""
    endpoints, procs = start_workers()
    client = None
    # A fixed K: -k auto would time the target and cache its costs under these
    # workers' ports, one file a run left in the user's cache.
    draft = {"lookup": ["--draft", "ngram", "-k", "2", "--target-rpc", endpoints],
             "overlapped": ["--draft", real_pair.draft, "-k", "2", "--target-rpc", endpoints],
             "draft-on-a-worker": ["--draft", real_pair.draft, "-k", "2", "--no-lookup",
                                   "--draft-rpc", endpoints.split(",")[1]]}[drafting]
    try:
        client = popen(
            [sys.executable, "-m", "specsample", "generate", "--target", real_pair.draft, *draft,
             "--ctx-size", "1024", "--threads", "1",
             "--prompt", "Count from 1 to 1000, one number per line:", "--max-new-tokens", "900"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert client.stdout.read(8)  # text is streaming: the target answers from its workers
        procs[1].kill()
        _, err = client.communicate(timeout=60)
        assert client.returncode == 2
        assert b"RPC worker stopped answering" in err and b"Traceback" not in err
    finally:
        if client is not None:
            end_group(client)
        stop(procs)


FREE = """
import gc, sys
from specsample.backends import load_backend
from specsample.backends.rpc import connections_to, parse_workers
path, endpoints = sys.argv[1:]
workers = parse_workers(endpoints, "1,1")
model = load_backend(path, "llamacpp", threads=1, workers=workers, n_ctx=256)
model.score(model.tokenizer.encode("def f(x):"), 1)
print("loaded", flush=True)
sys.stdin.readline()  # the workers may be stopped meanwhile
del model
gc.collect()
print("freed;", sum(len(connections_to(e)) for e in workers.endpoints), "connections left", flush=True)
"""


def free_model(path: str, endpoints: str, before=lambda: None) -> tuple[int, str, str]:
    """A process loads a model on the workers, `before` runs, then the model is freed."""
    client = popen([sys.executable, "-c", FREE, path, endpoints],
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline() == "loaded\n"
        before()
        out, err = client.communicate("go\n", timeout=60)
        return client.returncode, out, err
    finally:
        end_group(client)


@pytest.mark.system
def test_a_model_freed_while_its_workers_answer_closes_its_connections(tiny):
    endpoints, procs = start_workers()  # a worker serves one connection at a time: these serve no one else
    try:
        assert free_model(tiny, endpoints)[:2] == (0, "freed; 0 connections left\n")
    finally:
        stop(procs)


@pytest.mark.system
def test_a_model_freed_after_its_workers_stopped_is_left_behind_and_the_process_goes_on(tiny):
    """Freeing a model sends its workers commands, and llama.cpp aborts the process when
    a worker is gone: a model outliving its workers (a test's, or a bench's, collected
    after the workers were stopped) ended its whole process with status 2. It is now
    left unfreed, and the process goes on."""
    endpoints, procs = start_workers()
    try:
        code, out, err = free_model(tiny, endpoints, before=lambda: stop(procs))
        assert code == 0 and out.startswith("freed;"), err  # its connections, closed by the workers, stay with it
    finally:
        stop(procs)


def start_worker(port: int):
    proc = popen([sys.executable, "-m", "specsample", "rpc-worker", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _answers(f"127.0.0.1:{port}"), 60, "the worker")
    return proc


def _answers(endpoint: str) -> bool:
    try:
        probe(endpoint, timeout=1)
        return True
    except WorkerError:
        return False


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.real
def test_a_server_outlives_a_worker_killed_mid_generation_and_reloads_in_place_once_it_is_back(real_pair):
    """The request being generated ends with a 503 naming the lost worker, /health and
    new requests say the same, and once the worker is started again the same process
    (same pid, same socket) serves again."""
    import httpx

    endpoints, procs = start_workers()
    port = free_port()
    model = real_pair.draft.rsplit("/", 1)[-1]
    url = f"http://127.0.0.1:{port}"
    server = popen(
        [sys.executable, "-m", "specsample", "serve", "--target", real_pair.draft, "--draft", "ngram", "-k", "2",
         "--target-rpc", endpoints, "--ctx-size", "1024", "--threads", "1", "--parallel", "1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def healthy() -> int | None:
        try:
            return httpx.get(url + "/health", timeout=30).status_code
        except httpx.TransportError:
            return None

    body = {"model": model, "prompt": "Count from 1 to 1000, one number per line:", "max_tokens": 900}
    try:
        wait_for(lambda: healthy() == 200, 120, "the server")
        lines = []
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    if len(lines) == 3:  # text is streaming: the target answers from its workers
                        procs[1].kill()
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][6:])["error"]
        assert error["code"] == "target_unavailable" and "RPC worker stopped answering" in error["message"]
        assert all("choices" in json.loads(line[6:]) for line in lines[:3])
        assert healthy() == 503
        r = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 4}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "target_unavailable"
        procs[1] = start_worker(int(endpoints.rsplit(":", 1)[1]))
        wait_for(lambda: healthy() == 200, 120, "the reload")
        r = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 8}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        assert server.poll() is None  # the same process throughout
    finally:
        end_group(server)
        err = server.stderr.read()
        stop(procs)
    assert "reloading the server" in err and "Traceback" not in err
