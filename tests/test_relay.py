"""The bench's delay relay adds the one-way delay it is set to, measured, and passes every byte."""

import os
import socket
import threading

import pytest

from specsample.bench.relay import DelayRelay, round_trip

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
