"""The guarded `specsample rpc-worker` (backends/rpc_front.py, rpc_key.py), attacked on
127.0.0.1 as issue 55 found it: one packet killed it, one silent connection held it,
and anyone who reached it was served."""

import json
import os
import socket
import struct
import subprocess
import sys
import time

import psutil
import pytest

from specsample.backends.rpc import PROTOCOL, WorkerError, probe
from specsample.backends.rpc_front import FIXED, SET_TENSOR, TENSOR, Refused, check
from specsample.backends.rpc_key import MAGIC, KeyRelay

from process_guard import end_group, popen
from tiny_rpc import NO_EOS_FLAGS, write_tiny_rpc_gguf

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specsample[llamacpp]')")

MEGABYTES = 64
HELLO = struct.pack("<BQ", 14, 0)


@pytest.mark.pure
def test_requests_out_of_the_protocols_bounds_are_refused_and_those_in_them_pass():
    largest = 64 << 20  # the client's largest buffer on the worker
    for command, size in FIXED.items():
        check(command, size, largest)
        with pytest.raises(Refused):
            check(command, size + 1, largest)
    check(SET_TENSOR, TENSOR + 8 + largest, largest)  # a tensor as large as its buffer
    for command, size in [(SET_TENSOR, 2**64 - 1), (SET_TENSOR, 2**62), (SET_TENSOR, TENSOR + 9 + largest),
                          (SET_TENSOR, 7), (10, 2**64 - 1), (15, 0), (255, 0)]:
        with pytest.raises(Refused):
            check(command, size, largest)
    with pytest.raises(Refused):  # no buffer yet: no tensor to set
        check(SET_TENSOR, TENSOR + 9, 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(*flags: str):
    """A worker of one thread and 64 MB, once it answers; (endpoint, process)."""
    port = free_port()
    proc = popen([sys.executable, "-m", "specsample", "rpc-worker", "--port", str(port), "--threads", "1",
                  "--mem", str(MEGABYTES), "--timeout", "1", *flags],
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.1)
    return endpoint, proc


def serves(endpoint: str, timeout: float = 5) -> bool:
    """A client's first steps, as llama.cpp takes them: HELLO, then the worker's memory."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(HELLO)
        assert read(sock, 11) == struct.pack("<QBBB", 3, *PROTOCOL)
        sock.sendall(struct.pack("<BQ", 11, 0))  # GET_DEVICE_MEMORY
        return read(sock, 24) == struct.pack("<QQQ", 16, MEGABYTES << 20, MEGABYTES << 20)


def read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n and (chunk := sock.recv(n - len(data))):
        data += chunk
    return data


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except socket.timeout:
        return False


@pytest.fixture(scope="module")
def worker():
    endpoint, proc = start_worker()
    try:
        yield endpoint
    finally:
        end_group(proc)


@pytest.mark.system
def test_one_set_tensor_of_two_to_the_64_bytes_no_longer_kills_the_worker(worker):
    host, port = worker.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as attack:
        attack.sendall(HELLO + struct.pack("<BQ", SET_TENSOR, 2**64 - 1))
        assert closed_within(attack, 5)  # refused: its connection closed
    assert serves(worker)


@pytest.mark.system
def test_a_silent_or_truncated_connection_blocks_no_one_and_is_closed_after_the_timeout(worker):
    host, port = worker.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    truncated = socket.create_connection((host, int(port)))
    truncated.sendall(HELLO[:3])
    with silent, truncated:
        started = time.monotonic()
        assert probe(worker, timeout=2) == PROTOCOL and serves(worker, timeout=2)
        assert time.monotonic() - started < 1  # served at once, not after the others' timeout
        assert closed_within(silent, 3) and closed_within(truncated, 3)
    # One that said HELLO and then nothing, holding no memory there, holds the worker
    # for the timeout only (a client with a model holds it as long as the model lives).
    with socket.create_connection((host, int(port))) as idle:
        idle.sendall(HELLO)
        assert read(idle, 11)
        assert probe(worker, timeout=4) == PROTOCOL
        assert closed_within(idle, 1)


@pytest.mark.system
def test_a_worker_that_dies_anyway_is_restarted_and_its_client_sees_the_connection_closed():
    endpoint, proc = start_worker()
    try:
        host, port = endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as client:
            client.sendall(HELLO)
            assert read(client, 11)
            client.sendall(struct.pack("<BQQ", 0, 8, 1 << 20))  # ALLOC_BUFFER: it holds memory there
            assert len(read(client, 24)) == 24
            (child,) = psutil.Process(proc.pid).children()
            child.kill()
            assert closed_within(client, 5)  # what llama.cpp's client reads as a lost worker
        deadline = time.monotonic() + 30
        while True:
            try:
                assert serves(endpoint, timeout=2)
                break
            except (OSError, AssertionError):
                assert time.monotonic() < deadline, "the worker was not restarted"
                time.sleep(0.2)
        assert psutil.Process(proc.pid).children()[0].pid != child.pid
    finally:
        end_group(proc)
    assert "starting it again" in proc.stderr.read()


@pytest.mark.system
def test_a_keyed_worker_refuses_a_stranger_and_serves_a_client_with_the_key():
    endpoint, proc = start_worker("--rpc-key", "sesame")
    try:
        host, port = endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as stranger:
            stranger.sendall(HELLO)  # llama.cpp's client, or anyone's: no answer, then closed
            challenge = read(stranger, len(MAGIC) + 32)
            assert challenge.startswith(MAGIC) and closed_within(stranger, 3)
        with pytest.raises(WorkerError, match="asks for a key"):
            probe(endpoint)
        with KeyRelay(endpoint, "open") as wrong:
            with pytest.raises(WorkerError, match="unreachable"):
                probe(wrong.endpoint)
        with KeyRelay(endpoint, "sesame") as right:
            assert probe(right.endpoint) == PROTOCOL and serves(right.endpoint)
    finally:
        end_group(proc)
    assert "key required" in proc.stderr.read()


@pytest.mark.system
def test_a_model_on_a_keyed_worker_generates_through_the_clients_key_relay(tmp_path):
    """A model of any size goes through the relay as a real one does (tiny_rpc.py)."""
    model = write_tiny_rpc_gguf(tmp_path)
    endpoint, proc = start_worker("--rpc-key", "sesame")
    try:
        run = subprocess.run([sys.executable, "-m", "specsample", "generate", "--target", model, *NO_EOS_FLAGS,
                              "--draft", "ngram", "--target-rpc", endpoint, "--ctx-size", "256", "--threads", "1",
                              "--prompt", "def add(a, b):", "--max-new-tokens", "4", "--temperature", "0", "--json"],
                             env={**os.environ, "SPECSAMPLE_RPC_KEY": "sesame"}, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        assert len(json.loads(run.stdout)["token_ids"]) == 4
    finally:
        end_group(proc)
