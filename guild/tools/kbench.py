"""Micro-benchmark of the quantized CPU matrix kernels: G weights/s (N*K / seconds per matmul call).

    python -m guild.tools.kbench [--types Q4_1,Q8_0] [--threads 1,2] [--rows 1,2,4,8] [--seconds 0.3]
    python -m guild.tools.kbench --attention 4096,32768 [--cache-types f32,f16,q8_0] [--threads 2] [--rows 1,4]

`--attention` times one layer's attention instead (SmolLM2-135M's heads: 9 query and 3 KV heads of 64) for a
window of T rows ending a populated context of that many positions, per KV cache type: V(T) in ms and V(T)/V(1).

Shapes are those of SmolLM2-135M (N x K = output x input features): attention 576x576, FFN gate/up 1536x576,
FFN down 576x1536, output head 49152x576. Types whose block (256 for K-quants, IQ4_XS) does not divide
K = 576 are measured at K = 768 instead (marked *). Weights are random blocks with sane scales; each figure is
the median over repeated calls (one warm-up call first). The machine is shared: read medians and ratios.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from gguf import GGMLQuantizationType as Q

from ..kernels import ref_quant
from ..kernels.blocks import QUANT_TYPES
from ..kernels.cpu import quant as kq
from ..kvtypes import KV_TYPES

SHAPES = ((576, 576), (1536, 576), (576, 1536), (49152, 576))
ATT_HEADS = (9, 3, 64)  # query heads, KV heads, head_dim
TYPES = tuple(q.name for q in QUANT_TYPES)


def _median_seconds(fn, budget: float, min_reps: int = 5, max_reps: int = 2000) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    reps = int(min(max(min_reps, budget / once), max_reps))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def run(types, threads, rows, seconds: float) -> list[dict]:
    rng = np.random.default_rng(0)
    results = []
    max_threads = numba.config.NUMBA_NUM_THREADS
    threads = [t for t in threads if t <= max_threads]
    before = numba.get_num_threads()
    cols = [(nt, T) for nt in threads for T in rows]
    warm = kq.pack(Q.Q8_0, ref_quant.random_raw(Q.Q8_0, 64, 64, rng), 64, 64)
    kq.matmul(warm, np.zeros((1, 64), np.float32), np.empty((1, 64), np.float32))  # starts the thread pool
    print(
        f"G weights/s (N*K / median seconds per matmul call), Numba threading layer {numba.threading_layer()}, "
        f"{max_threads} threads available"
    )
    head = f"{'type':7s} {'N x K':>12s} " + " ".join(f"{'T' + str(T) + '/' + str(nt) + 'th':>8s}" for nt, T in cols)
    print(head)
    print("-" * len(head))
    try:
        for name in types:
            qt = Q[name]
            block = ref_quant.BLOCK[qt][0]
            for n, k in SHAPES:
                kk = k if k % block == 0 else -(-k // block) * block
                raw = ref_quant.random_raw(qt, n, kk, rng)
                w = kq.pack(qt, raw, n, kk)
                vals = []
                for nt, T in cols:
                    numba.set_num_threads(nt)
                    x = rng.standard_normal((T, kk)).astype(np.float32)
                    out = np.empty((T, n), np.float32)
                    sec = _median_seconds(lambda w=w, x=x, out=out: kq.matmul(w, x, out), seconds)
                    g = n * kk / sec / 1e9
                    vals.append(g)
                    results.append(
                        {"type": name, "n": n, "k": kk, "threads": nt, "rows": T, "gw_s": g, "ms": sec * 1e3}
                    )
                label = f"{n}x{kk}" + ("*" if kk != k else "")
                print(f"{name:7s} {label:>12s} " + " ".join(f"{v:8.2f}" for v in vals), flush=True)
    finally:
        numba.set_num_threads(before)
    return results


def attention_run(contexts, kv_names, threads, rows, seconds: float) -> list[dict]:
    """One layer's attention over a cache of n random positions, for a window of T rows at its end."""
    from ..engine.state import KVCache
    from ..kernels.cpu import ops
    from ..kvtypes import KVTypes

    rng = np.random.default_rng(0)
    H, Hkv, hd = ATT_HEADS
    results = []
    before = numba.get_num_threads()
    threads = [t for t in threads if t <= numba.config.NUMBA_NUM_THREADS]
    print(f"ms per layer's attention ({H} heads over {Hkv} KV heads of {hd}), median; over the first T's in brackets")
    try:
        for n in contexts:
            for kv in kv_names:
                cache = KVCache(1, Hkv, hd, n, KVTypes(kv, kv))
                for p0 in range(0, n, 1024):  # written a chunk at a time, as a prefill does
                    m = min(1024, n - p0)
                    cache.begin(m)
                    cache.write(0, *rng.standard_normal((2, m, Hkv, hd)).astype(np.float32))
                    cache.commit(m)
                kc, vc = cache.kv_layer(0)
                for nt in threads:
                    numba.set_num_threads(nt)
                    line, base = [], None
                    for T in rows:
                        q = rng.standard_normal((T, H, hd)).astype(np.float32)
                        out, scores = np.empty_like(q), np.empty((T * H, n), np.float32)
                        args = (q, kc, vc, n - T, np.float32(hd**-0.5), out, scores)
                        sec = _median_seconds(lambda args=args: ops.attention_kv(*args), seconds)
                        base = base or sec
                        line.append(f"T{T} {sec * 1e3:7.2f} ({sec / base:4.2f})")
                        results.append({"context": n, "kv": kv, "threads": nt, "rows": T, "ms": sec * 1e3})
                    print(f"{n:6d} {kv:5s} {nt}th  " + "  ".join(line), flush=True)
    finally:
        numba.set_num_threads(before)
    return results


def _positive(ap, flag: str, text: str) -> list[int]:
    """A comma-separated list of positive integers, or argparse's one-line usage error naming the flag."""
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        ap.error(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return vals


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.kbench", description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated quant types")
    ap.add_argument("--threads", default="1,2", help="comma-separated Numba thread counts")
    ap.add_argument("--rows", default="1,2,4,8", help="comma-separated window sizes T")
    ap.add_argument("--seconds", type=float, default=0.3, help="time budget per figure")
    ap.add_argument("--numerics", choices=kq.NUMERICS, default="i8", help="numeric mode the matrices are packed for")
    ap.add_argument("--attention", metavar="CONTEXTS", help="comma-separated populated contexts: time attention")
    ap.add_argument("--cache-types", default=",".join(KV_TYPES), help="KV cache types for --attention")
    a = ap.parse_args(argv)
    if a.attention:
        kvs = [t.strip() for t in a.cache_types.split(",")]
        if bad := [t for t in kvs if t not in KV_TYPES]:
            ap.error(f"--cache-types: {bad[0]} is not one of {', '.join(KV_TYPES)}")
        contexts, threads, rows = (_positive(ap, flag, text) for flag, text in
                                   (("--attention", a.attention), ("--threads", a.threads), ("--rows", a.rows)))
        if max(rows) > min(contexts):
            ap.error(f"--rows: a window of {max(rows)} rows does not fit a context of {min(contexts)}")
        attention_run(contexts, kvs, threads, rows, a.seconds)
        return
    kq.set_default_numerics(a.numerics)
    run(
        [t.strip().upper() for t in a.types.split(",") if t.strip()],
        [int(t) for t in a.threads.split(",")],
        [int(t) for t in a.rows.split(",")],
        a.seconds,
    )


if __name__ == "__main__":
    main()
