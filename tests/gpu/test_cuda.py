"""GPU tests: each CUDA kernel against its NumPy twin, row invariance, the engine (windows, commit(keep),
batched sessions, transfers), GPU vs CPU logits within a stated tolerance, and exact parity of speculative vs
plain decoding with the GPU engine.

Every test runs twice: on a CUDA GPU ("cuda", skipped without one; scripts/gpu_check.sh runs them where a GPU
is lent) and on the CPU emulator ("emu", tests/cuda_emu: the same .cu sources built as C++, launched through
the same kernels/cuda/ops.py and CudaBackend, so the kernels' logic is checked in CI). The embedded-model
tests are too big for the emulator and run on a GPU only.

Tolerances. Kernels: quantized matmul |err| <= 1e-4 * (|W| @ |x|) elementwise vs the float64 twin (the CPU
kernels' bound); get_rows bit-exact; norms/rope/swiglu/router 1e-5 relative; attention 1e-5 on O(1) values.
Models: GPU logits within 2e-3 * max|logit| of the float64 reference (the CPU engine's bound,
tests/models/test_embedded.py), hence within 4e-3 * max|logit| of the CPU engine's logits; not bitwise (different
summation orders). Rows: bitwise independent of T and of their neighbours, on the GPU as on the CPU.
"""

import types

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from guild.engine.device import fake_gpu_requested, probe_cuda
from guild.kernels import ref
from guild.kernels.cpu import ops as cpu_ops
from guild.kernels.ref_quant import dequantize, matmul_ref, random_raw
from guild.kernels.rope import rope_tables
from guild.kvtypes import KVTypes
from tests.helpers.kv import kv_layer

pytestmark = pytest.mark.gpu

DEV, WHY = probe_cuda()
if fake_gpu_requested():  # the counting host backend is no GPU: these tests want CuPy on a real device
    DEV, WHY = None, "GUILD_FAKE_GPU is set (a host-backend stand-in, not a GPU)"
QTYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
          Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.MXFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M]
SEQ = np.array([5, 77, 12, 200, 31, 9, 150, 64, 3, 99, 18, 250, 42, 7, 120, 33], np.int64)


@pytest.fixture(scope="module", autouse=True)
def _fp32_numerics():
    """The CUDA kernels are fp32 dequant-dot: the CPU models they are compared with (and the host's share of
    a placement) are packed for the same numerics."""
    from guild.kernels.cpu import quant

    before = quant.current_numerics()
    quant.set_default_numerics("f32")
    yield
    quant.set_default_numerics(before)


@pytest.fixture(scope="module", params=["cuda", "emu"])
def gpu(request, tmp_path_factory):
    """cp (CuPy or NumPy), g (kernels/cuda/ops.py), h (to host), backend() (a CudaBackend), emu (bool)."""
    if request.param == "cuda":
        if DEV is None:
            pytest.skip(f"no usable CUDA GPU: {WHY}")
        import cupy

        from guild.engine.backends import CudaBackend
        from guild.kernels.cuda import ops

        yield types.SimpleNamespace(cp=cupy, g=ops, h=cupy.asnumpy, backend=lambda: CudaBackend(DEV.index), emu=False)
        return
    from tests import cuda_emu

    lib = cuda_emu.build(tmp_path_factory.getbasetemp() / "cuda_emu")
    if lib is None:
        pytest.skip("no C++ compiler for the CUDA emulator")
    emu = cuda_emu.Emulator(lib)
    with pytest.MonkeyPatch.context() as mp:
        cuda_emu.patch(mp, emu)
        from guild.kernels.cuda import ops

        yield types.SimpleNamespace(cp=emu.fake_cupy(), g=ops, h=np.asarray,
                                    backend=lambda: cuda_emu.emu_backend_class()(0), emu=True)


