"""A target across machines on llama.cpp's RPC backend.

llama.cpp's RPC backend is the engine: a worker exposes its CPU (ggml's CPU backend)
over TCP, and a client places a model's layers on the workers it names, as it places
them on GPUs. We add three things around it:

- `serve_worker`: the worker, from the llama-cpp-python the project installs (the
  Makefile builds it with GGML_RPC), so worker and client are one llama.cpp version;
- `probe`: a worker's protocol version read before llama.cpp touches it, because
  llama.cpp aborts the whole process on a worker it cannot talk to (a wrong address
  would take the server down) and prints a version mismatch without failing;
- `devices`: the RPC devices of a worker set, the list a model load takes.

The protocol has no authentication and no encryption: whoever reaches llama.cpp's
server can run graphs on it and read what it holds. `specsample rpc-worker` puts a
guard in front of it (rpc_front.py: bounds, timeouts, a restart) and, with --rpc-key,
a shared-secret handshake (rpc_key.py) that keeps strangers out; the traffic stays
unencrypted. Workers bind to 127.0.0.1 unless told otherwise (docs/distributed.md).

Wire format (ggml-rpc.cpp of the pinned tree): a request is one command byte, an 8-byte
little-endian size and that many bytes; a reply is an 8-byte size and its bytes. The
first command of a connection must be HELLO, answered with the protocol's major,
minor and patch version. A worker serves one connection at a time.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .rpc_key import ENV, MAGIC, local, read_exactly, relay_for

# The protocol of the pinned llama.cpp (ggml/include/ggml-rpc.h: RPC_PROTO_*_VERSION).
PROTOCOL = (2, 0, 0)
CMD_HELLO = 14  # rpc_cmd's RPC_CMD_HELLO
TRUST_WARNING = ("the RPC protocol has no authentication or encryption: anyone who reaches this port can run "
                 "code on this worker's memory; keep it on a trusted network only, or give it --rpc-key")
KEYED_NOTE = ("clients must present --rpc-key (or SPECSAMPLE_RPC_KEY); the traffic itself is not encrypted: "
              "keep it on a trusted network or a tunnel")
REBUILD_HINT = "run `make` again (its install builds llama-cpp-python with -DGGML_RPC=ON)"


class WorkerError(RuntimeError):
    """A worker cannot serve this client; the message is one line naming it."""


class RpcUnsupported(WorkerError):
    """This llama-cpp-python was built without the RPC backend."""


@dataclass(frozen=True)
class RpcWorkers:
    """The worker set a target lives on, and the share of its layers each takes
    (None: llama.cpp splits by each worker's free memory)."""

    endpoints: tuple[str, ...]
    split: tuple[float, ...] | None = None
    secret: str | None = field(default=None, repr=False, compare=False)  # --rpc-key: the workers' shared key

    def __post_init__(self):
        if not self.endpoints:
            raise ValueError("--target-rpc names no worker")
        if self.split is not None and len(self.split) != len(self.endpoints):
            raise ValueError(f"--tensor-split has {len(self.split)} shares for {len(self.endpoints)} workers")

    @property
    def key(self) -> str:
        """Identifies the worker set in cost caches: another set is another cost curve."""
        split = "" if self.split is None else ":" + ",".join(f"{s:g}" for s in self.split)
        return "rpc-" + "+".join(self.endpoints) + split


def joined(*sets: RpcWorkers | None) -> RpcWorkers | None:
    """Every worker of these sets (a target's and a draft's), once each; None for none."""
    endpoints = tuple(dict.fromkeys(e for w in sets if w is not None for e in w.endpoints))
    return RpcWorkers(endpoints) if endpoints else None


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"an RPC worker is host:port, got {text!r}")
    return host, int(port)


