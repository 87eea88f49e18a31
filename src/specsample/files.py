"""Cache entries that concurrent and interrupted runs cannot corrupt.

The large artifacts in the cache (a fetched model, a converted model directory, a
requantized draft) are each made by `build_once`: the builder writes into a unique
temporary sibling that is renamed onto the final path only when complete, so a reader
sees a whole entry or none. A lock beside the path makes a second process wait for
the first and then use its result instead of building the same gigabyte again, and
any failure (an exception, Ctrl-C, a full disk) deletes the temporary.

A file's sha256 is remembered in a small stamp with the size and mtime_ns it had
(`verified_sha256`, `content_sha256`), so a gigabyte is hashed once per change of
the file, not on every start.

Small JSON caches (measured costs, token counts) are written atomically too, and read
back as None when absent or unreadable: they only save recomputing.

POSIX only (fcntl), like the engines this package drives.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

PARTIAL = ".partial"


@contextmanager
def locked(path: Path, waiting: Callable[[], None] | None = None):
    """An exclusive lock for `path`, held on `<name>.lock` beside it. The lock file is
    never deleted: a process that opened it before the deletion would lock an orphan
    and hold the lock alongside a later one. `waiting` is called if another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


@contextmanager
def atomic_output(path: Path):
    """A fresh path, in `path`'s folder, to write a file or a directory to; renamed onto
    `path` when the block completes, deleted when it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A private folder holds the temporary, so its name is unique and a directory
    # and a file are cleaned up alike.
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=PARTIAL, dir=path.parent))
    try:
        yield scratch / path.name
        if path.is_dir() and not path.is_symlink():
            path.rename(scratch / "stale")  # os.replace cannot overwrite a non-empty directory
        os.replace(scratch / path.name, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def build_once(path: Path, build: Callable[[Path], None], ready: Callable[[Path], bool] = Path.exists,
               waiting: Callable[[], None] | None = None) -> Path:
    """`path`, made by `build(tmp)` unless `ready(path)`. Concurrent callers build it
    once: the others wait for the lock, then find it ready."""
    if ready(path):
        return path
    with locked(path, waiting):
        if not ready(path):
            # Every builder holds the lock, so temporaries found now were left by a
            # killed process (SIGKILL, power loss): reclaim their space.
            for leftover in path.parent.glob(f".{glob.escape(path.name)}.*{PARTIAL}"):
                shutil.rmtree(leftover, ignore_errors=True)
            with atomic_output(path) as tmp:
                build(tmp)
    return path


def read_cached_json(path: Path | None):
    """A small cache file's contents, or None when absent or unreadable."""
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_cached_json(path: Path | None, data) -> None:
    """Best effort and atomic: concurrent writers leave one whole file, and a cache
    that cannot be written only costs recomputing it next time."""
    if path is None:
        return
    try:
        with atomic_output(path) as tmp:
            tmp.write_text(json.dumps(data))
    except OSError:
        pass


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _stat_key(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def remember_sha256(path: Path, stamp: Path, digest: str) -> None:
    """Record that `path`, as it is now (size, mtime_ns), has sha256 `digest`."""
    write_cached_json(stamp, {**_stat_key(path), "sha256": digest})


def content_sha256(path: Path, stamp: Path) -> str:
    """`path`'s sha256, from `stamp` while the file keeps the size and mtime_ns it had
    when last hashed, else hashed now and stamped."""
    seen = _stat_key(path)
    stamped = read_cached_json(stamp)
    if isinstance(stamped, dict) and isinstance(stamped.get("sha256"), str) and stamped == {**seen, "sha256": stamped["sha256"]}:
        return stamped["sha256"]
    digest = sha256_of(path)
    if _stat_key(path) == seen:  # a file written while it was read is hashed again next time
        write_cached_json(stamp, {**seen, "sha256": digest})
    return digest


def verified_sha256(path: Path, stamp: Path, expected: str) -> bool:
    """Whether `path`'s sha256 is `expected`: checked once per change of the file (its
    size or mtime_ns), the stamp written only after a check that passed."""
    stamped = read_cached_json(stamp)
    if stamped == {**_stat_key(path), "sha256": expected}:
        return True
    seen = _stat_key(path)
    if sha256_of(path) != expected:
        return False
    if _stat_key(path) == seen:
        write_cached_json(stamp, {**seen, "sha256": expected})
    return True
