"""The quantized CPU matrix kernels alone: G weights/s (N*K / seconds per matmul call) per type, shape and T; with
--attention, one layer's attention instead (SmolLM2-135M's heads: 9 query and 3 KV heads of 64) for a window of T
rows ending a populated context of each size, per KV cache type: V(T) in ms and V(T)/V(1).

Shapes are SmolLM2-135M's (N x K): attention 576x576, FFN gate/up 1536x576, down 576x1536, output head 49152x576;
a type whose block (256 for K-quants, IQ4_XS) does not divide K = 576 is measured at K = 768. Random blocks with
sane scales; each figure is the median of calls within --seconds, after a warm-up one. One thread count a run.

    python -m guild.bench kernels --types Q4_1,Q8_0 -t 1 [--rows 1,2,4,8] [--seconds 0.3]
    python -m guild.bench kernels --attention 4096,32768 [--cache-types f32,f16,q8_0] -t 2 [--rows 1,4]
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as Q

from ...engine.state import KVCache
from ...errors import BadFlagError
from ...kernels import ref_quant
from ...kernels.cpu import ops
from ...kernels.cpu import quant as kq
from ...kernels.quant_types import QUANT_TYPES
from ...kvtypes import KV_TYPES, KVTypes
from .. import runners as R
from ..harness import Run, Runner

ROUNDS = 1  # each figure is already a median over --seconds of calls
SHAPES = ((576, 576), (1536, 576), (576, 1536), (49152, 576))
ATT_HEADS = (9, 3, 64)  # query heads, KV heads, head_dim


def add_args(ap) -> None:
    ap.add_argument("--types", default=",".join(q.name for q in QUANT_TYPES), help="comma-separated quant types")
    ap.add_argument("--rows", default="1,2,4,8", help="comma-separated window sizes T (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=0.3, help="time budget per figure (default: %(default)s)")
    ap.add_argument("--numerics", choices=kq.NUMERICS, default="i8", help="numeric mode the matrices are packed for")
    ap.add_argument("--attention", metavar="CONTEXTS", help="comma-separated populated contexts: time attention")
    ap.add_argument("--cache-types", default=",".join(KV_TYPES), help="KV cache types for --attention")


def _positive(flag: str, text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        raise BadFlagError(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return vals


def check(a) -> None:
    a.row_list = _positive("--rows", a.rows)
    if a.threads > numba.config.NUMBA_NUM_THREADS:
        raise BadFlagError(f"--threads {a.threads}: Numba has {numba.config.NUMBA_NUM_THREADS} threads here")
    if a.attention:
        a.kvs = [t.strip() for t in a.cache_types.split(",")]
        if bad := [t for t in a.kvs if t not in KV_TYPES]:
            raise BadFlagError(f"--cache-types: {bad[0]} is not one of {', '.join(KV_TYPES)}")
        a.contexts = _positive("--attention", a.attention)
        if max(a.row_list) > min(a.contexts):
            raise BadFlagError(f"--rows: a window of {max(a.row_list)} rows does not fit a context of "
                               f"{min(a.contexts)}")
        return
    a.type_list = [t.strip().upper() for t in a.types.split(",") if t.strip()]
    if bad := [t for t in a.type_list if t not in {q.name for q in QUANT_TYPES}]:
        raise BadFlagError(f"--types: {bad[0]} is not one of {', '.join(q.name for q in QUANT_TYPES)}")


def points(a) -> list[dict]:
    if a.attention:
        return [{"context": n, "kv": kv} for n in a.contexts for kv in a.kvs]
    return [{"type": t, "n": n, "k": -(-k // ref_quant.BLOCK[Q[t]][0]) * ref_quant.BLOCK[Q[t]][0]}
            for t in a.type_list for n, k in SHAPES]


def _matmul(a, pt) -> Run:
    rng, qt, n, k = np.random.default_rng(0), Q[pt["type"]], pt["n"], pt["k"]
    w = kq.pack(qt, ref_quant.random_raw(qt, n, k, rng), n, k)
    g = {}
    for T in a.row_list:
        x, out = rng.standard_normal((T, k)).astype(np.float32), np.empty((T, n), np.float32)
        g[T] = n * k / R.median_seconds(lambda x=x, out=out: kq.matmul(w, x, out), a.seconds) / 1e9
    return Run({"gweights_s": g})


def _attention(a, pt) -> Run:
    """One layer's attention over a cache of n random positions, for a window of T rows at its end."""
    rng, (H, Hkv, hd), n = np.random.default_rng(0), ATT_HEADS, pt["context"]
    cache = KVCache(1, Hkv, hd, n, KVTypes(pt["kv"], pt["kv"]))
    for p0 in range(0, n, 1024):  # written a chunk at a time, as a prefill does
        m = min(1024, n - p0)
        cache.begin(m)
        cache.write(0, *rng.standard_normal((2, m, Hkv, hd)).astype(np.float32))
        cache.commit(m)
    kc, vc = cache.kv_layer(0)
    ms = {}
    for T in a.row_list:
        q = rng.standard_normal((T, H, hd)).astype(np.float32)
        args = (q, kc, vc, n - T, np.float32(hd**-0.5), np.empty_like(q), np.empty((T * H, n), np.float32))
        ms[T] = R.median_seconds(lambda args=args: ops.attention_kv(*args), a.seconds) * 1e3
    return Run({"window_ms": ms, "window_ratio": {T: v / ms[a.row_list[0]] for T, v in ms.items()}})


def runners(a) -> list[Runner]:
    def measure(pt):
        numba.set_num_threads(a.threads)
        kq.set_default_numerics(a.numerics)
        return _attention(a, pt) if a.attention else _matmul(a, pt)

    return [Runner("guild", measure)]
