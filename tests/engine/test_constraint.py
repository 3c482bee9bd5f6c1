"""Constrained decoding and log-probabilities under speculation (docs/contracts.md "Sampling"): with a grammar's
mask every drafter emits exactly the tokens constrained plain decoding emits, greedy and seeded; drafts the grammar
refuses are cut before the window; each emitted token's log-probabilities are bitwise the plain step's."""

import json

import numpy as np
import pytest

jsonschema = pytest.importorskip("jsonschema")

from guild.engine.sampling import SamplingParams, logprobs, target  # noqa: E402
from guild.engine.session import Generation, GuildSession  # noqa: E402
from guild.text.grammar import GrammarError, compile_grammar, constraint  # noqa: E402
from guild.text.tokenizer import Tokenizer  # noqa: E402
from tests.helpers.drafters import AdversarialDrafter, OracleDrafter, RandomDrafter  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT = [1, 9690, 198, 2683, 253, 1345, 3084, 563, 4159, 30, 2, 198, 1, 520, 9531, 198]  # ChatML-ish ids
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=4321, repeat_penalty=1.1)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "colour": {"enum": ["red", "green", "blue"]}}, "required": ["name", "age", "colour"],
    "additionalProperties": False}
N = 48


@pytest.fixture(scope="module")
def tok(moe_path):
    return Tokenizer.from_gguf(moe_path)


def _gen(model, tok, sampling, drafter=None, k=4, grammar=None, n_logprobs=None, n=N):
    s = GuildSession(model, n_ctx=256, eos_ids=sorted(tok.eos_ids))
    g = Generation(s, PROMPT, n, sampling=sampling, drafter=drafter, max_draft=k,
                   constraint=None if grammar is None else constraint(grammar, tok), logprobs=n_logprobs)
    while not g.done:
        w = g.window()
        g.finish(model.forward_batch([(w, s.state)])[0], 0.0)
    out, st = g.result()
    return out, st, g.logprobs


class GrammarBreaker(OracleDrafter):
    """Right at the first draft, then a control token no grammar's text can hold."""

    name = "breaker"

    def propose(self, history, k):
        good = super().propose(history, k)
        return np.array([*good[:1], *[1] * (k - 1)], np.int32)[:k]


@pytest.fixture(scope="module", params=["greedy", "sampled"])
def case(request, moe_model, tok):
    sampling = SamplingParams() if request.param == "greedy" else SAMPLED
    g = compile_grammar("json_schema", SCHEMA, tok, "schema")
    truth, st, lps = _gen(moe_model, tok, sampling, grammar=g, n_logprobs=5)
    return moe_model, tok, sampling, g, truth, lps


def test_constrained_output_follows_the_schema(case):
    model, tok, sampling, g, truth, _ = case
    assert truth[-1] in tok.eos_ids, "the object must close within the budget"
    jsonschema.validate(json.loads(tok.decode(truth[:-1])), SCHEMA)
    free, _, _ = _gen(model, tok, sampling, n=len(truth))
    assert free != truth  # the mask changed what the model says


@pytest.mark.parametrize("k", [2, 7])
def test_every_drafter_emits_constrained_normal(case, k):
    model, tok, sampling, g, truth, lps = case
    for d in (OracleDrafter(len(PROMPT), truth), RandomDrafter(len(PROMPT), truth, seed=k),
              AdversarialDrafter(len(PROMPT), truth)):
        got, st, got_lps = _gen(model, tok, sampling, d, k, g, n_logprobs=5)
        assert got == truth, d.name
        assert got_lps == lps, d.name  # bitwise: the same rows, the same masks
    _, st, _ = _gen(model, tok, sampling, OracleDrafter(len(PROMPT), truth), k, g)
    s = st.summary()
    # the oracle's drafts pass the grammar and verify (a drafted EOS that ends it counts as emitted, not accepted)
    assert s["drafted"] > 0 and s["accepted"] >= s["drafted"] - 1


def test_drafts_that_break_the_grammar_are_cut(case):
    model, tok, sampling, g, truth, _ = case
    got, st, _ = _gen(model, tok, sampling, GrammarBreaker(len(PROMPT), truth), 4, g)
    assert got == truth
    assert all(w.k <= 1 for w in st.windows) and st.summary()["accepted"] > 0


def test_logprobs_are_the_plain_rows(moe_model, tok):
    """Each token's log-probability is log-softmax of the row plain decoding drew it from; greedy's best is it."""
    out, _, lps = _gen(moe_model, tok, SamplingParams(), n=8, n_logprobs=3)
    s = GuildSession(moe_model, n_ctx=256)
    row = s.prefill(PROMPT)
    y, z = target(row, s.tokens, len(s.tokens), SamplingParams())
    want = logprobs(z, y, 3)
    assert lps[0] == want and y == out[0] and want.top[0][0] == y
    assert len(lps) == len(out) and all(x.logprob <= 0 and len(x.top) == 3 for x in lps)
    assert all(x.top[0][1] >= x.top[1][1] >= x.top[2][1] for x in lps)
    x = np.asarray(z, np.float64)
    assert np.isclose(want.logprob, x[y] - np.log(np.exp(x - x.max()).sum()) - x.max())


