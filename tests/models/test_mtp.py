"""The MTP head (guild/models/mtp.py) and MtpDrafter (guild/speculative/mtp.py): logits against the float64
twin, catch-up/rollback against a fresh recompute, loading rules, and token parity of mtp/adaptive with plain
decoding on tiny random models (tests/models/test_embedded.py runs the trained head of the embedded model)."""

from __future__ import annotations

import numpy as np
import pytest

from guild.engine.sampling import SamplingParams
from guild.engine.session import GuildSession
from guild.kernels.cpu.ops import get_keys
from guild.models import load_model
from guild.models.mtp import MtpError, find_mtp_head, load_mtp_head
from guild.speculative.build import make_drafter
from guild.speculative.mtp import MtpDrafter
from guild.speculative.options import MtpOptions
from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.helpers.reference import reference_fused_hidden, reference_hidden, reference_mtp

KINDS = {"llama": dict(), "llama-moe": dict(n_experts=4, top_k=2), "qwen3": dict(arch="qwen3"),
         "q8": dict(qtype="Q8_0"), "fused": dict(n_experts=4, top_k=2, n_layers=3)}
FUSE = {"fused": (0, 1)}  # heads that fuse these trunk layers' rows with the final hidden (EAGLE-3)
SEQ = [7, 100, 31, 45, 200, 9, 9, 63, 150, 88, 12, 250, 40, 41, 42, 43]


@pytest.fixture(scope="module", params=list(KINDS))
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    base = write_tiny_model(d / "m.gguf", **KINDS[request.param])
    head = write_tiny_mtp_head(base, d / "m.mtp.gguf", qtype="Q8_0" if request.param == "q8" else "F32",
                               fuse=FUSE.get(request.param, ()))
    return base, head


def test_head_logits_match_twin(pair):
    base, head_path = pair
    m = load_model(base)
    head = find_mtp_head(m)
    assert head.info.kind == "sidecar" and head.info.source == str(head_path)
    fused = bool(head.feature_layers)
    twin = reference_fused_hidden if fused else (lambda b, _, t: reference_hidden(b, t))
    hidden = twin(str(base), str(head_path), SEQ[:-1]).astype(np.float32)  # h_p, rows 0..T-1
    toks = SEQ[1:]  # x_{p+1}
    want = reference_mtp(str(base), str(head_path), toks, hidden)
    cache = head.new_cache(64)
    _, got = head.forward(toks, hidden, cache, n_logits=len(toks))
    assert np.abs(got - want).max() <= 1e-3 * max(1.0, np.abs(want).max())
    # the base's own rows give the twin's hidden (ForwardResult.hidden: before the output norm; .features: the
    # fused layers' output rows, kept only while a fusing head is loaded)
    out = m.forward_batch([(SEQ[:-1], m.new_state(64))])[0]
    assert len(out.features) == len(head.feature_layers) == (2 if fused else 0)
    assert np.abs(head.base_hidden(out.hidden, out.features) - hidden).max() <= 1e-3 * np.abs(hidden).max()


def _drive(m, head, keeps, k=3):
    """A session-like run: prefill, then windows committing `keeps` rows each, the drafter proposing before
    every window; returns (drafter, all committed tokens)."""
    d = MtpDrafter(head, 128, max_k=k)
    st = m.new_state(128)
    toks = list(SEQ[:6])
    out = m.forward_batch([(toks, st)])[0]
    st.commit(len(toks))
    d.observe_hidden(0, out.hidden, out.features)
    toks.append(int(SEQ[6]))
    rng = np.random.default_rng(0)
    for keep in keeps:
        d.propose(toks, k)
        window = [toks[-1], *rng.integers(3, 300, size=4).tolist()]
        pos0 = st.pos
        out = m.forward_batch([(window, st)])[0]
        st.commit(keep)
        d.observe_hidden(pos0, out.hidden[:keep], tuple(f[:keep] for f in out.features))
        toks += window[1:keep] + [int(rng.integers(3, 300))]
    return d, toks


