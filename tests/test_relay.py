"""The research bench's delay relay adds the one-way delay it is set to, measured, and passes every byte."""

import os
import socket
import threading
import time

import pytest

from benchmarks.relay import DelayRelay

pytestmark = pytest.mark.system


def echo_server() -> str:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve():
        while True:
            conn, _ = server.accept()
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(1 << 16), b"")],
                             daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{server.getsockname()[1]}"


def round_trip(endpoint: str, repeats: int = 20) -> float:
    """Median seconds for a one-byte echo through `endpoint` (to an echo server)."""
    host, _, port = endpoint.rpartition(":")
    times = []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(repeats):
            start = time.perf_counter()
            sock.sendall(b"x")
            assert sock.recv(1) == b"x"
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def test_a_round_trip_through_the_relay_pays_the_delay_twice_and_every_byte_arrives_in_order():
    upstream = echo_server()
    direct = round_trip(upstream)
    with DelayRelay(upstream, 0.02) as relay:
        delayed = round_trip(relay.endpoint, repeats=9)
        assert 0.04 <= delayed < 0.04 + 0.03 + direct
        payload = os.urandom(3 << 20)
        with socket.create_connection(("127.0.0.1", relay.port)) as sock:
            threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
            back = bytearray()
            while len(back) < len(payload):
                back += sock.recv(1 << 20)
        assert bytes(back) == payload
