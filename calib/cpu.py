"""Pass 3 of `guild optimize`: CPU kernel tuning on the model's own weight matrices.

What can be chosen today: the thread count (Numba workers, 1..NUMBA_NUM_THREADS), timed per quant type. Each
quant type has exactly one GEMV kernel per numeric mode (kernels/cpu/quant.py: int8 activations with integer dot
products for the types qdot covers under "i8", else the tiled fp32 dequant-dot), so the "variant" recorded per
type is the kernel its matrices run, the only candidate; when more variants exist they are timed here the same
way. Routed-expert matrices are preferred
where a type has them (the CPU's share of a verification window); experts see 1-2 rows per window, so each
matrix is timed at T = 1 and T = 2. Timings are warm (repeated passes over the same matrices), as steady
decoding sees weights that stay in the last-level cache; for a model far larger than the LLC the G weights/s
figures overstate what memory delivers, while the thread-count ranking is what matters here.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numba
import numpy as np
from gguf import GGMLQuantizationType

from ..kernels.cpu import quant
from ..kernels.cpu.simd import AVX2, VNNI512
from ..plans.plan import CpuTuning, KernelTuning

ROWS = (1, 2)


def kernel_variants(qtype: int, numerics: str = "f32") -> tuple[str, ...]:
    """The GEMV kernel a quant type's matrices run on this host under `numerics` (one per type and mode)."""
    if quant.numerics_for(qtype, numerics) == "i8":
        return (f"int8-{'vnni512' if VNNI512 else 'avx2' if AVX2 else 'portable'}",)
    return (f"tiled-fp32-{'avx512' if quant._AVX512 else 'avx2'}",)


def model_matrices(model) -> list[tuple[str, quant.PackedMatrix, bool]]:
    """(attribute path, packed matrix, is a routed expert) for every weight matrix the model holds, found by
    walking its attributes (layers, mixers, ffns ... whatever the architecture names them). The embedding
    matrix counts only as the output head when tied: token lookups are not GEMVs."""
    out: list = []
    seen: set[int] = set()

    def walk(obj, label: str, depth: int, expert: bool) -> None:
        if isinstance(obj, quant.PackedMatrix):
            if id(obj) not in seen:
                seen.add(id(obj))
                out.append((label, obj, expert))
            return
        if depth > 5 or obj is None or isinstance(obj, (np.ndarray, str, bytes, int, float, bool)):
            return
        if isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                walk(x, f"{label}[{i}]", depth + 1, expert)
            return
        for k, v in getattr(obj, "__dict__", {}).items():
            if k in ("gguf", "embed"):
                continue
            walk(v, f"{label}.{k}" if label else k, depth + 1, expert or ("expert" in k and "shexp" not in k))

    walk(model, "", 0, False)
    return out


def thread_candidates(max_threads: int | None = None) -> tuple[int, ...]:
    n = min(max_threads or numba.config.NUMBA_NUM_THREADS, numba.config.NUMBA_NUM_THREADS)
    if n <= 8:
        return tuple(range(1, n + 1))
    return tuple(sorted({1, 2, 4, 8, 16, 32, 64, n} & set(range(1, n + 1)) | {n // 2}))


def tune_cpu(model, *, repeats: int = 5, per_type: int = 6, max_threads: int | None = None,
             bandwidth_gbs: float = 0.0) -> CpuTuning:
    """Time each quant type's kernel on up to `per_type` of the model's matrices at every candidate thread
    count (thread counts interleaved within each repeat, so machine noise hits them alike; the best of the
    repeats counts, the least disturbed pass); pick the count with the least estimated time over all the
    model's matrices."""
    mats = model_matrices(model)
    by_type: dict[int, list] = defaultdict(list)
    for label, m, is_exp in mats:
        by_type[m.qtype].append((label, m, is_exp))
    cands = thread_candidates(max_threads)
    rng = np.random.default_rng(0)
    before = numba.get_num_threads()
    plans = []
    for qt, items in sorted(by_type.items()):
        experts = [it for it in items if it[2]]
        pool = experts or items
        pick = [pool[int(i)] for i in np.linspace(0, len(pool) - 1, min(per_type, len(pool))).round()]
        xs = {T: {id(m): rng.standard_normal((T, m.n_cols)).astype(np.float32) for _, m, _ in pick} for T in ROWS}
        outs = {T: {id(m): np.empty((T, m.n_rows), np.float32) for _, m, _ in pick} for T in ROWS}
        plans.append((qt, items, pick, bool(experts), xs, outs))
    times: dict[tuple[int, int, int], list[float]] = defaultdict(list)  # (qtype, threads, T) -> seconds
    try:
        for _, _, pick, _, xs, outs in plans:  # warm-up: compile / page in
            for T in ROWS:
                for _, m, _ in pick:
                    quant.matmul(m, xs[T][id(m)], outs[T][id(m)])
        for _ in range(repeats):
            for n in cands:
                numba.set_num_threads(n)
                for qt, _, pick, _, xs, outs in plans:
                    for T in ROWS:
                        t0 = time.perf_counter()
                        for _, m, _ in pick:
                            quant.matmul(m, xs[T][id(m)], outs[T][id(m)])
                        times[(qt, n, T)].append(time.perf_counter() - t0)
    finally:
        numba.set_num_threads(before)
    kernels = []
    est = dict.fromkeys(cands, 0.0)  # estimated seconds for one pass over every matrix of the model
    for qt, items, pick, has_exp, _, _ in plans:
        ms = [sum(min(times[(qt, n, T)]) for T in ROWS) * 1e3 for n in cands]
        best = cands[int(np.argmin(ms))]
        scale = len(items) / len(pick)
        for n, v in zip(cands, ms, strict=True):
            est[n] += v * scale
        weights = sum(m.n_rows * m.n_cols for _, m, _ in pick)
        t1 = min(times[(qt, best, 1)])
        variants = kernel_variants(qt, items[0][1].numerics)
        kernels.append(KernelTuning(GGMLQuantizationType(qt).name, variants[0], variants,
                                    "experts" if has_exp else "dense", len(items), len(pick), cands,
                                    tuple(round(v, 4) for v in ms), best, round(weights / t1 / 1e9, 3)))
    threads = min(cands, key=lambda n: est[n]) if kernels else before
    return CpuTuning(threads, round(bandwidth_gbs, 2), tuple(kernels))
