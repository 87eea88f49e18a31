"""The planner's numbers live in one configuration (policy/config.py): the planner and
its estimates read them from the config they are given, the derived ones follow from
the others, and nothing else in policy/ keeps a number of its own."""

import ast
import dataclasses
import math
import re
from pathlib import Path

import pytest

from specsample.decoding.plans import MODEL, Offer, lookup_source, suffix_source
from specsample.policy.config import (ACCEPTANCE_DECAY, GOODPUT_DECAY, IDLE_DECAY, PLANNER, CalibrationConfig,
                                      PlannerConfig, catch_up_chunks)
from specsample.policy.control import Planner
from specsample.policy.curve import Curve
from specsample.policy.estimates import Acceptance, Goodput, Prices
from specsample.policy.make import make_policy

from test_planner import flat, prices, solo

pytestmark = pytest.mark.pure


def test_a_number_changed_in_the_config_changes_the_decision_it_sets():
    # stall: a draft 4000 tokens behind is withheld by default, offered when it may stall the round for long.
    _, withheld = solo(Planner(6, prices(flat)), lag=4000, tokens=2000)
    patient = dataclasses.replace(PLANNER, stall=1e6)
    _, offered = solo(Planner(6, prices(flat), config=patient), lag=4000, tokens=2000)
    assert withheld.source is None and offered.source == MODEL
    # evidence: a guard that needs fewer rounds bars a losing kind sooner.
    quick, slow = Goodput(dataclasses.replace(PLANNER, evidence=2.0)), Goodput()
    for guard in (quick, slow):
        for _ in range(3):
            guard.add(1, None, 1, 1.0)
            guard.add(1, "model", 1, 2.0)
    assert quick.barred(1, "model") and not slow.barred(1, "model")
    # priors, and k_max from the config when none is given.
    optimistic = dataclasses.replace(PLANNER, lookup_priors=((0.9, 0.9),), k_max=3)
    assert Acceptance(optimistic)[lookup_source(2)].at(0).prior == 0.9
    assert Acceptance()[lookup_source(2)].at(0).prior == 0.4
    # A suffix match's prior is a lookup's: its shortest class a 2-token one's, the longer a 3-token one's.
    assert [Acceptance()[suffix_source(n)].at(0).prior for n in (4, 8, 16, 32)] == [0.4, 0.6, 0.6, 0.6]
    assert Acceptance(optimistic)[suffix_source(4)].at(0).prior == 0.9
    assert Planner(config=optimistic).k_max == 3 and Planner(5, config=optimistic).k_max == 5


def test_make_policy_hands_its_config_to_the_planner_and_the_prices():
    config = dataclasses.replace(PLANNER, recent=4, k_max=5)
    seat = make_policy("auto", 5, config=config)
    assert seat.planner.config is config and seat.acceptance.config is config
    assert seat.planner.prices.target.config is config and seat.planner.prices.draft.config is config
    curve = Curve({1: 1.0}, config)
    for _ in range(6):
        curve.observe(1, 2.0)
    assert len(curve._all) == 4  # its own `recent`, not the default's 8


def test_the_derived_numbers_follow_the_others():
    # Today's values, kept by the derivations.
    assert (PLANNER.unbar, PLANNER.recent_plain, PLANNER.probe, PLANNER.fresh) == (3.0, 0.5, 0.3, 16)
    assert (ACCEPTANCE_DECAY, GOODPUT_DECAY, IDLE_DECAY) == (0.9, 0.98, 0.998)
    assert catch_up_chunks() == (16, 32, 64, 128, 256, 512)
    # They move with what they are derived from.
    patient = dataclasses.replace(PLANNER, evidence=12.0, recent=5)
    assert (patient.unbar, patient.recent_plain, patient.probe, patient.fresh) == (6.0, 1.0, 0.6, 10)
    assert catch_up_chunks(CalibrationConfig(read_chunk=64)) == (64, 128, 256, 512)
    # The guard reads its thresholds from its config: a guard with twice the evidence
    # unbars at twice the decayed evidence, log 2 / -log GOODPUT_DECAY (about 34) plain
    # rounds sooner, give or take the rounds its later bar left the evidence higher.
    def rounds_barred(guard: Goodput) -> int:
        for _ in range(30):
            guard.add(1, None, 1, 1.0)
            guard.add(1, "model", 1, 2.0)
        rounds = 0
        while guard.barred(1, "model"):
            guard.add(1, None, 1, 1.0)
            rounds += 1
        return rounds

    sooner = rounds_barred(Goodput()) - rounds_barred(Goodput(patient))
    assert abs(sooner - math.log(2) / -math.log(GOODPUT_DECAY)) < 3
    with pytest.raises(ValueError, match="read_chunk"):
        CalibrationConfig(read_chunk=1024)
    with pytest.raises(ValueError, match="hidden_decay"):
        PlannerConfig(hidden_decay=1.5)
    assert Prices.empty().target.config is PLANNER