# -- kernels vs NumPy twins -----------------------------------------------------------------------------
@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
def test_matmul_and_get_rows_vs_twins(gpu, qt):
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(int(qt))
    N, K = 90, 512  # N not a multiple of the 4 features per block
    raw = random_raw(qt, N, K, rng)
    w = dequantize(qt, raw, (N, K))
    dm = g.pack(qt, raw, N, K)
    rows = np.array([0, 89, 7, 7, 45], np.int64)
    out = cp.empty((rows.size, K), cp.float32)
    g.dequantize_rows(dm, cp.asarray(rows), out)
    assert np.array_equal(h(out), w[rows]), "get_rows must be bit-exact with ref_quant.dequantize"
    for T in (1, 3, 8, 13):
        x = rng.standard_normal((T, K)).astype(np.float32)
        y = cp.empty((T, N), cp.float32)
        g.matmul(dm, cp.asarray(x), y)
        bound = 1e-4 * (np.abs(w).astype(np.float64) @ np.abs(x).T.astype(np.float64)).T + 1e-30
        assert (np.abs(h(y) - matmul_ref(w, x)) <= bound).all(), f"{qt.name} T={T}"


def test_matmul_accumulate_and_strided_views(gpu):
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(1)
    N, K, T = 64, 256, 5
    dm = g.pack(Q.Q4_K, random_raw(Q.Q4_K, N, K, rng), N, K)
    big = cp.asarray(rng.standard_normal((T, K + 64)).astype(np.float32))
    x = big[:, 32 : 32 + K]  # row stride K + 64
    out = cp.asarray(rng.standard_normal((T, N + 16)).astype(np.float32))
    before = h(out).copy()
    y = cp.empty((T, N), cp.float32)
    g.matmul(dm, cp.ascontiguousarray(x), y)
    g.matmul(dm, x, out[:, 8 : 8 + N], accumulate=True)
    got = h(out)
    assert np.array_equal(got[:, 8 : 8 + N], before[:, 8 : 8 + N] + h(y))
    assert np.array_equal(got[:, :8], before[:, :8]) and np.array_equal(got[:, 8 + N :], before[:, 8 + N :])


