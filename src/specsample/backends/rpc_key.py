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

import asyncio
import hashlib
import hmac
import socket
import threading

MAGIC = b"SSRPCKEY"  # what a keyed worker sends first; a probe that reads it knows a key is wanted
CHALLENGE = 32  # bytes of nonce after it
ENV = "SPECSAMPLE_RPC_KEY"


def proof(key: str, nonce: bytes) -> bytes:
    return hmac.new(key.encode(), b"specsample-rpc:" + nonce, hashlib.sha256).digest()


class Relay:
    """Listens on 127.0.0.1 (a free port) and relays each connection to `upstream`
    (host:port) on an asyncio loop in a thread of this process, as `_connection` says.
    Relaying from the start; leaving its context stops it."""

    def __init__(self, upstream: str):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"relay-{upstream}")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the relay to {upstream} did not start")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)  # connections still open: ended here, not by the collector
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class KeyRelay(Relay):
    """A relay to a keyed worker that answers its challenge with `key`, then forwards
    bytes both ways. One from relay_for lives as long as its process."""

    def __init__(self, upstream: str, key: str, timeout: float = 10.0):
        self.key, self.timeout = key, timeout
        super().__init__(upstream)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer = None
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), self.timeout)
            challenge = await asyncio.wait_for(up_reader.readexactly(len(MAGIC) + CHALLENGE), self.timeout)
            if not challenge.startswith(MAGIC):
                return  # not a keyed worker: llama.cpp's client sees the connection closed
            up_writer.write(proof(self.key, challenge[len(MAGIC):]))
            for w in (writer, up_writer):
                w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipes = [asyncio.ensure_future(pipe(a, b)) for a, b in ((reader, up_writer), (up_reader, writer))]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)  # either side gone: both closed
            finally:
                for task in pipes:
                    task.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()
            if up_writer is not None:
                up_writer.close()


async def pipe(reader, writer) -> None:
    while data := await reader.read(1 << 20):
        writer.write(data)
        await writer.drain()


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