def test_catch_up_and_rollback_equal_a_fresh_recompute(pair):
    base, _ = pair
    m = load_model(base)
    head = find_mtp_head(m)
    d, toks = _drive(m, head, [1, 3, 5, 2, 1, 4])
    drafts = d.propose(toks, 3).tolist()  # catches up the last window, drafts 3, rolls the chain back
    P = d.cache.pos
    assert P == len(toks) - 1  # every committed position, nothing of the speculative chain
    # fresh: the base over all committed tokens at once, the head over all rows at once (row invariance)
    full = m.forward_batch([(toks[:-1], m.new_state(128))])[0]
    fresh = head.new_cache(128)
    head.forward(toks[1:], head.base_hidden(full.hidden, full.features), fresh, 0)
    fresh.commit(P)
    assert np.array_equal(get_keys(d.cache.k, 0, P), get_keys(fresh.k, 0, P))
    assert np.array_equal(d.cache.v[:, :, :P], fresh.v[:, :, :P])
    assert not get_keys(d.cache.k, P, d.cache.v.shape[2]).any() and not d.cache.v[:, :, P:].any()
    # the drafts equal those of a drafter that saw every row in one go
    d2 = MtpDrafter(head, 128, max_k=3)
    d2.observe_hidden(0, full.hidden, full.features)
    p1 = d.last_prob
    assert d2.propose(toks, 3).tolist() == drafts and len(drafts) == 3
    assert d2.last_prob == p1
    assert d.propose(toks, 3).size == 0  # nothing committed since: nothing to draft from


def test_rewind_truncates_the_head(pair):
    base, _ = pair
    m = load_model(base)
    head = find_mtp_head(m)
    d, toks = _drive(m, head, [2, 2])
    d.propose(toks, 1)
    out = m.forward_batch([(toks[:4], m.new_state(128))])[0]
    d.observe_hidden(3, out.hidden[3:4], tuple(f[3:4] for f in out.features))  # the session rewound to 3, fed one
    d.propose(toks[:5], 1)
    assert d.cache.pos == 4
    with pytest.raises(RuntimeError, match="missed"):
        d.observe_hidden(9, out.hidden[:1])


@pytest.mark.parametrize("strategy", ["mtp", "adaptive"])
@pytest.mark.parametrize("sampled", [False, True])
def test_parity_with_plain_decoding(pair, strategy, sampled):
    base, _ = pair
    m = load_model(base)
    head = find_mtp_head(m)
    samp = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=7) if sampled else None
    kw = dict(sampling=samp) if samp else {}
    prompt = SEQ * 2
    ref, _ = GuildSession(m, n_ctx=256).generate(prompt, 48, **kw)
    for k in (1, 3):
        d = make_drafter(strategy, mtp_head=head, n_ctx=256, mtp=MtpOptions(k=k))
        s = GuildSession(m, n_ctx=256)
        out, st = s.generate(prompt, 48, drafter=d, max_draft=4, **kw)
        assert out == ref
        if strategy == "mtp":
            assert sum(w.k for w in st.windows) >= len(st.windows) - 1  # it drafted every window
        # a second turn on the same session and drafter continues in step
        ref2, _ = GuildSession(m, n_ctx=256).generate(prompt + ref + SEQ[:5], 24, **kw)
        out2, _ = s.generate(SEQ[:5], 24, drafter=d, max_draft=4, **kw)
        assert out2 == ref2


def test_min_p_falls_back_per_window(pair):
    base, _ = pair
    m = load_model(base)
    head = find_mtp_head(m)
    d = make_drafter("mtp", mtp_head=head, n_ctx=256, mtp=MtpOptions(k=2, min_p=0.999))
    ref, _ = GuildSession(m, n_ctx=256).generate(SEQ, 20)
    out, st = GuildSession(m, n_ctx=256).generate(SEQ, 20, drafter=d, max_draft=4)
    assert out == ref
    assert all(w.k == 0 for w in st.windows)  # a random head is never that sure
    assert 0 < d.last_prob < 0.999


def test_draft_vocabulary_head(tmp_path):
    base = write_tiny_model(tmp_path / "m.gguf")
    hp = write_tiny_mtp_head(base, tmp_path / "h.gguf", draft_vocab=64)
    m = load_model(base)
    full = find_mtp_head(m, hp)
    small = find_mtp_head(m, hp, draft_vocab=64)
    assert small.info.draft_vocab == 64 and full.info.draft_vocab == m.args.vocab_size
    hidden = reference_hidden(str(base), SEQ[:-1]).astype(np.float32)
    _, lf = full.forward(SEQ[1:], hidden, full.new_cache(64), len(SEQ) - 1)
    _, ls = small.forward(SEQ[1:], hidden, small.new_cache(64), len(SEQ) - 1)
    assert np.array_equal(lf[:, small.vocab_ids], ls)  # the same rows of the same LM head
    assert small.token(int(np.argmax(ls[0]))) == int(small.vocab_ids[np.argmax(ls[0])])


