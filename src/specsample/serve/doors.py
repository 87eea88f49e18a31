"""Who may come in: the Host check, the API key and the JSON content type; and what a
client's text may put in a response header (header_value).

The three stop what a web page can do to a server on this machine. A page may send a
"simple" cross-site request (a text/plain POST, no preflight) to 127.0.0.1: only a
JSON content type is accepted, which a page cannot send without a CORS preflight that
this server never grants. A page may also make its own name resolve to 127.0.0.1 (DNS
rebinding) and then read the answers as same-origin: its requests carry its own name
as Host, so on a loopback bind only loopback names are accepted.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from starlette.requests import Request

from .errors import APIError
from .settings import check_api_key

# uvicorn configures this logger at the level `serve` runs with; ours would print nothing.
log = logging.getLogger("uvicorn.error")


def is_loopback(host: str) -> bool:
    """A name or address (an IPv6 one with or without brackets) that means this machine only."""
    host = host.strip().rstrip(".").lower()
    if host == "localhost":
        return True
    if host.startswith("[") != host.endswith("]"):  # "[::1" or "::1]": no address
        return False
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, without its port: "[::1]:8000" -> "[::1]". An IPv6
    literal followed by anything but a port ("[::1]evil.example") is returned whole,
    which no check takes for a loopback name."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal: only ":port" may follow the bracket
        name, bracket, rest = header.partition("]")
        port = rest.removeprefix(":")
        if bracket and (not rest or rest.startswith(":") and port.isascii() and port.isdigit()):
            return name + bracket
        return header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class CheckHost:
    """ASGI middleware: answer only requests whose Host is a loopback name or one of
    `allowed` (names, compared without the port). Every path, /health too: a rebound
    page must not learn even that a server is here."""

    def __init__(self, app, allowed: tuple[str, ...]):
        self.app = app
        self.allowed = {host_name(a).rstrip(".") for a in allowed}  # "name:port" allows the name

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
            name = host_name(hosts[0]).rstrip(".") if len(hosts) == 1 else None
            if name is None or not (is_loopback(name) or name in self.allowed):
                shown = repr(hosts[0]) if len(hosts) == 1 else f"{len(hosts)} Host headers"
                error = APIError(421, f"Host {shown} is not served here: this server answers loopback names"
                                 f"{' and ' + ', '.join(sorted(self.allowed)) if self.allowed else ''} "
                                 "(start it with --allowed-hosts to add names)", code="host_not_allowed")
                return await error.response()(scope, receive, send)
        await self.app(scope, receive, send)


class RequireKey:
    """ASGI middleware: every path but /health needs one `Authorization: Bearer <key>`
    header (the scheme in any case, RFC 7235)."""

    def __init__(self, app, key: str):
        check_api_key(key)
        self.app = app
        self.expected = key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = [v for k, v in scope["headers"] if k == b"authorization"]
            error = None
            if len(given) > 1:  # proxies and clients disagree on which one counts
                error = APIError(400, f"{len(given)} Authorization headers: send exactly one",
                                 code="invalid_authorization")
            else:
                scheme, _, credentials = (given[0] if given else b"").partition(b" ")
                valid = hmac.compare_digest(credentials.lstrip(b" "), self.expected)  # constant time
                if scheme.lower() != b"bearer" or not valid:
                    error = APIError(401, "a valid API key is required: Authorization: Bearer <key>",
                                     code="invalid_api_key")
            if error is not None:
                return await error.response()(scope, receive, send)
        await self.app(scope, receive, send)


def require_json(request: Request) -> None:
    """A JSON body must say so (parameters such as charset allowed): a text/plain POST
    is one a web page may send cross-site without asking."""
    given = request.headers.get("content-type", "")
    if given.split(";", 1)[0].strip().lower() != "application/json":
        raise APIError(415, "the body must be sent as Content-Type: application/json, "
                       f"not {repr(given) if given else 'without one'}", code="unsupported_media_type")


MAX_HEADER_VALUE = 1024  # characters of client text in one header; a client reads its body for more


def header_value(text: str) -> str:
    """Client text (a schema's format name, say) made safe to send in a header: printable
    ASCII as it is, everything else (ESC, DEL, CR, LF, non-ASCII) as Python's backslash
    escapes, and cut at MAX_HEADER_VALUE. Every header built from client input goes
    through here."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= MAX_HEADER_VALUE else escaped[: MAX_HEADER_VALUE - 3] + "..."
