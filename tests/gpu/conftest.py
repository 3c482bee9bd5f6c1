"""Fixtures of the GPU-path tests."""

import itertools
import types

import pytest


@pytest.fixture
def fixed_clock(monkeypatch):
    """A clock that advances 1 ms a read, for the session's timings and (passed to it) the adaptive drafter's: the
    scheduler's choices then rest on acceptance alone, so adaptive cells are the same on every machine and load."""
    import guild.engine.session as session

    tick = itertools.count()

    def clock():
        return next(tick) * 1e-3

    monkeypatch.setattr(session, "time", types.SimpleNamespace(perf_counter=clock))
    return clock
