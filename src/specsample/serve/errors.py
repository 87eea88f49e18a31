"""OpenAI's error shape, {"error": {"message", "type", "param", "code"}}, as the one
exception every part of the server raises for a request it cannot answer."""

from __future__ import annotations

from starlette.responses import JSONResponse

from .events import End, Ended
from .worker import ShuttingDown, TargetLost


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class ClientGone(APIError):
    """The client left (or gave up waiting): nobody reads the answer."""

    def __init__(self):
        super().__init__(499, "client disconnected")


def ending_error(ended: Ended) -> APIError | None:
    """What a job's end means for its request; None when it finished."""
    if ended.end is End.DONE:
        return None
    if ended.end is End.CANCELLED:
        return ClientGone()
    if ended.end is End.REFUSED:  # stream()'s verdict on the request (context, vocabularies)
        return APIError(400, str(ended.error))
    if isinstance(ended.error, TargetLost):
        return target_lost(ended.error)
    if isinstance(ended.error, ShuttingDown):  # cut short: the server is stopping
        return shutting_down(ended.error)
    return APIError(500, f"generation failed: {type(ended.error).__name__}", type="server_error")


def target_lost(error: TargetLost) -> APIError:
    return APIError(503, str(error), type="server_error", code="target_unavailable")


def shutting_down(error: ShuttingDown) -> APIError:
    return APIError(503, str(error), type="server_error", code="shutting_down")
