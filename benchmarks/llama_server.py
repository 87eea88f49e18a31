"""Builds the llama-server the bench compares with, once: python -m benchmarks.llama_server

The pinned llama-cpp-python sdist (native.py's version) vendors the
llama.cpp tree our llama.cpp backend runs; only its `llama-server` target is built, with
CMake, static, and the binary is cached where the research bench looks for it
(native.server_path). `make demo` runs this first; benchmarks/ttft.py calls it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from specsample import processes
from specsample.files import build_once

from .native import LLAMA_CPP_PYTHON_VERSION, NativeUnavailable, server_path

CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DGGML_NATIVE=ON")
# Seconds each step may take on a slow machine before we call it stuck.
PIP_TIMEOUT, CONFIGURE_TIMEOUT, BUILD_TIMEOUT = 600, 600, 3600


def ensure_server(build: bool = True, jobs: int = 2, log=None) -> Path:
    """The cached llama-server binary, built from the pinned sdist on first use.

    Built once (build_once): a second bench waits for the first's build instead of
    compiling again, and the binary appears under its name only when whole, so no
    reader runs a half-copied file."""
    path = server_path()
    if path.is_file():
        return path
    if not build:
        raise NativeUnavailable(f"{path} is not built")
    missing = [tool for tool in ("cmake", "c++", "cc") if shutil.which(tool) is None]
    if missing:
        raise NativeUnavailable(f"cannot build llama-server: {', '.join(missing)} not found")
    log = log or (lambda msg: print(f"specsample: {msg}", file=sys.stderr, flush=True))

    def build_into(out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="specsample-llama-") as tmp:
            source = _vendored_source(Path(tmp), log)
            build_dir = Path(tmp) / "build"
            log(f"building llama-server from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} (a few minutes, done once)")
            _run(["cmake", "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS], CONFIGURE_TIMEOUT)
            _run(["cmake", "--build", str(build_dir), "--target", "llama-server", f"-j{jobs}"], BUILD_TIMEOUT)
            shutil.copy2(build_dir / "bin" / "llama-server", out)

    return build_once(path, build_into, ready=Path.is_file,
                      waiting=lambda: log("another process is building llama-server; waiting for it"))


def _vendored_source(tmp: Path, log) -> Path:
    log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist")
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
          "--disable-pip-version-check", "-d", str(tmp), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], PIP_TIMEOUT)
    sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"), None)
    if sdist is None:
        raise NativeUnavailable("pip left no llama-cpp-python sdist")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"


def _run(cmd: list[str], timeout: float) -> None:
    name = Path(cmd[0]).name if cmd[0] != sys.executable else "pip"
    try:
        done = processes.run(cmd, timeout)
    except subprocess.TimeoutExpired:
        raise NativeUnavailable(f"{name} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise NativeUnavailable(f"{name} failed: {last[0]}")


def main() -> int:
    try:
        print(ensure_server(jobs=min(2, os.cpu_count() or 1)))
    except NativeUnavailable as e:
        print(f"benchmarks.llama_server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