def test_norms_rope_swiglu_vs_twins(gpu):
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 576)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(576)).astype(np.float32)
    out = cp.empty((6, 576), cp.float32)
    g.rmsnorm(cp.asarray(x), cp.asarray(w), 1e-5, out)
    np.testing.assert_allclose(h(out), ref.rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    xin = cp.asarray(x)
    g.rmsnorm(xin, cp.asarray(w), 1e-5, xin)  # in place
    np.testing.assert_allclose(h(xin), ref.rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-6)

    q = rng.standard_normal((5, 8, 128)).astype(np.float32)
    wh = (1 + 0.1 * rng.standard_normal(128)).astype(np.float32)
    qd = cp.asarray(q)
    g.rmsnorm_heads(qd, cp.asarray(wh), 1e-6)
    np.testing.assert_allclose(h(qd), ref.rmsnorm(q, wh, 1e-6), rtol=1e-5, atol=1e-6)

    pos = np.array([0, 1, 17, 300, 511], np.int64)
    qk = q[:, :, :64].copy()
    for neox in (False, True):
        for n_rot in (64, 32):
            c, s = rope_tables(512, n_rot, 10000.0)
            xd = cp.asarray(qk)
            g.rope(xd, cp.asarray(pos), cp.asarray(c), cp.asarray(s), n_rot, neox)
            np.testing.assert_allclose(h(xd), ref.rope(qk, pos, c, s, n_rot, neox), rtol=1e-5, atol=1e-5)
            mine = qk.copy()  # and the CPU kernel: the same rounded products, so the same bits
            cpu_ops.rope(mine, pos, c, s, n_rot, neox)
            assert np.array_equal(h(xd), mine), f"rope neox={neox} n_rot={n_rot}"

    gu = rng.standard_normal((4, 2 * 96)).astype(np.float32)
    act = cp.empty((4, 96), cp.float32)
    g.swiglu(cp.asarray(gu), act)
    np.testing.assert_allclose(h(act), ref.swiglu(gu), rtol=1e-5, atol=1e-6)
    a = rng.standard_normal((3, 40)).astype(np.float32)
    b = rng.standard_normal((3, 40)).astype(np.float32)
    ad = cp.asarray(a)
    g.add(ad, cp.asarray(b))
    assert np.array_equal(h(ad), a + b)


def test_router_vs_twin(gpu):
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(3)
    for E, k, renorm in ((8, 2, True), (128, 8, True), (64, 4, False)):
        logits = (2 * rng.standard_normal((7, E))).astype(np.float32)
        ids = cp.empty((7, k), cp.int64)
        wts = cp.empty((7, k), cp.float32)
        g.softmax_topk(cp.asarray(logits), k, renorm, ids, wts)
        rid, rw = ref.softmax_topk(logits, k, renorm)
        assert np.array_equal(h(ids), rid)
        np.testing.assert_allclose(h(wts), rw, rtol=1e-5)
        cid, cw = np.empty((7, k), np.int64), np.empty((7, k), np.float32)
        cpu_ops.softmax_topk(logits, k, renorm, cid, cw)
        assert np.array_equal(h(ids), cid)


def _parts(op) -> tuple:
    return op if isinstance(op, tuple) else (op,)


def _filled(gpu, kv: KVTypes, k_all, v_all, windows):
    """A device layer of kv's types (CudaBackend.kv_zeros) written window by window with kv_write."""
    cp, g = gpu.cp, gpu.g
    kop, vop = gpu.backend().kv_zeros(k_all.shape[1], k_all.shape[2], k_all.shape[0], kv)
    for p0, p1 in windows:  # written in order
        g.kv_write(kop, vop, cp.asarray(k_all[p0:p1]), cp.asarray(v_all[p0:p1]), p0)
    return kop, vop


@pytest.mark.parametrize("hd,kt,vt", [(64, "f32", "f32"), (128, "f32", "f32"), (64, "f16", "q8_0"),
                                      (128, "q8_0", "f16")])
def test_kv_write_and_attention_vs_twins(gpu, hd, kt, vt):
    """Each stored type's bytes are the host cache's (f16 rounded to nearest even, q8_0 by Q8_0's rule), and
    attention over them matches the float64 twin over the stored values."""
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(hd)
    H, Hkv, ctx, kv = 8, 2, 640, KVTypes(kt, vt)
    k_all = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
    v_all = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
    k_all[7, 1, 32:64] = v_all[9, 0, :32] = 0.0  # all-zero q8_0 blocks: scale 0, quants 0
    kop, vop = _filled(gpu, kv, k_all, v_all, ((0, 300), (300, 305), (305, 600)))
    hk, hv = kv_layer(kt, vt, k_all[:600], v_all[:600])
    for dev, host in zip(_parts(kop), _parts(hk), strict=True):  # keys: [Hkv, X, ctx] beside the host's tiles
        assert dev.dtype == host.dtype and np.array_equal(h(dev)[:, :, :600], cpu_ops.get_keys(host, 0, 600))
    for dev, host in zip(_parts(vop), _parts(hv), strict=True):
        assert dev.dtype == host.dtype and np.array_equal(h(dev)[:, :600], host[:, :600])
    k_st = ref.kv_values(hk, True).astype(np.float32)  # what the cache holds, as float32 (exact)
    v_st = ref.kv_values(hv, False).astype(np.float32)
    scale = 1.0 / np.sqrt(hd)
    cases = ((0, 1), (37, 5), (595, 5)) if gpu.emu else ((0, 1), (0, 8), (37, 5), (300, 1), (595, 5))
    for pos0, T in cases:  # L crosses the 256-position chunks
        q = rng.standard_normal((T, H, hd)).astype(np.float32)
        out = cp.empty((T, H, hd), cp.float32)
        g.attention(cp.asarray(q), kop, vop, pos0, scale, out)
        want = ref.attention(q, k_st[: pos0 + T], v_st[: pos0 + T], pos0, scale)
        np.testing.assert_allclose(h(out), want, rtol=1e-5, atol=1e-5)


def test_kv_write_rounds_halves_as_numpy(gpu):
    """f16 storage rounds as NumPy's astype(float16): ties to even, subnormal halves, overflow to inf, signed
    zero (on the emulator this checks its conversion; on a GPU, PTX cvt.rn.f16.f32)."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-9, 5, 4096)).astype(np.float32)
    edges = [0.0, -0.0, 1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 2**-24, 2**-25, 3 * 2**-26, 2**-14 - 2**-25,
             6.1e-5, 65504.0, 65519.0, 65520.0, -70000.0, np.inf, -np.inf, 1e-8, -3e-8]
    x[: len(edges)] = edges
    k = x.reshape(32, 2, 64)
    kop, vop = _filled(gpu, KVTypes("f16", "f16"), k, k[::-1].copy(), ((0, 32),))
    with np.errstate(over="ignore"):  # 65520 and beyond: inf, as intended
        want = k.astype(np.float16).view(np.uint16)
    assert np.array_equal(gpu.h(kop), want.transpose(1, 2, 0))
    assert np.array_equal(gpu.h(vop), want[::-1].transpose(1, 0, 2))


def test_a_q8_0_cache_needs_whole_blocks_of_32(gpu):
    """A kernel never sees a q8_0 operand whose head_dim is not whole blocks (the engine checks the flag first)."""
    cp, g = gpu.cp, gpu.g
    op = (cp.zeros((1, 48, 8), np.int8), cp.zeros((1, 1, 8), np.uint16))
    with pytest.raises(ValueError, match="multiple of 32, got 48"):
        g.attention(cp.zeros((1, 1, 48), cp.float32), op, cp.zeros((1, 8, 48), np.uint16), 0, 0.1,
                    cp.zeros((1, 1, 48), cp.float32))
    with pytest.raises(ValueError, match="multiple of 32, got 48"):
        g.kv_write(cp.zeros((1, 48, 8), cp.float32), op, cp.zeros((1, 1, 48), cp.float32),
                   cp.zeros((1, 1, 48), cp.float32), 0)


def test_emulator_checks_kernel_arguments(gpu):
    """The emulator refuses launches whose arguments do not match the kernel's parameters (CuPy would not)."""
    if not gpu.emu:
        pytest.skip("emulator only")
    x = np.zeros((2, 64), np.float32)
    good = (x, np.int64(64), x[0], np.float64(1e-5), x, np.int64(64), np.int32(64))
    gpu.g.kernel("ops", "rmsnorm")((2,), (256,), good)
    for bad in (good[:-1], (*good[:3], np.float32(1e-5), *good[4:])):
        with pytest.raises(RuntimeError, match="do not match"):
            gpu.g.kernel("ops", "rmsnorm")((2,), (256,), bad)


# -- row invariance ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("qt", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.F16, Q.Q3_K, Q.IQ2_XS], ids=lambda q: q.name)
def test_matmul_rows_invariant(gpu, qt):
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(4)
    M = 24 if gpu.emu else 64
    dm = g.pack(qt, random_raw(qt, 96, 512, rng), 96, 512)
    x = cp.asarray(rng.standard_normal((M, 512)).astype(np.float32))
    full = cp.empty((M, 96), cp.float32)
    g.matmul(dm, x, full)
    full = h(full)
    for T in (1, 2, 3, 7, 8, 9, 17, 33, 64):
        if T > M:
            continue
        part = cp.empty((T, 96), cp.float32)
        g.matmul(dm, cp.ascontiguousarray(x[M - T :]), part)
        assert np.array_equal(h(part), full[M - T :]), f"{qt.name} T={T}"


@pytest.mark.parametrize("kt,vt", [("f32", "f32"), ("q8_0", "f16"), ("f16", "q8_0")])
def test_attention_rows_invariant(gpu, kt, vt):
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(5)
    H, Hkv, hd, ctx = 9, 3, 64, 400
    k_all = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
    v_all = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
    kop, vop = _filled(gpu, KVTypes(kt, vt), k_all, v_all, ((0, ctx),))
    q = rng.standard_normal((8, H, hd)).astype(np.float32)
    pos0 = 290
    win = cp.empty((8, H, hd), cp.float32)
    g.attention(cp.asarray(q), kop, vop, pos0, 0.125, win)
    win = h(win)
    for t in (0, 3, 7):
        one = cp.empty((1, H, hd), cp.float32)
        g.attention(cp.asarray(q[t : t + 1]), kop, vop, pos0 + t, 0.125, one)
        assert np.array_equal(h(one)[0], win[t]), f"row {t}"


# -- the engine -------------------------------------------------------------------------------------------
def _engine(gpu, model):
    from guild.engine.gpu import split_onto_device
    from guild.engine.placement import GpuSplit

    return split_onto_device(model, gpu.backend(), GpuSplit(model.args.n_layers))


@pytest.fixture(scope="module", params=[
    dict(arch="llama", qtype="Q4_1"),
    dict(arch="llama", qtype="Q8_0", n_experts=4, top_k=2),
    dict(arch="qwen3moe", qtype="Q4_K", n_experts=4, top_k=2, dim=256, ffn=256, tied=True),
], ids=lambda c: "-".join(str(v) for v in c.values()))
def tiny(request, tmp_path_factory):
    from guild.models import load_model
    from guild.tools.tiny import write_tiny_model

    path = tmp_path_factory.mktemp("tiny") / "m.gguf"
    write_tiny_model(path, seed=3, **request.param)
    return str(path), load_model(str(path))


def test_tiny_engine_vs_reference_and_windows(gpu, tiny):
    from tests.helpers.reference import reference_forward

    path, model = tiny
    eng = _engine(gpu, model)
    st = eng.new_state(64)
    got = eng.forward(SEQ[:10], st)
    want = reference_forward(path, SEQ[:10])
    assert np.abs(got - want).max() <= 2e-3 * max(1.0, np.abs(want).max())
    cpu = model.forward(SEQ[:10], model.new_state(64))
    assert np.abs(got - cpu).max() <= 4e-3 * max(1.0, np.abs(cpu).max())
    # windows = single steps, bitwise; after commit(keep) the next window is as if only `keep` rows were fed
    n = 8 if gpu.emu else 12
    plain = []
    s = eng.new_state(64)
    for t in SEQ[:n]:
        plain.append(eng.forward([t], s)[0])
        s.commit(1)
    plain = np.stack(plain)
    for T, keep in ((2, 1), (4, 4)) if gpu.emu else ((2, 1), (5, 2), (5, 5), (8, 1), (8, 6)):
        s = eng.new_state(64)
        eng.forward(SEQ[:2], s)
        s.commit(2)
        win = eng.forward(SEQ[2 : 2 + T], s)
        assert np.array_equal(win, plain[2 : 2 + T]), f"T={T}"
        s.commit(keep)
        nxt = eng.forward(SEQ[2 + keep : 4 + keep], s)
        assert np.array_equal(nxt, plain[2 + keep : 4 + keep]), f"T={T} keep={keep}"
        s.commit(0)


def test_tiny_engine_batched_sessions_and_transfers(gpu, tiny):
    _, model = tiny
    eng = _engine(gpu, model)
    a, b = eng.new_state(64), eng.new_state(64)
    eng.forward(SEQ[:5], a)
    a.commit(5)
    eng.forward(SEQ[5:8], b)
    b.commit(3)
    h2d, d2h = eng.dev.h2d, eng.dev.d2h
    both = [r.logits for r in eng.forward_batch([(SEQ[12:15], a), (SEQ[15:16], b)])]
    n_moe = model.args.n_layers if model.args.is_moe else 0
    assert (eng.dev.h2d - h2d, eng.dev.d2h - d2h) == (1 + n_moe, 1 + n_moe)
    a.commit(0)
    b.commit(0)
    assert np.array_equal(both[0], eng.forward(SEQ[12:15], a))
    a.commit(0)
    assert np.array_equal(both[1], eng.forward(SEQ[15:16], b))


# -- the embedded models (GPU only: too large for the emulator) ------------------------------------------
@pytest.mark.parametrize("which", ["dense", "moe"])
def test_embedded_gpu_vs_cpu_logits(gpu, which, request):
    from tests.helpers.reference import reference_forward

    if gpu.emu:
        pytest.skip("embedded models: GPU only (too slow for the emulator)")
    model = request.getfixturevalue(f"{which}_model")
    path = request.getfixturevalue(f"{which}_path")
    ids = [1, 504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 5165, 314]
    cpu = model.forward(ids, model.new_state(64))
    eng = _engine(gpu, model)
    got = eng.forward(ids, eng.new_state(64))
    m = np.abs(cpu).max()
    assert np.abs(got - cpu).max() <= 4e-3 * m, f"max |gpu - cpu| = {np.abs(got - cpu).max():.4g}, max |logit| {m:.3g}"
    assert (got.argmax(1) == cpu.argmax(1)).mean() >= 0.9
    if which == "dense":
        want = reference_forward(path, ids)
        assert np.abs(got - want).max() < 2e-3 * np.abs(want).max()


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_embedded_speculative_parity_on_gpu(gpu, which, request):
    """Every strategy the model can run (mtp where it has a head: the MoE's shipped one) emits plain decoding's
    tokens on the GPU; the repeated text makes the copying drafters' drafts accepted."""
    from guild.engine.session import GuildSession
    from guild.models.mtp import find_mtp_head
    from guild.speculative.build import make_drafter

    if gpu.emu:
        pytest.skip("embedded models: GPU only (too slow for the emulator)")
    model = request.getfixturevalue(f"{which}_model")
    eng = _engine(gpu, model)
    text = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 5165, 314] * 3
    plain, _ = GuildSession(eng, n_ctx=256).generate(text, 48)
    head = find_mtp_head(eng)
    assert (head is not None) == (which == "moe")
    for strategy in ("lookup", "retrieval", "adaptive", *(("mtp",) if head is not None else ())):
        d = make_drafter(strategy, mtp_head=head, n_ctx=256)
        d.ingest(text)
        got, st = GuildSession(eng, n_ctx=256).generate(text, 48, drafter=d, max_draft=4)
        assert got == plain, f"{strategy} on the GPU differs from plain decoding"
        s = st.summary()
        assert s["drafted"] > 0, (strategy, s)
        if strategy in ("lookup", "retrieval"):
            assert s["accepted"] > 0, (strategy, s)


