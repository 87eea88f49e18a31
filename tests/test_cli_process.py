"""The console script in a process of its own: an error is one line with no
traceback, and a closed stdout pipe ends it quietly. Not pure: each test starts a
Python process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specsample import cli

pytestmark = pytest.mark.system


def test_error_from_the_console_script_has_no_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specsample.cli", "generate", "--target", "nope", "--prompt", "x"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("specsample: error:") and "Traceback" not in done.stderr


@pytest.mark.parametrize("size", [10, 1 << 20])  # left in the buffer at exit; written while running
def test_a_closed_stdout_pipe_ends_quietly(size):
    """`specsample ... | head -c 10`: no BrokenPipeError traceback, no 'Exception ignored'."""
    script = f"""if True:
        import sys
        from specsample import cli
        sys.stdin.read()  # until the reader has gone
        cli.fetch_default = lambda spec: "x" * {size}
        sys.exit(cli.main(["fetch", "qwen2.5-coder-0.5b"]))
    """
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])}
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
    child.stdout.close()
    _, err = child.communicate(b"", timeout=120)
    assert (child.returncode, err.decode()) == (1, "")
