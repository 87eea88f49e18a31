"""A deadline for a request's headers, which uvicorn does not set.

uvicorn closes a connection that idles between requests (timeout_keep_alive), but none
that never finishes its headers: it is not yet a request, so neither the body timeout
nor the app sees it, and each one counts against --max-connections. A few dozen such
sockets would turn every client away with 503s for as long as they stay. This protocol
closes a connection whose next request's headers have not all arrived within
`header_timeout` seconds of its opening or of its first byte after the last answer.
"""

from __future__ import annotations

import asyncio
import functools

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadline(H11Protocol):
    header_timeout = 10.0  # set per server by protocol()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request's headers are still coming (or about to)
            if self._header_timer is None:
                self._arm()
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # the keep-alive timeout now covers the idle connection
        if self.conn.their_state is not h11.IDLE:  # a pipelined request was read whole already
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete) \
                and not self.transport.is_closing():
            prefix = "%s:%d " % tuple(self.client) if self.client else ""
            self.logger.info("%ssent no complete request headers within %g s: closed", prefix, self.header_timeout)
            self.transport.close()


@functools.cache
def protocol(header_timeout: float) -> type[HeaderDeadline]:
    """uvicorn's `http` option: the h11 protocol with this deadline for headers."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": header_timeout})
