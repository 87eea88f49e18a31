"""HumanEval pass@1 of generated samples: exact speculative sampling must not move it.

Model-written code never runs in this process: each candidate is written to a
temporary directory and run by a fresh interpreter (`python -I`: no user site
packages, no PYTHON* variables) in that directory, with CPU-time, memory and
file-size limits and a wall-clock timeout that kills its whole process group.

That is not a sandbox. The candidate runs as the user running the bench: it can
read and write every file the user can, reach the network and start processes
(within the limits). It guards against mistakes (an endless loop, a huge
allocation), not against hostile code: run the parity check on models you trust,
or inside a container or VM.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace

from specsample.bench.load import rotation
from specsample.bench.records import Record
from specsample.bench.runner import run_one
from specsample.bench.tables import cell, markdown_table

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(answer: str, entry_point: str) -> str:
    """The code in a model's answer: the fenced block that defines the entry point,
    else the first fenced block, else the whole answer. An unclosed fence (the answer
    was cut off) still counts as a block."""
    blocks = _FENCE.findall(answer)
    if not blocks:
        return answer
    for block in blocks:
        if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", block, re.MULTILINE):
            return block
    return blocks[0]


def build_program(problem: dict, answer: str) -> str:
    """The candidate solution followed by HumanEval's tests.

    A full definition is appended after the prompt (which supplies the imports and
    helper functions; its body-less definition is then replaced). Anything else
    is taken as the body that continues the prompt."""
    code = extract_code(answer, problem["entry_point"])
    if re.search(rf"^def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        solution = problem["prompt"] + "\n    pass\n\n" + code
    else:
        solution = problem["prompt"] + _body(code)
    return f"{solution}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def _body(code: str) -> str:
    """A continuation up to its first unindented line: a completion model goes on
    to write callers, tests or the next function after the body."""
    lines = code.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if i and line.strip() and not line[0].isspace():
            return "".join(lines[:i])
    return code


@dataclass
class Execution:
    passed: bool
    outcome: str  # "passed", "failed: <last stderr line>", "timed out"


def run_program(source: str, timeout: float = 10.0, memory_bytes: int = 1 << 30) -> Execution:
    """Run model-written source in a separate, resource-limited interpreter, with the
    user's own rights (not a sandbox: see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="specsample-exec-") as tmp:
        path = os.path.join(tmp, "candidate.py")
        with open(path, "w") as f:
            f.write(source)
        proc = subprocess.Popen(
            [sys.executable, "-I", path], cwd=tmp, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "HOME": tmp, "PYTHONHASHSEED": "0"},
            preexec_fn=_limits(timeout, memory_bytes), start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the candidate and any children
            proc.communicate()
            return Execution(False, "timed out")
    if proc.returncode == 0:
        return Execution(True, "passed")
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return Execution(False, f"failed: {lines[-1][:200] if lines else f'exit status {proc.returncode}'}")


def _limits(timeout: float, memory_bytes: int):
    def apply() -> None:
        import resource

        cpu = int(timeout) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


@dataclass
class PassRate:
    mode: str
    passed: int
    total: int

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.passed, self.total)


def pass_rates(records: list[Record]) -> list[PassRate]:
    """pass@1 per mode over parity records that carry an execution outcome."""
    rates: dict[str, PassRate] = {}
    for r in records:
        if r.passed is None:
            continue
        rate = rates.setdefault(r.mode, PassRate(r.mode, 0, 0))
        rate.total += 1
        rate.passed += r.passed
    return list(rates.values())


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sensible at 0/n and n/n)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def two_proportion_z_test(successes_a: int, n_a: int, successes_b: int, n_b: int) -> tuple[float, float]:
    """(z, two-sided p-value) of the pooled two-proportion z-test of a == b.

    40/100 vs 50/100: pooled 0.45, standard error 0.0704, z = -1.42, p = 0.16."""
    if not n_a or not n_b:
        return 0.0, 1.0
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 0.0, 1.0  # both all-pass or all-fail: no evidence of a difference
    z = (successes_a / n_a - successes_b / n_b) / se
    return z, math.erfc(abs(z) / math.sqrt(2))


def parity_table(rates: list[PassRate], baseline: str = "ar") -> str:
    rows = [["mode", "passed", "pass@1", "95% CI (Wilson)", "z vs ar", "p-value"]]
    base = next((r for r in rates if r.mode == baseline), None)
    for r in rates:
        lo, hi = r.interval
        z, pvalue = (None, None) if base is None or r is base else two_proportion_z_test(r.passed, r.total, base.passed, base.total)
        rows.append([r.mode, f"{r.passed}/{r.total}", f"{r.rate:.2f}", f"[{lo:.2f}, {hi:.2f}]", cell(z, ".2f"), cell(pvalue, ".2f")])
    return markdown_table(rows)


PARITY_NOTE = (
    "HumanEval completions (the standard protocol: raw prompt, stop sequences) sampled at the parity setting. Exact "
    "speculative sampling leaves the output distribution unchanged, so pass@1 should agree within the intervals; the "
    "z-test compares each mode with `ar` (pooled two-proportion test, two-sided)."
)


def run_parity(modes, prompts, config, setting: str = "sample", timeout: float = 10.0) -> list[Record]:
    """Sample HumanEval completions with every given mode and execute them (in a
    resource-limited subprocess with the user's rights: above), at `setting`, interleaved
    as the bench's runs are."""
    records = []
    for i, prepared in enumerate(prompts):
        for mode in rotation(modes, i):
            record = run_one(mode, prepared, setting, i, config.new_tokens(prepared.task.name),
                             config.seed + i, phase="parity")
            program = build_program(prepared.prompt.problem, record.text)
            execution = run_program(program, timeout=timeout)
            records.append(replace(record, passed=execution.passed, outcome=execution.outcome))
    return records
