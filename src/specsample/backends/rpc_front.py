"""The guard in front of llama.cpp's RPC server (`specsample rpc-worker`).

llama.cpp's server believes every byte it reads: a SET_TENSOR that declares 2^64-1
bytes ends it on an uncaught std::length_error, and as it serves one connection at a
time and reads without a timeout, a connection that never speaks holds it for everyone.
So the worker runs llama.cpp's server in a child process on a loopback port of its
own (ggml's server listens on TCP only), and this front listens on the public port:

- a connection must finish the key handshake (with --rpc-key, rpc_key.py) and its
  HELLO within `timeout` seconds, before it may queue for the worker: a silent or
  truncated one never reaches llama.cpp and is closed;
- clients then take the worker one at a time, in the order they said HELLO, as
  llama.cpp serves them; a connection that holds no buffer there yet (a probe, a
  query) may idle `timeout` seconds, one that does (a client with a model) for as
  long as its model lives;
- every request's header is read here and checked against the protocol's bounds
  before a byte of it is forwarded: the exact size of each fixed-size command, the
  largest buffer the client allocated for SET_TENSOR, 256 MiB for GRAPH_COMPUTE. One out of bounds, or one that
  stalls `timeout` seconds part-way, closes its connection, and llama.cpp frees what
  that client held;
- payloads and replies stream through in chunks, never held whole;
- a child that dies anyway is started again. Its client's connection is closed,
  which that client sees as a lost worker (rpc.guard_aborts), and the next client is
  served by the new one.

Frames (ggml-rpc.cpp of the pinned tree): a request is one command byte, an 8-byte
little-endian payload size and the payload; replies are forwarded as they are.
"""

from __future__ import annotations

import asyncio
import ctypes
import hmac
import os
import secrets
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from .rpc import WorkerError, _reason
from .rpc_key import CHALLENGE, MAGIC, _shut, forward, proof, read_exactly

HEADER = struct.Struct("<BQ")
TENSOR = 296  # sizeof(rpc_tensor), packed: GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64
HELLO, ALLOC_BUFFER, FREE_BUFFER, SET_TENSOR, GRAPH_COMPUTE = 14, 0, 4, 6, 10
# rpc_cmd -> its payload's exact size (rpc_msg_*_req of ggml-rpc.cpp)
FIXED = {0: 8, 1: 0, 2: 0, 3: 8, 4: 8, 5: 9, 7: TENSOR + 16, 8: TENSOR + 16, 9: 2 * TENSOR, 11: 0,
         12: TENSOR, 13: TENSOR, HELLO: 0}
# rpc_cmd -> its payload's least size. The most: for SET_TENSOR, the least plus the largest
# buffer the client has allocated (a tensor lives in one); for a graph, GRAPH_MOST.
VARIABLE = {SET_TENSOR: TENSOR + 8, GRAPH_COMPUTE: 8}
GRAPH_MOST = 1 << 28  # 256 MiB: ~900,000 tensors, some hundred times a 70B model's graph
CHUNK = 1 << 20
MB = 1 << 20


class Refused(Exception):
    """A request the front will not forward; the message says why."""


def check(command: int, size: int, largest: int) -> None:
    """Raises Refused for a request header out of the protocol's bounds, for a client
    whose largest buffer on the worker has `largest` bytes."""
    if command in FIXED:
        if size != FIXED[command]:
            raise Refused(f"command {command} with {size} bytes (it takes {FIXED[command]})")
    elif command in VARIABLE:
        most = VARIABLE[command] + (largest if command == SET_TENSOR else GRAPH_MOST)
        if not VARIABLE[command] <= size <= most:
            raise Refused(f"command {command} with {size} bytes (it takes {VARIABLE[command]} to {most})")
    else:
        raise Refused(f"unknown command {command}")


