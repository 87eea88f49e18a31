"""Where each test runs, and the real default pair.

Every test says where it runs with exactly one of three markers (registered in
pyproject.toml), at module level (`pytestmark`) unless a file mixes kinds:

- pure: deterministic CPU work on toy or tiny models: no real model, process, socket or
  clock. `make test` (tests/suite.sh) runs these on every core in the idle scheduling
  class, beside the others, on the cycles they leave idle (`-m pure -n auto`).
- system: starts processes or servers, opens sockets, or depends on wall-clock time;
  two files at a time (`-m system -n 2 --dist loadfile`), no two of a file's tests at once.
- real: loads the real default pair through the `real_pair` fixture below, which skips it
  (saying why) until `specsample fetch` has run; one at a time, as the models need the
  cores (`-m real`).

A file with a test that has none of them or two, or that asks for `real_pair` without
being marked real (or the reverse), fails collection: a new file must say where it runs.
So the three runs together run every test exactly once.
"""

from typing import NamedTuple

import pytest

pytest_plugins = ["process_guard"]  # nothing a test starts outlives the run

from specsample.backends.models import DEFAULT_DRAFT, DEFAULT_MODELS, DEFAULT_TARGET, cache_dir

PLACES = ("pure", "system", "real")


_SHARED: dict[tuple, object] = {}  # (role, engine, options) -> a backend loaded once this session


class RealPair(NamedTuple):
    target: str  # model names, as load_backend takes them
    draft: str

    def load(self, backend: str):
        """Both models on `backend`, as shipped, loaded afresh: (target, draft)."""
        from specsample.backends import load_backend

        return load_backend(self.target, backend), load_backend(self.draft, backend)

    def shared(self, role: str, engine: str = "llamacpp", **options):
        """The `role` model ("target" or "draft") on `engine` with load_backend's
        `options`, loaded once for the whole session and shared by every test that
        asks for the same: a generation starts from its prompt whatever an earlier
        one left in the cache (cache_prompt is off by default; the newest claim on a
        cache wins), so tests that only score and generate need no copy of their own.
        A test that changes a backend's setup, or hands it to a server, loads its own."""
        key = (role, engine, tuple(sorted(options.items())))
        if key not in _SHARED:
            from specsample.backends import load_backend

            _SHARED[key] = load_backend(getattr(self, role), engine, **options)
        return _SHARED[key]


@pytest.fixture(scope="session")
def real_pair() -> RealPair:
    if not all((cache_dir() / "models" / m.filename).exists() for m in DEFAULT_MODELS.values()):
        pytest.skip("default model pair not fetched: run `specsample fetch` (make test does)")
    return RealPair(DEFAULT_TARGET, DEFAULT_DRAFT)


def placement_problem(item) -> str | None:
    """What is wrong with where `item` says it runs; None for a well-marked test."""
    places = sorted({m.name for m in item.iter_markers() if m.name in PLACES})
    if len(places) != 1:
        return f"needs exactly one of the markers {', '.join(PLACES)} (has {' and '.join(places) or 'none'})"
    uses_pair = "real_pair" in item.fixturenames  # the fixtures it asks for, directly or through others
    if uses_pair and places[0] != "real":
        return f"marked {places[0]}, but it loads the real pair"
    if places[0] == "real" and not uses_pair:
        return "marked real, but it does not ask for the real_pair fixture (which skips it without the pair)"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Fails the collection of a test file (or class) any of whose tests does not say
    where it runs: before -m deselects, so every run checks every test (and
    pytest-xdist's workers report it as the collection error it is)."""
    report = (yield).get_result()
    if not isinstance(collector, (pytest.Module, pytest.Class)) or not report.passed:
        return
    problems = {}  # problem -> the tests that have it
    for item in report.result:
        problem = placement_problem(item) if isinstance(item, pytest.Function) else None
        if problem:
            problems.setdefault(problem, []).append(item.name)
    if problems:
        report.outcome, report.result = "failed", []
        report.longrepr = "tests that do not say where they run:\n" + "\n".join(
            f"  {problem}: {', '.join(names[:3])}" + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            for problem, names in problems.items())


@pytest.fixture(autouse=True)
def _fit_checks(request):
    """Each test's goodness-of-fit checks (toy.assert_fits), for the run's summary."""
    from toy import FITS

    before = dict(FITS)
    yield
    spent = {key: FITS[key] - before[key] for key in FITS}
    if any(spent.values()):
        request.node.user_properties.append(("fits", spent))


_fits = {"checks": 0, "alpha": 0.0, "unaccounted": 0}


def pytest_runtest_logreport(report):
    # Fixtures' teardowns end in the teardown report; pytest-xdist hands the workers'
    # reports, properties and all, to the controller, which sums them here.
    if report.when == "teardown":
        for name, spent in report.user_properties:
            if name == "fits":
                for key in _fits:
                    _fits[key] += spent[key]


def pytest_terminal_summary(terminalreporter):
    """The bound on this run's false-alarm rate from its statistical tests (toy.py)."""
    if _fits["checks"]:
        terminalreporter.write_line(
            f"{_fits['checks']} statistical checks, each at its stated false-alarm rate: a correct sampler "
            f"fails this run with probability at most {_fits['alpha']:.1e} (budget 1e-4; docs/testing.md)")
    if _fits["unaccounted"]:
        terminalreporter.write_line(
            f"and {_fits['unaccounted']} p-values computed by tests that set their own level (toy.chi_square_p_value: "
            f"not in the bound above; docs/testing.md lists them)")