def test_nextn_block_of_a_hybrid_model(tmp_path):
    base = write_tiny_hybrid(tmp_path / "h.gguf", nextn=True)
    m = load_model(base)
    assert m.layer_pattern.endswith("M")
    head = find_mtp_head(m)
    assert head.info.kind == "nextn" and head.info.ffn == "moe"
    d, toks = _drive(m, head, [1, 3, 2], k=2)
    d.propose(toks, 2)
    full = m.forward_batch([(toks[:-1], m.new_state(128))])[0]
    fresh = head.new_cache(128)
    head.forward(toks[1:], head.base_hidden(full.hidden, full.features), fresh, 0)
    P = d.cache.pos
    assert np.array_equal(get_keys(d.cache.k, 0, P), get_keys(fresh.k, 0, P))
    ref, _ = GuildSession(m, n_ctx=128).generate(SEQ, 24)
    out, _ = GuildSession(m, n_ctx=128).generate(SEQ, 24, drafter=make_drafter("mtp", mtp_head=head, n_ctx=128,
                                                                                 mtp=MtpOptions(k=2)), max_draft=4)
    assert out == ref


def test_missing_and_foreign_heads(tmp_path):
    a = write_tiny_model(tmp_path / "a.gguf")
    b = write_tiny_model(tmp_path / "b.gguf", seed=3)
    ma = load_model(a)
    assert find_mtp_head(ma) is None
    with pytest.raises(MtpError, match="has no MTP head.*guild train-mtp"):
        load_mtp_head(ma)
    hb = write_tiny_mtp_head(b, tmp_path / "b.mtp.gguf")
    with pytest.raises(MtpError, match="trained for another model \\(b.gguf"):
        find_mtp_head(ma, hb)
    with pytest.raises(MtpError, match="no such file"):
        find_mtp_head(ma, tmp_path / "nope.gguf")
    with pytest.raises(MtpError, match="not an MTP head"):
        find_mtp_head(ma, b)


@pytest.mark.parametrize("fuse,why", [((2,), "increasing layer numbers in 0..1"), ((1, 0), "increasing"),
                                      ((0, 0), "increasing")])
def test_fused_head_with_bad_feature_layers_is_refused(tmp_path, fuse, why):
    """A head whose guild.mtp.feature_layers name the last layer, a layer past it, or repeat: one clean error."""
    from guild.models.validate import ModelValidationError

    base = write_tiny_model(tmp_path / "m.gguf", n_layers=3)
    bad = write_tiny_mtp_head(base, tmp_path / "bad.mtp.gguf", fuse=fuse)
    with pytest.raises(ModelValidationError, match=why):
        find_mtp_head(load_model(base), bad)


def test_fused_head_without_its_fc_is_refused(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    from guild.formats.gguf import GGUFFile
    from guild.models.validate import ModelValidationError

    base = write_tiny_model(tmp_path / "m.gguf", n_layers=3)
    good = GGUFFile(write_tiny_mtp_head(base, tmp_path / "good.mtp.gguf", fuse=(0,)))
    w = GGUFWriter(tmp_path / "bad.mtp.gguf", "guild-mtp")
    for k, v in good.metadata.items():
        if k.startswith("guild."):
            (w.add_array if isinstance(v, list) else w.add_string)(k, v)
    for n, t in good.tensors.items():
        if n != "blk.0.nextn.fc.weight":
            w.add_tensor(n, np.asarray(t.data).reshape(t.shape) if t.qtype.name == "F32" else np.asarray(t.data),
                         raw_dtype=None if t.qtype.name == "F32" else t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelValidationError, match="fuses layers \\[0\\] but has no 'blk.0.nextn.fc.weight'"):
        find_mtp_head(load_model(base), tmp_path / "bad.mtp.gguf")
