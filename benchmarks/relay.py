"""A local TCP relay that delays every message by a fixed one-way time: a network's
latency between a client and its RPC workers, on one machine (docs/distributed.md).

Each chunk read from one side is written to the other `delay` seconds after it
arrived, in order, so a request and its reply each pay the delay once (a round trip
pays it twice) and bandwidth is left as the loopback's. The relay runs an asyncio
loop in a thread of the process that starts it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time


class DelayRelay:
    """Listens on 127.0.0.1:port and relays each connection to `upstream` (host:port),
    every chunk `delay` seconds late in each direction. Use as a context manager."""

    def __init__(self, upstream: str, delay: float):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.delay = delay
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"relay-{upstream}")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "DelayRelay":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay relay did not start")
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
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        for w in (writer, up_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward what `reader` yields, each chunk `delay` after it arrived: a queue
        keeps the order and lets chunks that arrive close together be in flight at once."""
        queue: asyncio.Queue = asyncio.Queue()

        async def send():
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(1 << 20):
                queue.put_nowait((time.monotonic() + self.delay, data))
        finally:
            queue.put_nowait(None)
            await sender
