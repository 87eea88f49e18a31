"""The shared-secret handshake of a worker started with --rpc-key, and the client's
side of it.

On connecting, a keyed worker (rpc_front.py) sends MAGIC and a fresh random nonce; the
client answers HMAC-SHA256(key, nonce), which the worker compares in constant time.
The key never crosses the wire, and an answer is good for its own nonce only. After
that the connection is llama.cpp's protocol as before, unencrypted: the key keeps
strangers off a worker, it does not hide what a client sends (docs/distributed.md).

llama.cpp's client connects by itself, so a keyed client runs a relay per worker in
a thread of its own process: llama.cpp connects to the relay on 127.0.0.1, and the
relay connects to the worker, answers its challenge and then forwards bytes both ways.
A worker closing the connection closes llama.cpp's too, so a lost worker reads as lost
(rpc.still_connected) through the relay as without it.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading

MAGIC = b"SSRPCKEY"  # what a keyed worker sends first; a probe that reads it knows a key is wanted
CHALLENGE = 32  # bytes of nonce after it
ENV = "SPECSAMPLE_RPC_KEY"


def proof(key: str, nonce: bytes) -> bytes:
    return hmac.new(key.encode(), b"specsample-rpc:" + nonce, hashlib.sha256).digest()


class KeyRelay:
    """Listens on 127.0.0.1 (a free port) and relays each connection to `upstream`
    (host:port) once it has answered the worker's challenge with `key`, in threads of
    blocking sockets (a connection is one per worker and model: few, and each is on the
    path of every call). One from relay_for lives as long as its process; leaving a
    `with` block stops one."""

    def __init__(self, upstream: str, key: str, timeout: float = 10.0):
        host, _, port = upstream.rpartition(":")
        self.upstream, self.key, self.timeout = (host, int(port)), key, timeout
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name=f"rpc-key-{upstream}").start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "KeyRelay":
        return self

    def __exit__(self, *exc) -> None:
        _shut(self._listener)
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True, name="rpc-key-relay").start()

    def _relay(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(self.upstream, timeout=self.timeout)
        except OSError:
            conn.close()  # llama.cpp's client sees the connection closed
            return
        try:
            challenge = read_exactly(up, len(MAGIC) + CHALLENGE)
            if not challenge.startswith(MAGIC):
                raise EOFError("not a keyed worker")
            up.sendall(proof(self.key, challenge[len(MAGIC):]))
            up.settimeout(None)
            for sock in (conn, up):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=forward, args=(up, conn), daemon=True, name="rpc-key-replies").start()
            forward(conn, up)
        except (OSError, EOFError):
            _shut(conn)
        finally:
            conn.close()
            up.close()


def forward(source: socket.socket, sink: socket.socket) -> None:
    """Copies what `source` yields to `sink` until either ends, then shuts both down,
    which ends the copy the other way too."""
    buffer = memoryview(bytearray(1 << 20))
    try:
        while n := source.recv_into(buffer):
            sink.sendall(buffer[:n])
    except OSError:
        pass
    finally:
        _shut(source)
        _shut(sink)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected, or closed
        pass


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the connection closed")
        data += chunk
    return data


_relays: dict[tuple[str, str], KeyRelay] = {}
_lock = threading.Lock()


def relay_for(endpoint: str, key: str) -> str:
    """The local endpoint through which llama.cpp reaches `endpoint` with `key`: one
    relay per worker and key, started on first use and kept for the process's lifetime."""
    with _lock:
        if (endpoint, key) not in _relays:
            _relays[(endpoint, key)] = KeyRelay(endpoint, key)
        return _relays[(endpoint, key)].endpoint


def local(endpoint: str) -> str:
    """Where this process's llama.cpp connects to reach `endpoint`: its relay, if one was
    started, else the worker itself."""
    with _lock:
        return next((r.endpoint for (e, _), r in _relays.items() if e == endpoint), endpoint)