def parse_workers(endpoints: str, split: str | None = None, secret: str | None = None) -> RpcWorkers:
    """--target-rpc host:port[,host:port...] and --tensor-split a,b,... as a RpcWorkers,
    keyed with `secret` (--rpc-key), else with $SPECSAMPLE_RPC_KEY where it is set."""
    names = tuple(e.strip() for e in endpoints.split(",") if e.strip())
    for name in names:
        parse_endpoint(name)
    shares = None
    if split:
        try:
            shares = tuple(float(s) for s in split.split(","))
        except ValueError:
            raise ValueError(f"--tensor-split is numbers separated by commas, got {split!r}") from None
        if any(s < 0 for s in shares) or not sum(shares) > 0:
            raise ValueError(f"--tensor-split needs shares >= 0 that sum above 0, got {split!r}")
    return RpcWorkers(names, shares, secret or os.environ.get(ENV) or None)


def probe(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """The worker's protocol version, or a WorkerError saying why it cannot serve us:
    unreachable, not an RPC worker, or another llama.cpp's protocol."""
    host, port = parse_endpoint(endpoint)
    via = local(endpoint)  # a keyed client's relay (rpc_key.py), else the worker
    try:
        with socket.create_connection(parse_endpoint(via), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", CMD_HELLO, 0))
            reply = read_exactly(sock, 11)
    except (OSError, EOFError) as e:
        hint = " (is the worker started with the same --rpc-key?)" if via != endpoint else ""
        raise WorkerError(f"RPC worker {endpoint} is unreachable ({_reason(e)}{hint}); start it with "
                          f"`specsample rpc-worker --host {host} --port {port}`") from None
    if reply.startswith(MAGIC):
        raise WorkerError(f"RPC worker {endpoint} asks for a key: give this client the worker's --rpc-key "
                          f"(or set {ENV})")
    size, major, minor, patch = struct.unpack("<QBBB", reply)
    if size != 3:
        raise WorkerError(f"{endpoint} did not answer as a llama.cpp RPC worker")
    if (major, minor) != PROTOCOL[:2]:
        raise WorkerError(f"RPC worker {endpoint} speaks protocol {major}.{minor}.{patch}, this llama.cpp "
                          f"{'.'.join(map(str, PROTOCOL))}: run the worker from the same specsample install")
    return major, minor, patch


def _reason(error: BaseException) -> str:
    if isinstance(error, socket.timeout):
        return "no answer in time; a worker serves one client at a time: is another process using it?"
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def _ggml(name: str) -> ctypes.CDLL:
    """One of llama-cpp-python's ggml libraries (already loaded with libllama: the same
    copy, found by its soname)."""
    import llama_cpp

    return ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / f"lib{name}.so"))


def require_rpc(lib) -> None:
    if not lib.llama_supports_rpc():
        raise RpcUnsupported(f"this llama-cpp-python was built without RPC support; {REBUILD_HINT}")


def devices(lib, workers: RpcWorkers):
    """The NULL-terminated device list of a model load that puts its layers on these
    workers, each probed first (a WorkerError, never llama.cpp's abort)."""
    require_rpc(lib)
    for endpoint in workers.endpoints:
        if workers.secret is not None:
            relay_for(endpoint, workers.secret)
        # A worker this process already holds a model on is known to answer, and a
        # probe's second connection would wait until that model is freed.
        if not connections_to(endpoint):
            probe(endpoint)
    ggml = _ggml("ggml")
    ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_device") if reg else None
    if not address:
        raise RpcUnsupported(f"llama.cpp's RPC backend is not registered; {REBUILD_HINT}")
    add_device = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    found = (ctypes.c_void_p * (len(workers.endpoints) + 1))()
    for i, endpoint in enumerate(workers.endpoints):
        found[i] = add_device(local(endpoint).encode())
    return found


_abort_guard = None  # the ctypes callback, alive for the process's lifetime
_on_lost = None  # what a lost worker is told to instead of ending the process (on_lost_worker)
LOST_WORKER = "a llama.cpp RPC worker stopped answering in the middle of a call ({})"


