"""The drafters case: every operation of each drafter measured (ms, and the draft rate of propose), tiny sizes;
bad sizes are one-line flag errors."""

import argparse

import pytest

from guild.bench.cases import drafters as D
from guild.bench.harness import measure
from guild.errors import BadFlagError


def test_every_operation_is_timed():
    a = argparse.Namespace(drafters="lookup,retrieval", tokens=2048, corpus=4096, steps=200)
    D.check(a)
    recs = measure("drafters", D.points(a), D.runners(a), 1, {})
    assert [(r.point["drafter"], r.point["op"]) for r in recs] == [(d, op) for d in D.OPS for op in D.OPS[d]]
    assert all(r.median("latency_ms") > 0 for r in recs)
    assert all(0 <= r.median("draft_rate") <= 1 for r in recs if r.point["op"] == "propose")
    assert D.text_like(300, 0) == D.text_like(300, 0) and len(D.text_like(300, 0)) == 300  # seeded, cached


@pytest.mark.parametrize("kw, needle", [({"drafters": "nope"}, "--drafters"), ({"tokens": 100}, "--tokens"),
                                        ({"steps": 0}, "--steps")])
def test_bad_flags(kw, needle):
    a = argparse.Namespace(**{"drafters": "lookup", "tokens": 2048, "corpus": 4096, "steps": 200, **kw})
    with pytest.raises(BadFlagError, match=needle):
        D.check(a)