class Front:
    """llama.cpp's RPC server in a child process on 127.0.0.1, guarded on host:port."""

    def __init__(self, host: str, port: int, child_argv, timeout: float = 10.0, key: str | None = None,
                 log=lambda line: print(f"specsample: {line}", file=sys.stderr, flush=True)):
        self.host, self.port, self.timeout, self.key, self.log = host, port, timeout, key, log
        self.child_argv = child_argv  # port -> the argv of llama.cpp's server listening on 127.0.0.1:port
        self.upstream: int | None = None  # the child's port while it answers
        self.ready = asyncio.Event()
        self.turn = asyncio.Lock()  # one client at a time on the worker; its waiters are served in order
        self.child: asyncio.subprocess.Process | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        listener = socket.create_server((self.host, self.port), reuse_port=False)
        listener.setblocking(False)
        supervisor = asyncio.create_task(self._supervise())
        try:
            while True:
                conn, _ = await loop.sock_accept(listener)
                asyncio.create_task(self._connection(conn))
        finally:
            supervisor.cancel()
            listener.close()
            if self.child is not None and self.child.returncode is None:
                self.child.kill()
                await self.child.wait()

    async def _supervise(self) -> None:
        """Starts llama.cpp's server, and starts it again whenever it stops."""
        while True:
            port = _free_port()
            started = time.monotonic()
            self.child = await asyncio.create_subprocess_exec(*self.child_argv(port), stdin=asyncio.subprocess.DEVNULL,
                                                              preexec_fn=_die_with_parent)
            if await self._answers(port):
                self.upstream = port
                self.ready.set()
            code = await self.child.wait()
            self.ready.clear()
            self.upstream = None
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
            self.log(f"llama.cpp's RPC server stopped ({how}); starting it again")
            if time.monotonic() - started < 2:
                await asyncio.sleep(1)  # a server that cannot start is not restarted in a busy loop

    async def _answers(self, port: int) -> bool:
        """Waits until the child answers HELLO on its port (False: it stopped first)."""
        while self.child.returncode is None:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                try:
                    writer.write(HEADER.pack(HELLO, 0))
                    await reader.readexactly(11)
                    return True
                finally:
                    writer.close()
            except (OSError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.1)
        return False

    async def _connection(self, conn: socket.socket) -> None:
        """One client: its handshake here, then its turn on the worker in threads of
        blocking sockets, which cost a call less than the event loop's streams do."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.wait_for(self._handshake(conn), self.timeout)
            async with self.turn:
                await self.ready.wait()
                done = asyncio.get_running_loop().create_future()
                # a daemon thread, not the loop's executor: a client with a model may hold it for
                # good, and the process must still end on a signal
                threading.Thread(target=self._session, args=(conn, self.upstream, done), daemon=True).start()
                conn = None  # the session's now
                await done
        except (Refused, OSError, EOFError, asyncio.TimeoutError) as e:
            if isinstance(e, Refused):
                self.log(f"closed a connection from {_peer(conn)}: {e}")
        finally:
            if conn is not None:
                conn.close()

    async def _handshake(self, conn: socket.socket) -> None:
        """The key's challenge and response, where there is a key, then HELLO."""
        loop = asyncio.get_running_loop()
        if self.key is not None:
            nonce = secrets.token_bytes(CHALLENGE)
            await loop.sock_sendall(conn, MAGIC + nonce)
            expected = proof(self.key, nonce)
            if not hmac.compare_digest(await _recv_exactly(loop, conn, len(expected)), expected):  # constant time
                raise Refused("wrong key")
        command, size = HEADER.unpack(await _recv_exactly(loop, conn, HEADER.size))
        if (command, size) != (HELLO, 0):
            raise Refused(f"command {command} with {size} bytes before HELLO")

    def _session(self, conn: socket.socket, upstream: int, done) -> None:
        """(A thread.) The client's turn: replies forwarded as they come, requests each
        checked before any of it is forwarded. Either side's end ends both."""
        up = None
        try:
            conn.setblocking(True)
            up = socket.create_connection(("127.0.0.1", upstream))
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up.sendall(HEADER.pack(HELLO, 0))
            threading.Thread(target=forward, args=(up, conn), daemon=True, name="rpc-replies").start()
            self._requests(conn, up)
        except Refused as e:
            self.log(f"closed a connection from {_peer(conn)}: {e}")
        except (OSError, EOFError):  # either side gone, or a stall past the timeout
            pass
        finally:
            for sock in (conn, up):  # shut first: a close alone does not wake the replies thread's recv
                if sock is not None:
                    _shut(sock)
                    sock.close()
            done.get_loop().call_soon_threadsafe(done.set_result, None)

    def _requests(self, conn: socket.socket, up: socket.socket) -> None:
        buffer = memoryview(bytearray(CHUNK))
        largest = 0  # the client's largest buffer on the worker; one that holds any may idle
        while True:
            conn.settimeout(None if largest else self.timeout)
            header = read_exactly(conn, HEADER.size)
            conn.settimeout(self.timeout)  # a message stalled part-way closes
            command, size = HEADER.unpack(header)
            check(command, size, largest)
            if size <= CHUNK:  # the common case: one send, header and payload
                payload = read_exactly(conn, size)
                if command == ALLOC_BUFFER:
                    largest = max(largest, struct.unpack("<Q", payload)[0])
                up.sendall(header + payload)
                continue
            up.sendall(header)
            while size:
                n = conn.recv_into(buffer, min(size, CHUNK))
                if not n:
                    raise EOFError("the client closed mid-message")
                up.sendall(buffer[:n])
                size -= n


async def _recv_exactly(loop, conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await loop.sock_recv(conn, n - len(data))
        if not chunk:
            raise EOFError("the connection closed")
        data += chunk
    return data


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "a peer that left"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: killed when the front ends, even by SIGKILL (Linux's PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the front's own exit path ends it
        pass


def run(host: str, port: int, threads: int, memory_mb: int | None = None, cache: Path | None = None,
        timeout: float = 10.0, key: str | None = None) -> None:
    """The guarded worker on host:port until the process is stopped (blocks)."""
    from .context_size import available_memory

    megabytes = memory_mb or available_memory() // MB

    def child_argv(child_port: int) -> list[str]:
        return [sys.executable, "-m", __name__, str(child_port), str(threads), str(megabytes), str(cache or "")]

    front = Front(host, port, child_argv, timeout, key)
    try:
        asyncio.run(front.serve())
    except OSError as e:  # the public port: taken, or not this machine's
        raise WorkerError(f"cannot listen on {host}:{port}: {_reason(e)}") from None
    finally:
        if front.child is not None and front.child.returncode is None:  # ended by a signal mid-loop
            os.kill(front.child.pid, signal.SIGKILL)


if __name__ == "__main__":  # the child: llama.cpp's own server on 127.0.0.1 (Front.child_argv)
    from .rpc import serve_worker

    child_port, child_threads, child_mb, child_cache = sys.argv[1:]
    try:
        serve_worker("127.0.0.1", int(child_port), int(child_threads), int(child_mb),
                     Path(child_cache) if child_cache else None)
    except WorkerError as e:
        sys.exit(f"specsample: error: {e}")