# -- Gated DeltaNet kernels and the hybrid models ---------------------------------------------------------
def test_deltanet_kernels_vs_twins(gpu):
    cp, g, h = gpu.cp, gpu.g, gpu.h
    rng = np.random.default_rng(7)
    T, C, K = 5, 48, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    hist = rng.standard_normal((K - 1, C)).astype(np.float32)
    wt = rng.standard_normal((K, C)).astype(np.float32)
    out = cp.empty((T, C), cp.float32)
    g.conv1d_silu(cp.asarray(x), cp.asarray(hist), cp.asarray(wt), out)
    np.testing.assert_allclose(h(out), ref.conv1d_silu(x, hist, wt), rtol=1e-5, atol=1e-5)
    Hv, Hk, dk, dv = 4, 2, 16, 16
    alpha, b = (rng.standard_normal((T, Hv)).astype(np.float32) for _ in range(2))
    dt_bias, a = rng.standard_normal(Hv).astype(np.float32), -np.exp(rng.standard_normal(Hv)).astype(np.float32)
    gg, bb = cp.empty((T, Hv), cp.float32), cp.empty((T, Hv), cp.float32)
    g.gdn_gates(cp.asarray(alpha), cp.asarray(b), cp.asarray(dt_bias), cp.asarray(a), gg, bb)
    rg, rb = ref.gdn_gates(alpha, b, dt_bias, a)
    np.testing.assert_allclose(h(gg), rg, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h(bb), rb, rtol=1e-5, atol=1e-6)
    qk = rng.standard_normal((T, Hk, dk)).astype(np.float32)
    xd = cp.asarray(qk)
    g.l2norm_heads(xd, 1e-6)
    np.testing.assert_allclose(h(xd), ref.l2norm_heads(qk, 1e-6), rtol=1e-5, atol=1e-6)
    q, k = ref.l2norm_heads(qk, 1e-6), ref.l2norm_heads(rng.standard_normal((T, Hk, dk)), 1e-6)
    v = rng.standard_normal((T, Hv, dv)).astype(np.float32)
    kmap = np.arange(Hv, dtype=np.int64) % Hk
    S0 = rng.standard_normal((Hv, dk, dv)).astype(np.float32)
    pool = np.zeros((T + 1, Hv, dk, dv), np.float32)
    pool[0] = S0
    dst = np.arange(1, T + 1, dtype=np.int64)  # a snapshot per row
    pd, o = cp.asarray(pool), cp.empty((T, Hv, dv), cp.float32)
    g.gdn_recurrence(cp.asarray(q), cp.asarray(k), cp.asarray(v), gg, bb, cp.asarray(kmap), 0.25, pd, 0,
                     cp.asarray(dst), o)
    want, S = ref.gdn_recurrence(q, k, v, rg, rb, kmap, 0.25, S0)
    np.testing.assert_allclose(h(o), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(h(pd)[T], S, rtol=1e-4, atol=1e-4)
    for t in (0, 2):  # row t's snapshot is the state after t + 1 rows
        _, St = ref.gdn_recurrence(q[: t + 1], k[: t + 1], v[: t + 1], rg[: t + 1], rb[: t + 1], kmap, 0.25, S0)
        np.testing.assert_allclose(h(pd)[t + 1], St, rtol=1e-4, atol=1e-4)
    z = rng.standard_normal((T, Hv, dv)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    y = cp.empty((T, Hv, dv), cp.float32)
    g.gated_rmsnorm(cp.asarray(v), cp.asarray(z), cp.asarray(w), 1e-6, y)
    np.testing.assert_allclose(h(y), ref.gated_rmsnorm(v, z, w, 1e-6), rtol=1e-5, atol=1e-5)
    for G in (1, C):
        gate = rng.standard_normal((T, G)).astype(np.float32)
        sm = cp.empty((T, C), cp.float32)
        g.sigmoid_mul(cp.asarray(x), cp.asarray(gate), sm)
        np.testing.assert_allclose(h(sm), ref.sigmoid_mul(x, gate), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from guild.models import load_model
    from guild.tools.tiny_hybrid import write_tiny_hybrid

    path = write_tiny_hybrid(tmp_path_factory.mktemp("hyb") / "h.gguf", arch="qwen35moe", n_layers=4, nextn=True,
                             qtype="Q8_0", shared_ffn=64, seed=2)
    return str(path), load_model(str(path))


def test_hybrid_engine_windows_rollback_and_logits(gpu, hybrid):
    """qwen35moe placed whole on the device: logits near the CPU model's; a window's rows are bitwise single
    steps; after commit(keep) (the device snapshot of row keep-1) the next window is as if only keep rows were
    fed; replay rollback gives the same."""
    _, model = hybrid
    eng = _engine(gpu, model)
    seq = SEQ[:8]
    cpu = model.forward(seq, model.new_state(64))
    got = eng.forward(seq, eng.new_state(64))
    assert np.abs(got - cpu).max() <= 4e-3 * max(1.0, np.abs(cpu).max())
    plain, s = [], eng.new_state(64)
    for t in seq:
        plain.append(eng.forward([t], s)[0])
        s.commit(1)
    plain = np.stack(plain)
    for rollback in ("snapshot", "replay"):
        s = eng.new_state(64, rollback=rollback)
        eng.forward(seq[:2], s)
        s.commit(2)
        win = eng.forward(seq[2:6], s)
        assert np.array_equal(win, plain[2:6]), rollback
        s.commit(2)
        assert np.array_equal(eng.forward(seq[4:6], s), plain[4:6]), rollback
        s.commit(0)


# every architecture, every strategy and both samplings at least once, mtp on a sidecar head and on a hybrid's
# nextn block (the full matrix runs on the counting host backend in tests/gpu/test_gpu_matrix.py, with the same
# input-grounded prompts; the emulator costs ~15-40 s a cell)
CELLS = [("llama-moe", "mtp", "greedy"), ("qwen35moe", "mtp", "seeded"), ("qwen3next", "adaptive", "greedy"),
         ("qwen3moe", "lookup", "seeded"), ("llama", "retrieval", "greedy"), ("qwen3", "adaptive", "seeded"),
         ("qwen3", "normal", "greedy"), ("llama-moe-fused", "mtp", "seeded")]


@pytest.mark.parametrize("name,strategy,sampling", CELLS)
def test_strategy_cells_on_the_device(gpu, tmp_path, name, strategy, sampling, fixed_clock):
    """Cells of tests/gpu/test_gpu_matrix.py with the kernels of kernels/cuda/: the placed model (MTP head on the
    device too) emits the CPU engine's `normal` stream, with drafts proposed, accepted and rejected."""
    from guild.models import load_model
    from tests.gpu.test_gpu_matrix import SAMPLING, check_cell, generate, workload, write_arch

    model = load_model(write_arch(tmp_path, name))
    w = workload(model, SAMPLING[sampling])
    got, st = generate(_engine(gpu, model), strategy, SAMPLING[sampling], prompt=w.prompt, corpus=w.corpus,
                       clock=fixed_clock)
    assert got == w.want
    check_cell(strategy, st, f"{name} {strategy} {sampling}")


def test_stored_kv_types_on_the_device(gpu, tmp_path, fixed_clock):
    """Keys q8_0 and values f16 in the device's cache (kernels/cuda/attention.cu): the placed model emits the CPU
    engine's `normal` stream of the same types, with drafts proposed, accepted and rejected."""
    from guild.models import load_model
    from tests.engine.test_kv_types import write_model
    from tests.gpu.test_gpu_matrix import SAMPLING, check_cell, generate, workload

    kv, sp = KVTypes("q8_0", "f16"), SAMPLING["greedy"]
    model = load_model(write_model(tmp_path, "llama-moe"))
    w = workload(model, sp, kv=kv)
    eng = _engine(gpu, model)
    got, st = generate(eng, "adaptive", sp, prompt=w.prompt, corpus=w.corpus, clock=fixed_clock, kv=kv)
    assert got == w.want
    check_cell("adaptive", st, f"adaptive {kv.describe()}")
    cache = eng.new_state(64, kv)
    assert cache.nbytes == 64 * kv.token_bytes(model.args.n_layers, model.args.n_kv_heads, model.args.head_dim)


def test_mtp_head_with_a_draft_vocabulary_on_the_device(gpu, tmp_path):
    """The draft LM head over the --spec-mtp-vocab rows (a device copy of those output rows) drafts the same
    tokens on the device as on the CPU."""
    from guild.engine.session import GuildSession
    from guild.models import load_model
    from guild.models.mtp import find_mtp_head
    from guild.speculative.build import make_drafter
    from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head

    path = write_tiny_model(tmp_path / "m.gguf", n_experts=4, top_k=2, qtype="Q8_0", seed=3)
    write_tiny_mtp_head(path, tmp_path / "m.mtp.gguf", draft_vocab=96)
    model = load_model(str(path))
    eng = _engine(gpu, model)
    prompt = [int(t) for t in SEQ[:10]] * 2
    runs = []
    for m in (model, eng):
        head = find_mtp_head(m, draft_vocab=64)
        assert head.vocab_ids is not None and head.w.output.n_rows == 64
        d = make_drafter("mtp", mtp_head=head, n_ctx=64)
        toks, st = GuildSession(m, n_ctx=64).generate(prompt, 6, drafter=d, max_draft=2)
        runs.append((toks, [w.k for w in st.windows], [w.kept for w in st.windows]))
    assert runs[0] == runs[1] and any(runs[1][1])