def test_bad_grammars_name_where(tok):
    with pytest.raises(GrammarError, match="response_format.json_schema: Invalid type"):
        compile_grammar("json_schema", {"type": "foo"}, tok, "response_format.json_schema")
    with pytest.raises(GrammarError, match="--grammar g.lark"):
        compile_grammar("lark", "start: ((", tok, "--grammar g.lark")


def test_json_whitespace_is_bounded_as_llama_cpp_bounds_it(tok):
    """Pretty-printed JSON passes; a run of blank lines (a sampled model can loop on them until max_tokens) does
    not: one or two newlines and an indent of at most 20 between tokens."""
    g = compile_grammar("json_schema", SCHEMA, tok, "schema")

    def accepts(text):
        m = constraint(g, tok)
        return all(m.matcher.consume_token(i) for i in tok.encode(text, add_special=False)) and not m.matcher.is_error()

    assert accepts('{"name": "Ada", "age": 36, "colour": "red"}')
    assert accepts('{\n  "name": "Ada",\n\n  "age": 36,\n  "colour": "red"\n}')
    assert not accepts('{\n  "name": "Ada",\n\n\n  "age": 36')
    assert not accepts('{\n' + ' ' * 21 + '"name"')


# a schema whose keys the grammar forces after their opening quote, with repeated structure a copier predicts
FORCED = {"type": "object", "properties": {
    "customer_name": {"type": "string", "maxLength": 16},
    "items": {"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "object", "properties": {
        "product_name": {"type": "string", "maxLength": 12}, "unit_price": {"type": "integer", "minimum": 1,
                                                                              "maximum": 99}},
        "required": ["product_name", "unit_price"], "additionalProperties": False}}},
    "required": ["customer_name", "items"], "additionalProperties": False}


def test_forced_tokens_are_the_single_token_masks_and_keep_the_masks_exact(tok):
    """`forced` lists exactly the tokens whose state's mask allows nothing else (never an end-of-generation
    token), leaves the matcher where it was, and the masks it keeps are bitwise those of a fresh matcher."""
    g = compile_grammar("json_schema", FORCED, tok, "schema")
    c, fresh = constraint(g, tok), constraint(g, tok)
    ids = tok.encode('{\n  "customer_name": "Ada",\n  "items": [\n    {"product_name": "Tea", "unit_price": 3}',
                     add_special=False)
    runs = 0
    for t in ids:
        f = c.forced((), 4)
        runs += bool(f)
        after = c.forced((t,), 4)
        assert (c.allowed(tok.vocab_size) == fresh.allowed(tok.vocab_size)).all()
        if f:
            assert f[0] == t and np.flatnonzero(fresh.allowed(tok.vocab_size)).tolist() == [t]
            assert after[: len(f) - 1] == f[1:]
        else:
            assert fresh.allowed(tok.vocab_size).sum() > 1
        c.advance(t)
        fresh.advance(t)
    assert runs >= 4  # customer_name, items, product_name, unit_price
    done = constraint(g, tok)
    for t in tok.encode('{"customer_name": "A", "items": [{"product_name": "B", "unit_price": 1}, '
                        '{"product_name": "C", "unit_price": 2}, {"product_name": "D", "unit_price": 3}]}',
                        add_special=False):
        done.advance(t)
    assert done.accepting and done.forced((), 4) == ()  # only an end-of-generation token is left


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "seeded"])
def test_adaptive_drafts_forced_tokens_and_emits_constrained_normal(moe_model, tok, sampling, fixed_clock):
    """The adaptive drafter under a grammar with forced keys: drafts proposed, accepted and rejected, grammar-forced
    drafts among them (counted per window), and the tokens constrained normal emits, greedy and seeded."""
    from guild.speculative.build import make_drafter

    g = compile_grammar("json_schema", FORCED, tok, "schema")
    truth, _, _ = _gen(moe_model, tok, sampling, grammar=g, n=96)
    d = make_drafter("adaptive", n_ctx=256)
    d.clock = fixed_clock  # the scheduler's choices rest on acceptance alone: the drafted counts hold under any load
    got, st, _ = _gen(moe_model, tok, sampling, d, 4, g, n=96)
    assert got == truth
    s = st.summary()
    assert s["drafted"] > s["accepted"] > 0 and s["forced"] > 0, s
    assert all(w.forced <= w.k for w in st.windows)
    assert any(w.forced and w.forced < w.k for w in st.windows)  # forced runs carried with the drafter's tokens