def guard_aborts() -> None:
    """llama.cpp's RPC client aborts the process when a worker dies mid-call (a core dump
    under a backtrace, or a hang in whatever waits on it). Before that abort, ggml calls
    this callback. For an RPC failure it says what happened in one line and then either
    ends the process with status 2, as the CLI's other errors do, or, where a server
    asked to hear of it (on_lost_worker), tells the server and parks the calling thread
    for good: the call can neither return nor go on, and the abort that would follow
    never comes. Any other abort keeps ggml's own report."""
    global _abort_guard
    if _abort_guard is not None:
        return
    base = _ggml("ggml-base")
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

    def on_abort(message: bytes | None) -> None:
        text = (message or b"").decode("utf-8", "replace").strip()
        if "RPC" not in text:
            return
        line = LOST_WORKER.format(text.rsplit(": ", 1)[-1])
        if _on_lost is None:
            print(f"specsample: error: {line}; this process cannot go on with its target and stops here",
                  file=sys.stderr, flush=True)
            os._exit(2)
        try:
            _on_lost(line)
        finally:
            threading.Event().wait()  # parked: the thread inside llama.cpp never returns to it

    _abort_guard = callback_type(on_abort)
    base.ggml_set_abort_callback.argtypes = [callback_type]
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    base.ggml_set_abort_callback(_abort_guard)


def on_lost_worker(handler) -> None:
    """From now on a worker lost mid-call calls handler(line) on the thread of that call,
    which then never returns (guard_aborts), instead of ending the process."""
    global _on_lost
    _on_lost = handler


