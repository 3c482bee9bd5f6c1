"""Hybrid Gated-DeltaNet MoE models (qwen3next, qwen35moe): DeltaNet kernels against their NumPy twins, the
forward against a float64 twin (against llama.cpp: tests/oracles/test_hybrid_llama_cpp.py), per-row rollback of
the recurrent state (docs/contracts.md "Window"), row invariance, and token parity of speculative decoding with
plain decoding."""

from __future__ import annotations

import numpy as np
import pytest

from guild.engine.sampling import SamplingParams
from guild.engine.session import GuildSession
from guild.errors import GuildError, MetadataError
from guild.formats.gguf import GGUFFile
from guild.kernels import ref
from guild.kernels.cpu import deltanet as gdn
from guild.kernels.cpu import quant
from guild.kernels.cpu.ops import get_keys
from guild.models import load_model
from guild.models.qwen3next import Qwen3Next
from guild.models.qwen35moe import Qwen35Moe
from guild.speculative.lookup import SuffixDrafter
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.helpers.drafters import AdversarialDrafter, OracleDrafter, RandomDrafter
from tests.helpers.reference_hybrid import reference_hybrid_forward
from tests.helpers.tiny_hybrids import TINY, TOKENS, assert_close, tiny_hybrids, window_logits

rng = np.random.default_rng(0)

