"""What memory the process may take (guild.engine.memory): the system's available memory, lowered by every
cgroup limit above the process, the budget `auto` spends of it, and freed scratch kept for reuse."""

import platform
import subprocess
import sys

import pytest

from guild.engine import memory


def test_a_cgroup_limit_lowers_the_available_memory(monkeypatch):
    monkeypatch.setattr(memory, "_meminfo", lambda key: 16 << 30)
    monkeypatch.setattr(memory, "_cgroup_limits", lambda: iter([(8 << 30, 2 << 30), (12 << 30, 1 << 30)]))
    assert memory.available_memory() == 6 << 30
    monkeypatch.setattr(memory, "_cgroup_limits", lambda: iter([(1 << 30, 3 << 30)]))  # over its limit: nothing
    assert memory.available_memory() == 0


def test_the_auto_budget_leaves_the_headroom(monkeypatch):
    assert 0 <= memory.budget() < memory.available_memory()  # this machine's
    monkeypatch.setattr(memory, "available_memory", lambda: 8 << 30)
    assert memory.budget() == int((8 << 30) * (1 - memory.AUTO_HEADROOM))


_FAULTS = """
import resource, sys
import numpy as np
from guild.engine.memory import keep_freed_blocks
took = keep_freed_blocks() if sys.argv[1] == "keep" else None
a = np.ones(48 << 20, np.uint8)  # a prefill chunk's scratch array: freed, then the next chunk's
del a
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(48 << 20, np.uint8)
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_freed_scratch_array_is_reused_without_page_faults():
    """After keep_freed_blocks a 48 MiB array freed and allocated again comes back from the heap, touched without
    page faults; without it glibc maps fresh pages that fault in as they are written."""
    def faults(mode):
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        took, n = out.stdout.split()
        return took, int(n)

    took, kept = faults("keep")
    assert took == "True" and kept < 16, kept
    assert faults("default")[1] >= 16  # 12,288 pages, or 24 huge ones