def release(workers: RpcWorkers) -> int:
    """Shut down this process's connections to the workers, leaving their descriptors to
    whoever holds them. A worker serves one connection at a time: one that outlived
    its partner still serves ours, held by a call that will never return, and answers
    nobody else (a probe, or this process started afresh) until it is shut. Returns how
    many were shut."""
    shut = 0
    for endpoint in workers.endpoints:
        for fd in connections_to(endpoint):
            try:
                with socket.socket(fileno=os.dup(fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
                shut += 1
            except OSError:  # closed meanwhile
                continue
    return shut


def still_connected(workers: RpcWorkers) -> bool:
    """Whether this process holds an open connection to every one of the workers that
    the peer has not closed: a worker that died or was stopped has closed it (read
    without waiting, it reads as its end, or as reset), and one this process never
    reached, or lost, has none."""
    for endpoint in workers.endpoints:
        fds = connections_to(endpoint)
        if not fds:
            return False
        for fd in fds:
            try:
                with socket.socket(fileno=os.dup(fd)) as sock:
                    if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        return False
            except BlockingIOError:  # open, and nothing to read: the worker waits for us
                continue
            except OSError:  # reset, or closed meanwhile
                return False
    return True


def connections_to(endpoint: str) -> list[int]:
    """This process's open TCP connections to a worker (descriptor numbers): llama.cpp
    keeps one per worker for as long as a model placed there lives, shared by every
    model of this process on that worker."""
    host, port = parse_endpoint(local(endpoint))
    try:
        addresses = {address[:2] for *_, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        names = os.listdir("/proc/self/fd")
    except OSError:  # an unknown host, or no /proc
        return []
    found = []
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                if sock.type == socket.SOCK_STREAM and sock.getpeername()[:2] in addresses:
                    found.append(int(name))
        except OSError:  # closed meanwhile, not connected, or not ours to read
            continue
    return found


def place_on(params, lib, workers: RpcWorkers, keep: list) -> None:
    """Model-load params that put every layer (and the output layer) on the workers,
    split as `workers.split` says. `keep` holds the ctypes arrays the params point
    into for as long as the load runs."""
    found = devices(lib, workers)
    guard_aborts()
    # A worker on this machine computes while we wait on it: its CPU time is ours, or
    # the draft's steps, run right after each target call, would yield it their cores.
    from .cpushare import SHARED

    SHARED.count_as_ours(local_worker_pids(workers))
    params.devices = ctypes.cast(found, ctypes.c_void_p)
    params.n_gpu_layers = 10_000  # every layer, as llama.cpp's -ngl 999
    keep.append(found)
    if workers.split is not None:
        shares = (ctypes.c_float * lib.llama_max_devices())(*workers.split)
        params.tensor_split = shares
        keep.append(shares)


def local_worker_pids(workers: RpcWorkers) -> set[int]:
    """The processes of this machine that listen on a worker's port, for the workers
    whose address is this machine's (empty off Linux, or for processes we may not see)."""
    ports = {port for host, port in map(parse_endpoint, workers.endpoints) if is_this_machine(host)}
    pids = listening_pids(ports) if ports else set()
    return pids | {child for pid in pids for child in _children(pid)}  # a guarded worker computes in its child


def _children(pid: int) -> set[int]:
    """The child processes of `pid` (empty where /proc cannot tell)."""
    found = set()
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            with open(f"{task.path}/children") as f:
                found |= {int(c) for c in f.read().split()}
    except OSError:
        pass
    return found


def apart(target: RpcWorkers | None, draft: RpcWorkers | None) -> bool:
    """Whether a target and a draft placed so (None: in this process) compute on cores
    of their own, so that drafting during the target's calls costs the calls nothing:
    one of them on workers elsewhere, or on local workers pinned away from the other."""
    return not cores(target) & cores(draft)


def cores(workers: RpcWorkers | None, pids=None) -> set:
    """Where a model computes, as a set that meets another's when the two may take
    turns on the same cores: the CPUs this process may run on for a model here; for
    workers, the CPUs of their processes on this machine and the endpoint of each one
    elsewhere (two models on one remote worker share it). A process we cannot read is
    taken to run anywhere."""
    if workers is None:
        return _affinity(0)
    found = {e for e in workers.endpoints if not is_this_machine(parse_endpoint(e)[0])}
    for pid in local_worker_pids(workers) if pids is None else pids:
        found |= _affinity(pid)
    return found


def _affinity(pid: int) -> set[int]:
    """The CPUs process `pid` (0: this one) may run on; every CPU if it cannot be read."""
    try:
        return set(os.sched_getaffinity(pid))
    except (AttributeError, OSError):  # not Linux; gone, or not ours to read
        return set(range(os.cpu_count() or 1))


def is_this_machine(host: str) -> bool:
    """Whether `host` names an address of this machine: one it can bind to."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((address[0], 0))
        return True
    except OSError:
        return False


def listening_pids(ports: set[int]) -> set[int]:
    """Processes listening on any of these TCP ports, read from /proc/net and each
    process's open files."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:  # sl local_address rem_address st ... inode
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) in ports:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    pids = set()
    if not inodes:
        return pids
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd.path) in inodes for fd in os.scandir(f"{entry.path}/fd")):
                pids.add(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def serve_worker(host: str, port: int, threads: int, memory_mb: int | None = None,
                 cache: Path | None = None) -> None:
    """Serve this machine's CPU to RPC clients until the process is stopped (blocks)."""
    import llama_cpp

    require_rpc(llama_cpp)
    cpu, rpc = _ggml("ggml-cpu"), _ggml("ggml-rpc")
    cpu.ggml_backend_cpu_init.restype = ctypes.c_void_p
    cpu.ggml_backend_cpu_set_n_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                                   ctypes.c_size_t, ctypes.c_size_t]
    backend = cpu.ggml_backend_cpu_init()
    if not backend:
        raise WorkerError("ggml could not start its CPU backend")
    cpu.ggml_backend_cpu_set_n_threads(backend, threads)
    from .context_size import available_memory

    total = memory_mb * 1024 * 1024 if memory_mb else available_memory()
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:  # a taken port is one line here; ggml's own bind failure prints and returns
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise WorkerError(f"cannot listen on {host}:{port}: {_reason(e)}") from None
    rpc.ggml_backend_rpc_start_server(backend, f"{host}:{port}".encode(),
                                      str(cache).encode() if cache is not None else None, total, total)
    raise WorkerError(f"the RPC worker on {host}:{port} stopped (could it listen there?)")
