"""What machine this is, as a key for measurements that only hold on it."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def fingerprint() -> str:
    """Architecture, CPU model and core count: call costs measured on one machine
    say nothing about another."""
    return f"{platform.machine()}-{cpu_name()}-{os.cpu_count()}"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
