"""A deadline on every phase of a connection, where uvicorn sets one only between requests.

Each connection holds a place under --max-connections until its socket is released; a
few dozen clients that stall in a phase with no deadline turn everyone else away with
503s for as long as they like. So each phase ends:

- headers: a request's headers must all arrive within `header_timeout` seconds of the
  connection's opening, or of its first byte after the last answer; else it is closed.
- idle between requests: uvicorn's keep-alive timeout.
- the body: the app's (read_request's --body-timeout, a 408).
- an answer given before the request's declared body arrived (a 401, 413, 415 or 408,
  or a GET that declares a body): h11 would need the rest before another request, so
  the connection is not reused. Its answer is flushed and the write side shut, so
  that a client still sending reads it whole; whatever else arrives is dropped, and
  the socket closes when the client closes or `keep-alive timeout` seconds after the
  answer, whichever comes first.
- unsent data: only the kernel's socket buffers hold an answer's bytes; once they are
  full, a client that has not made room for the rest within `send_timeout` seconds (a
  stream it stopped reading, a large answer, a close waiting to flush) is dropped: the
  socket is aborted, and the app sees a disconnect.
- shutting down: a request in flight gets `shutdown_grace` seconds to finish; then the
  app's SHUT_DOWN hook (app.py's lifespan state) ends it, a whole answer with a 503
  `shutting_down` and a stream with an error event and [DONE], before uvicorn's own
  deadline (timeout_graceful_shutdown, a second longer) would cancel it mid-answer.
"""

from __future__ import annotations

import asyncio
import functools

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import SHUTDOWN_SECONDS

SHUT_DOWN = "specsample.shut_down"  # the lifespan state's hook that ends every request in flight


class Deadlines(H11Protocol):
    header_timeout = 10.0  # set per server by protocol()
    send_timeout = 30.0
    shutdown_grace = float(SHUTDOWN_SECONDS)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._lingering = False  # answered; the rest of its body is dropped until the socket closes
        super().connection_made(transport)
        # Any byte the kernel does not take pauses the app's sends (uvicorn's flow
        # control) and starts the send deadline; the kernel's buffers are enough.
        transport.set_write_buffer_limits(high=0)
        self._arm("headers", self.header_timeout, self._no_headers)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request's headers are still coming (or about to)
            if "headers" not in self._timers:
                self._arm("headers", self.header_timeout, self._no_headers)
        else:
            self._disarm("headers")

    def on_response_complete(self) -> None:
        body_unread = self.conn.their_state is h11.SEND_BODY  # before a pipelined request starts
        super().on_response_complete()  # the keep-alive timeout now covers an idle connection
        if body_unread and not self.transport.is_closing():
            self._linger()
        elif self.conn.their_state is not h11.IDLE:  # a pipelined request was read whole already
            self._disarm("headers")

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm("send", self.send_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm("send")

    def shutdown(self) -> None:
        super().shutdown()
        stop = self.app_state.get(SHUT_DOWN)
        if stop is not None and self.cycle is not None and not self.cycle.response_complete:
            self._arm("shutdown", self.shutdown_grace, stop)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        super().connection_lost(exc)

    def _linger(self) -> None:
        self._lingering = True
        self._unset_keepalive_if_required()
        self._disarm("headers")
        if self.transport.can_write_eof():
            self.transport.write_eof()  # after the answer's last byte
        self._arm("linger", self.timeout_keep_alive, self.transport.close)

    def _arm(self, phase: str, seconds: float, expired) -> None:
        self._disarm(phase)
        self._timers[phase] = self.loop.call_later(seconds, self._expire, phase, expired)

    def _disarm(self, phase: str) -> None:
        timer = self._timers.pop(phase, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, phase: str, expired) -> None:
        del self._timers[phase]
        expired()

    def _no_headers(self) -> None:
        if self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete) \
                and not self.transport.is_closing():
            self.logger.info("%ssent no complete request headers within %g s: closed", self._who(), self.header_timeout)
            self.transport.close()

    def _not_reading(self) -> None:
        self.logger.info("%sstopped reading for %g s: dropped", self._who(), self.send_timeout)
        self.transport.abort()

    def _who(self) -> str:
        return "%s:%d " % tuple(self.client) if self.client else ""


@functools.cache
def protocol(header_timeout: float, send_timeout: float = 30.0,
             shutdown_grace: float = SHUTDOWN_SECONDS) -> type[Deadlines]:
    """uvicorn's `http` option: the h11 protocol with these deadlines."""
    return type("Deadlines", (Deadlines,), {"header_timeout": header_timeout, "send_timeout": send_timeout,
                                            "shutdown_grace": shutdown_grace})
