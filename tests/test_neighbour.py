"""The research bench's --neighbour: the busy processes run for the block and are gone after it."""

import pytest

from benchmarks.neighbour import busy_neighbours

pytestmark = pytest.mark.system


def test_busy_neighbours_run_for_the_block_and_end_with_it():
    with busy_neighbours(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)


def test_an_error_in_the_block_still_ends_them():
    with pytest.raises(RuntimeError):
        with busy_neighbours(1) as procs:
            raise RuntimeError("the benchmark failed")
    assert procs[0].poll() is not None
