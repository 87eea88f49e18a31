"""A server whose target lives on RPC workers outlives a worker that dies.

llama.cpp cannot finish a call whose worker died, nor free what that worker held: the
call's thread is parked inside it for good (rpc.guard_aborts). So the server answers
every request, those being generated, those waiting and those to come, with a 503
that says what happened, and /health turns 503 too. Meanwhile a thread probes the
workers; once every one of them answers again, the process starts afresh in place
(exec, same pid) and keeps its listening socket: clients that connect during the
reload wait in its backlog and are served once the target is loaded again.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time

from ..backends import rpc
from .worker import TargetLost, Worker

LISTENER_FD = "SPECSAMPLE_LISTEN_FD"  # the socket a reload inherits, by descriptor number
log = logging.getLogger("specsample.serve")


def run(app, workers: rpc.RpcWorkers, **options) -> None:
    """uvicorn.run(app, **options), on a listening socket inherited from the process this
    one replaced, if any, and reloading in place when a worker is lost."""
    import uvicorn

    config = uvicorn.Config(app, **options)
    listener = inherited_listener() or config.bind_socket()
    reload_when_lost(app.state.server.worker, workers, listener)
    uvicorn.Server(config).run(sockets=[listener])


def inherited_listener() -> socket.socket | None:
    """The listening socket of the process this one replaced (a reload), if any."""
    fd = os.environ.pop(LISTENER_FD, None)
    if fd is None:
        return None
    listener = socket.socket(fileno=int(fd))
    listener.set_inheritable(False)  # until the next reload
    return listener


def reload_when_lost(worker: Worker, workers: rpc.RpcWorkers, listener: socket.socket,
                     argv: list[str] | None = None, poll: float = 1.0) -> None:
    """From now on a worker lost mid-call fails the server's requests with a 503 and,
    once every worker answers again, reloads the server in place with `argv`
    (default: this process's own command line)."""
    argv = argv or [sys.executable, "-m", "specsample", *sys.argv[1:]]

    def lost(line: str) -> None:
        error = TargetLost(f"{line}; the server reloads its target once every RPC worker answers again "
                           f"({', '.join(workers.endpoints)})")
        log.error("%s", error)
        worker.lose(error)
        threading.Thread(target=_reload, args=(workers, listener, argv, poll), name="specsample-reload",
                         daemon=True).start()

    rpc.on_lost_worker(lost)


def _reload(workers: rpc.RpcWorkers, listener: socket.socket, argv: list[str], poll: float) -> None:
    rpc.release(workers)  # a worker that outlived its partner still serves our dead call
    time.sleep(poll)  # the 503s just sent reach their clients before the process is replaced
    said = None
    while True:
        try:
            for endpoint in workers.endpoints:
                rpc.probe(endpoint, timeout=poll)
            break
        except rpc.WorkerError as e:
            if str(e) != said:  # once per reason, not once a second
                log.warning("waiting for the RPC workers: %s", e)
                said = str(e)
            time.sleep(poll)
    log.warning("every RPC worker answers again: reloading the server, its socket kept open meanwhile")
    sys.stdout.flush()
    sys.stderr.flush()
    fd = listener.fileno()
    os.set_inheritable(fd, True)
    os.closerange(3, fd)  # what llama.cpp opened without close-on-exec, its dead connections too
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    os.execve(argv[0], argv, {**os.environ, LISTENER_FD: str(fd)})
