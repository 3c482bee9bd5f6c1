"""What memory the process may take (guild.engine.memory): the system's available memory, lowered by every
cgroup limit above the process, and the budget `auto` spends of it."""

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