POLICY = Path(__file__).parents[1] / "src" / "specsample" / "policy"
# Structure, not tuning: the price bands' first and last sizes (curve.py says why they
# are kept as they are).
STRUCTURAL = {"curve.py:EDGES"}


def numbers_outside_the_config(root: Path = POLICY) -> list[str]:
    """Module- or class-level assignments of a number (or a tuple of numbers) in the
    planner's modules other than config.py: a tuning number kept beside the code."""
    found = []
    for path in sorted(root.glob("*.py")):
        if path.name in ("config.py", "trace.py"):  # trace.py decides nothing
            continue
        tree = ast.parse(path.read_text())
        bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef)]
        for body in bodies:
            for node in body:
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None or not _numeric(node.value):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                name = ",".join(e.id for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t]))
                if f"{path.name}:{name}" not in STRUCTURAL:
                    found.append(f"{path.name}:{name}")
    return found


def _numeric(node) -> bool:
    if isinstance(node, ast.Constant):  # a counter starting at zero is no tuning number
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool) and node.value != 0
    return isinstance(node, ast.Tuple) and bool(node.elts) and all(_numeric(e) for e in node.elts)


def test_no_planner_module_keeps_a_number_of_its_own():
    assert numbers_outside_the_config() == []


def test_the_number_finder_finds_a_constant_beside_the_code(tmp_path):
    """Negative control: the shapes the numbers had before (a module constant, a tuple
    of them, a class attribute) are each found."""
    (tmp_path / "control.py").write_text("STALL = 4.0\nJOINT = (1, 2, 4)\nNAME = 'x'\n")
    (tmp_path / "estimates.py").write_text("class Goodput:\n    EVIDENCE = 6.0\n    KINDS = (None, 'model')\n")
    assert numbers_outside_the_config(tmp_path) == ["control.py:STALL", "control.py:JOINT", "estimates.py:EVIDENCE"]


CONFIG = POLICY / "config.py"
# A source: a commit, a docs path, or a command's result ("the study's `x` row").
SOURCE = re.compile(r"\b[0-9a-f]{7,40}\b|docs/[\w./-]+|the study's `\w+` row")


def undocumented_fields(source: str, name: str) -> list[str]:
    """The fields of dataclass `name` in `source` whose comment block above them lacks a
    why (a comment line besides the source) or a "Set by:" line naming a source."""
    lines = source.splitlines()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    found = []
    for field in (n for n in cls.body if isinstance(n, ast.AnnAssign)):
        above, i = [], field.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("# "))
            i -= 1
        set_by = [line for line in above if line.startswith("Set by:")]
        why = [line for line in above if not line.startswith("Set by:")]
        if not why or not set_by or not SOURCE.search(set_by[0]):
            found.append(field.target.id)
    return found


def test_the_planner_config_keeps_at_most_twelve_numbers_each_with_why_and_source():
    assert 0 < len(dataclasses.fields(PlannerConfig)) <= 12
    assert undocumented_fields(CONFIG.read_text(), "PlannerConfig") == []


def test_the_field_checker_finds_a_number_without_why_or_source():
    """Negative control: a field with no comment, one whose comment names no source, and
    one set by nothing are each found; a documented one is not."""
    source = '''class C:
    # Why it is 1.
    # Set by: 1f407e8; the study's `a` row.
    a: int = 1
    b: int = 2
    # Why it is 3.
    c: int = 3
    # Why it is 4.
    # Set by: none (no run compared other values).
    d: int = 4
'''
    assert undocumented_fields(source, "C") == ["b", "c", "d"]