SEQ = np.array([5, 77, 12, 200, 31, 9, 150, 64, 3, 99, 18, 250, 42, 7, 120, 33], np.int64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(name) -> (path, model), written and loaded once per module."""
    return tiny_hybrids(tmp_path_factory.mktemp("hybrid"))


# =========================================================================================================
# kernels vs twins
# =========================================================================================================
def test_conv1d_silu_with_history():
    x = rng.standard_normal((5, 40)).astype(np.float32)
    hist = rng.standard_normal((3, 40)).astype(np.float32)
    wt = rng.standard_normal((4, 40)).astype(np.float32)
    out = np.empty_like(x)
    gdn.conv1d_silu(x, hist, wt, out)
    np.testing.assert_allclose(out, ref.conv1d_silu(x, hist, wt), rtol=1e-5, atol=1e-6)
    one = np.empty((1, 40), np.float32)  # row 3 alone, with the history it would see: bitwise the same
    gdn.conv1d_silu(x[3:4], np.concatenate([hist, x[:3]])[-3:], wt, one)
    assert np.array_equal(one[0], out[3])


def test_small_kernels():
    x = rng.standard_normal((3, 4, 16)).astype(np.float32)
    y = x.copy()
    gdn.l2norm_heads(y, 1e-6)
    np.testing.assert_allclose(y, ref.l2norm_heads(x, 1e-6), rtol=1e-6, atol=1e-7)
    z = rng.standard_normal((3, 4, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    out = np.empty_like(x)
    gdn.gated_rmsnorm(x, z, w, 1e-6, out)
    np.testing.assert_allclose(out, ref.gated_rmsnorm(x, z, w, 1e-6), rtol=1e-5, atol=1e-6)
    alpha = (rng.standard_normal((3, 4)) * 12).astype(np.float32)  # some above softplus's threshold of 20
    b = rng.standard_normal((3, 4)).astype(np.float32)
    dt, a = rng.standard_normal(4).astype(np.float32), -rng.uniform(0.1, 1, 4).astype(np.float32)
    g, beta = np.empty_like(alpha), np.empty_like(alpha)
    gdn.gdn_gates(alpha, b, dt, a, g, beta)
    g_ref, beta_ref = ref.gdn_gates(alpha, b, dt, a)
    np.testing.assert_allclose(g, g_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(beta, beta_ref, rtol=1e-6, atol=1e-7)
    m = rng.standard_normal((3, 8)).astype(np.float32)
    for gate in (rng.standard_normal((3, 8)), rng.standard_normal((3, 1))):
        gate = gate.astype(np.float32)
        o = np.empty_like(m)
        gdn.sigmoid_mul(m, gate, o)
        np.testing.assert_allclose(o, ref.sigmoid_mul(m, gate), rtol=1e-6, atol=1e-7)


def _gdn_inputs(T, Hk=2, Hv=4, d=16):
    q = ref.l2norm_heads(rng.standard_normal((T, Hk, d)), 1e-6)
    k = ref.l2norm_heads(rng.standard_normal((T, Hk, d)), 1e-6)
    v = rng.standard_normal((T, Hv, d)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (T, Hv)).astype(np.float32)
    S0 = (rng.standard_normal((Hv, d, d)) * 0.3).astype(np.float32)
    return q, k, v, g, beta, S0


@pytest.mark.parametrize("tiled", [False, True])
def test_gdn_recurrence_matches_twin_replay_and_snapshot(tiled, threads):
    T, Hk, Hv, d = 7, 2, 4, 16
    q, k, v, g, beta, S0 = _gdn_inputs(T, Hk, Hv, d)
    kmap = np.arange(Hv) % Hk if tiled else np.arange(Hv) // (Hv // Hk)
    scale = np.float32(d**-0.5)
    out_ref, S_ref = ref.gdn_recurrence(q, k, v, g, beta, kmap, scale, S0)
    # replay layout: every row writes buffer 1, the state before the window stays in buffer 0
    pool = np.stack([S0, np.zeros_like(S0)])
    out = np.empty((T, Hv, d), np.float32)
    gdn.gdn_recurrence(q, k, v, g, beta, kmap, scale, pool, 0, np.ones(T, np.int64), out)
    np.testing.assert_allclose(out, out_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pool[1], S_ref, rtol=1e-4, atol=1e-5)
    assert np.array_equal(pool[0], S0)
    # snapshot layout: row t writes buffer t+1; bitwise the replay's numbers, serial or 1-2 threads
    for fn, n in ((gdn._gdn_serial, 1), (gdn._gdn_parallel, 1), (gdn._gdn_parallel, 2)):
        threads(n)
        snaps = np.zeros((T + 1, Hv, d, d), np.float32)
        snaps[0] = S0
        out2 = np.empty_like(out)
        fn(q, k, v, g, beta, kmap, scale, snaps, 0, np.arange(1, T + 1), out2)
        assert np.array_equal(out2, out) and np.array_equal(snaps[T], pool[1])
        for t in range(T):  # each snapshot is the state after t+1 single steps, output or not
            p = np.stack([S0, np.zeros_like(S0)])
            gdn.gdn_recurrence(q[: t + 1], k[: t + 1], v[: t + 1], g[: t + 1], beta[: t + 1], kmap, scale, p, 0,
                               np.ones(t + 1, np.int64), np.zeros((0, 1, 1), np.float32))
            assert np.array_equal(p[1], snaps[t + 1]), f"snapshot {t}"


# =========================================================================================================
# forward: float64 twin
# =========================================================================================================
@pytest.mark.parametrize("name", [n for n in TINY if not n.endswith("-copy")])
def test_forward_matches_float64_twin(name, tiny):
    """The fp32 path against the float64 twin (the int8 path's matrices are held to their twin in test_qdot.py;
    through a recurrent stack its rounding decisions are not tracked to 1e-4 by a float64 pipeline)."""
    path, model = tiny(name, "f32")
    with quant.numerics("f32"):
        want = reference_hybrid_forward(path, TOKENS)
    for windows in ((12,), (1, 4, 7), (8, 4)):  # carried state between windows must not matter
        got = window_logits(model, TOKENS, windows)
        # fp32 kernels vs float64 on the same dequantised weights: measured max |Δ| <= 1.6e-5 (max|logit| ~ 7-8)
        assert_close(got, want, 1e-4 * np.abs(want).max(), f"{name} vs float64 twin, windows {windows}")


def test_long_windows_match_float64_twin(tiny):
    """Prefill-sized windows (> 64 rows take the BLAS matmul path; > 8 rows update S in place)."""
    path, model = tiny("qwen35moe", "f32")
    toks = np.random.default_rng(3).integers(0, 320, 100)
    with quant.numerics("f32"):
        want = reference_hybrid_forward(path, toks)
    for windows in ((100,), (70, 30), (9, 91)):
        assert_close(window_logits(model, toks, windows), want, 1e-4 * np.abs(want).max(), f"windows {windows}")


# =========================================================================================================
# rollback, row invariance, batching
# =========================================================================================================
def _plain(model, seq, rollback=None):
    st = model.new_state(64, rollback=rollback)
    rows, S, conv = [], [], []
    for t in seq:
        rows.append(model.forward([t], st)[0])
        st.commit(1)
        S.append(st.S[:, st.cur].copy())
        conv.append(st.conv.copy())
    return np.stack(rows), S, conv


@pytest.mark.parametrize("rollback", ["replay", "snapshot"])
@pytest.mark.parametrize("name", ["qwen3next", "qwen35moe-q8"])
def test_commit_keep_equals_plain_decoding(name, rollback, tiny):
    """For T = 2..8 and every keep: the window's rows, the committed state and the next window's logits are
    bitwise those of plain single-token decoding."""
    _, model = tiny(name)
    P = 4
    plain, S, conv = _plain(model, SEQ, rollback)
    for T in range(2, 9):
        for keep in range(1, T + 1):
            st = model.new_state(64, rollback=rollback)
            model.forward(SEQ[:P], st)
            st.commit(P)
            win = model.forward(SEQ[P : P + T], st)
            assert np.array_equal(win, plain[P : P + T]), f"T={T}: window rows differ from plain steps"
            st.commit(keep)
            assert st.pos == P + keep
            assert np.array_equal(st.S[:, st.cur], S[P + keep - 1]), f"T={T} keep={keep}: recurrent state"
            assert np.array_equal(st.conv, conv[P + keep - 1]), f"T={T} keep={keep}: conv history"
            assert not get_keys(st.kv.k, st.pos, st.kv.v.shape[2]).any() and not st.kv.v[:, :, st.pos :].any()
            nxt = model.forward(SEQ[P + keep : P + keep + 3], st)
            assert np.array_equal(nxt, plain[P + keep : P + keep + 3]), f"T={T} keep={keep}"
            st.commit(3)


def test_replay_and_snapshot_agree_and_commit_zero(tiny):
    _, model = tiny("qwen35moe")
    a = window_logits(model, SEQ, (3, 5, 8), "replay")
    b = window_logits(model, SEQ, (3, 5, 8), "snapshot")
    assert np.array_equal(a, b)
    st = model.new_state(64)
    model.forward(SEQ[:5], st)
    st.commit(5)
    before = (st.S[:, st.cur].copy(), st.conv.copy())
    model.forward(SEQ[5:9], st)
    st.commit(0)  # nothing kept: the state is untouched
    assert st.pos == 5 and np.array_equal(st.S[:, st.cur], before[0]) and np.array_equal(st.conv, before[1])


def test_row_invariance_neighbours_and_threads(tiny, threads):
    _, model = tiny("qwen3next")
    first = None
    for n_threads in (1, 2):
        threads(n_threads)
        for T in range(1, 9):
            st = model.new_state(64)
            model.forward(SEQ[:3], st)
            st.commit(3)
            win = SEQ[3 : 3 + T].copy()
            win[1:] = rng.integers(0, 300, T - 1)  # different neighbours after row 0
            row0 = model.forward(win, st)[0]
            first = row0 if first is None else first
            assert np.array_equal(row0, first), f"row 0 changed with T={T}, threads={n_threads}"


def test_batched_sessions_equal_solo(tiny):
    _, model = tiny("qwen35moe")
    solo = [window_logits(model, SEQ[:9], (4, 5)), window_logits(model, SEQ[5:14], (2, 7))]
    sa, sb = model.new_state(64), model.new_state(64)
    got = [[], []]
    for (ta, tb) in (((0, 4), (5, 7)), ((4, 9), (7, 14))):
        la, lb = (r.logits for r in model.forward_batch([(SEQ[ta[0] : ta[1]], sa), (SEQ[tb[0] : tb[1]], sb)]))
        sa.commit(ta[1] - ta[0])
        sb.commit(tb[1] - tb[0])
        got[0].append(la)
        got[1].append(lb)
    assert np.array_equal(np.concatenate(got[0]), solo[0]) and np.array_equal(np.concatenate(got[1]), solo[1])


def test_rewind_restores_checkpoint_or_start(tiny):
    """A recurrent state cannot be cut at any n: rewind goes back to the last prefill checkpoint <= n (or to the
    start) and the next prefill re-feeds the rest, so the logits are those of a fresh run."""
    _, model = tiny("qwen35moe")
    want = window_logits(model, SEQ, (16,))
    s = GuildSession(model, n_ctx=64)
    s.prefill(SEQ[:6].tolist())  # a prompt: checkpoint at 6
    for t in SEQ[6:10]:  # decode steps (not checkpoints)
        model.forward([t], s.state)
        s.state.commit(1)
        s.tokens.append(int(t))
    s.rewind(8)
    assert s.state.pos == 6 and s.tokens == SEQ[:8].tolist()
    assert np.array_equal(s.prefill(SEQ[8:12].tolist()), want[11])  # feeds tokens 6..11
    s.rewind(3)  # before the checkpoint at 12: from the start
    assert s.state.pos == 0 and not s.state.S[:, s.state.cur].any() and not s.state.conv.any()
    assert np.array_equal(s.prefill(SEQ[3:12].tolist()), want[11])


# =========================================================================================================
# speculative decoding parity
# =========================================================================================================
P = [5, 77, 12, 200, 31, 9, 150, 64, 3, 99]
N = 32


def _gen(model, prompt, drafter=None, k=4, sampling=None, rollback=None):
    s = GuildSession(model, n_ctx=160)
    if rollback:
        s.state = model.new_state(160, rollback=rollback)
    return s.generate(prompt, N, drafter=drafter, max_draft=k, sampling=sampling or SamplingParams())


@pytest.mark.parametrize("rollback", ["replay", "snapshot"])
def test_lookup_and_test_drafters_keep_parity(rollback, tiny):
    _, model = tiny("qwen3next-copy")
    first, _ = _gen(model, P)
    prompt = P + first + P  # a copy workload: the model's answer to P is in the prompt
    truth, _ = _gen(model, prompt)
    got, st = _gen(model, prompt, SuffixDrafter(), 4, rollback=rollback)
    assert got == truth
    s = st.summary()
    assert 0 < s["accepted"] < s["drafted"], s  # drafts both kept and rolled back
    n = len(prompt)
    assert _gen(model, prompt, OracleDrafter(n, truth), 7, rollback=rollback)[0] == truth
    for k in (3, 7):
        assert _gen(model, prompt, RandomDrafter(n, truth, seed=k, vocab=320), k, rollback=rollback)[0] == truth
    got, st = _gen(model, prompt, AdversarialDrafter(n, truth), 5, rollback=rollback)
    assert got == truth and st.summary()["accepted"] == 0


def test_sampled_parity(tiny):
    _, model = tiny("qwen3next")
    sampling = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=7, repeat_penalty=1.1)
    truth, _ = _gen(model, P, sampling=sampling)
    assert _gen(model, P, RandomDrafter(len(P), truth, seed=3, vocab=320), 5, sampling)[0] == truth


# =========================================================================================================
# metadata, layer pattern, errors
# =========================================================================================================
def test_layer_pattern(tiny, tmp_path):
    from guild.cli.inspect import layer_pattern

    assert tiny("qwen3next")[1].layer_pattern == "RRRA"
    assert tiny("qwen35moe-q8")[1].layer_pattern == "RRARRA"
    p = write_tiny_hybrid(tmp_path / "m.gguf", "qwen35moe", n_layers=10, full_attention_interval=4)
    model = load_model(str(p))
    assert model.layer_pattern == "RRRARRRARR" == layer_pattern(10, 4)  # what `guild inspect` shows
    g = GGUFFile(p)  # an appended MTP block: not part of the trunk
    g.metadata["qwen35moe.nextn_predict_layers"] = 1
    model = load_model(g)
    assert model.args.n_layers == 9 and model.layer_pattern == "RRRARRRARM" == layer_pattern(10, 4, 1)


def test_bad_metadata_is_a_guild_error(tmp_path):
    path = write_tiny_hybrid(tmp_path / "m.gguf", "qwen3next", n_layers=2, full_attention_interval=2)

    def load(drop=(), **change):
        g = GGUFFile(path)
        for key in drop:
            del g.metadata[key]
        g.metadata.update({f"qwen3next.{k}": v for k, v in change.items()})
        return load_model(g)

    assert isinstance(load(), Qwen3Next) and Qwen35Moe.V_TILED and not Qwen3Next.V_TILED
    with pytest.raises(MetadataError, match="ssm.state_size"):
        load(drop=("qwen3next.ssm.state_size",))
    with pytest.raises(MetadataError, match="inner_size"):
        load(**{"ssm.inner_size": 48})
    with pytest.raises(GuildError, match=r"ssm_conv1d.weight' has shape \(128, 4\), expected \(conv=96"):
        load(**{"ssm.group_count": 1})  # guild.models.validate: the shape table, before any layer is built
    with pytest.raises(GuildError, match="multiple of group_count"):
        load(**{"ssm.group_count": 3})
    with pytest.raises(MetadataError, match="expert_count"):
        load(drop=("qwen3next.expert_count",))
