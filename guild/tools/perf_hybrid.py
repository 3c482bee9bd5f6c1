"""Benchmark of the hybrid Gated-DeltaNet path (`python -m guild.tools.perf_hybrid`).

Builds a tiny-but-not-trivial random qwen35moe in a temp dir (8 layers "RRRA RRRA", dim 512, 64 experts top-8 +
a shared expert, DeltaNet 4 key / 8 value heads of 64, Q8_0) and reports:
  1. window time V(T), T = 1..8 (forward + commit of all rows), and the share spent in the recurrence kernel;
  2. the rollback overhead of a T = 5 window under both strategies: "replay" (commit reruns `keep` rows of the
     recurrence from the committed state) and "snapshot" (the window writes S after every row), against V(5);
  3. plain vs lookup decoding (SuffixDrafter) on a copy workload, with the time spent in commit (rollback
     included), for both strategies, and token parity.
Medians over repeats; the machine is shared, so read ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from ..calib.timing import median
from ..engine import state as state_mod
from ..engine.session import GuildSession
from ..engine.timing import time_windows
from ..kernels.cpu import deltanet as gdn
from ..models import load_model
from ..speculative.lookup import SuffixDrafter
from .tiny_hybrid import write_tiny_hybrid

BENCH_MODEL = dict(
    arch="qwen35moe", n_layers=8, full_attention_interval=4, dim=512, n_heads=8, n_kv_heads=2, head_dim=64,
    ffn=1024, n_experts=64, top_k=8, expert_ffn=128, shared_ffn=128, ssm_k_heads=4, ssm_v_heads=8,
    ssm_head_dim=64, vocab=512, context=2048, seed=11,
)


def build(dirpath: Path, qtype: str, copy_bias: float = 0.0) -> str:

    name = f"bench-{qtype}{'-copy' if copy_bias else ''}.gguf"
    return str(write_tiny_hybrid(dirpath / name, qtype=qtype, copy_bias=copy_bias, **BENCH_MODEL))


def window_costs(model, reps: int, rng) -> dict:
    """V(T) (forward + commit(T)), recurrence share, and the T = 5 rollback overhead of both strategies."""

    out: dict = {"rollback": model.rollback, "V_ms": {}, "recurrence_ms": {}, "recurrence_share": {}}
    vocab = model.args.vocab_size
    st = model.new_state(BENCH_MODEL["context"])  # the default rollback (snapshot)
    model.forward(rng.integers(0, vocab, 32), st)
    st.commit(32)
    Ts = range(1, 9)
    times = time_windows(model, st, lambda r, T: rng.integers(0, vocab, T), Ts, reps, warmup=2,
                         keep=lambda T: T, clock=True)
    for T in Ts:
        v, r = median(times.window_ms(T)), median(times.kernel("gdn_recurrence", T))
        out["V_ms"][T], out["recurrence_ms"][T] = round(v, 3), round(r, 3)
        out["recurrence_share"][T] = round(r / v, 4)

    # T = 5: forward and commit(keep) timed apart, per strategy; each keep on a fresh window at the same position
    T = 5
    ov: dict = {}
    for mode in ("replay", "snapshot"):
        fwd, rec_t, commit = [], [], {k: [] for k in range(1, T + 1)}
        for _ in range(reps):
            for keep in range(1, T + 1):
                st = model.new_state(256, rollback=mode)
                model.forward(rng.integers(0, vocab, 16), st)
                st.commit(16)
                w = time_windows(model, st, lambda r, T: rng.integers(0, vocab, T), [T], 1,
                                 keep=lambda T, keep=keep: keep, clock=True)
                fwd += w.forward_ms[T]
                rec_t += w.kernel("gdn_recurrence", T)
                commit[keep] += w.commit_ms[T]
        ov[mode] = {
            "forward_ms": round(median(fwd), 3),
            "recurrence_ms": round(median(rec_t), 3),
            "commit_ms": {k: round(median(v), 4) for k, v in commit.items()},
        }
    v5 = out["V_ms"][T]
    rep, snap = ov["replay"], ov["snapshot"]
    # replay pays at commit, only when drafts are rejected (keep < T); snapshot pays in every window's recurrence
    replay_worst = max(rep["commit_ms"][k] for k in range(1, T)) - rep["commit_ms"][T]
    snap_extra = snap["recurrence_ms"] - rep["recurrence_ms"]
    ov["V5_ms"] = v5
    ov["replay_overhead_worst_ms"] = round(replay_worst, 4)
    ov["replay_overhead_worst_pct_of_V5"] = round(100 * replay_worst / v5, 2)
    ov["snapshot_overhead_ms"] = round(snap_extra, 4)
    ov["snapshot_overhead_pct_of_V5"] = round(100 * snap_extra / v5, 2)
    out["rollback_T5"] = ov
    return out


def real_size_rollback(reps: int, T: int = 5, layers: int = 30, Hv: int = 32, Hk: int = 16, d: int = 128) -> dict:
    """The recurrence alone at Qwen3.5-35B-A3B's size (30 DeltaNet layers, 32 value heads of 128 x 128): a T-row
    window written as snapshots vs in place, and the replay of `keep` rows that the in-place layout pays."""

    rng = np.random.default_rng(1)
    q = rng.standard_normal((T, Hk, d)).astype(np.float32)
    k = rng.standard_normal((T, Hk, d)).astype(np.float32)
    gdn.l2norm_heads(q, 1e-6)
    gdn.l2norm_heads(k, 1e-6)
    v = rng.standard_normal((T, Hv, d)).astype(np.float32)
    g = -rng.uniform(0.05, 0.5, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0.2, 0.8, (T, Hv)).astype(np.float32)
    kmap = np.arange(Hv) % Hk
    sc = np.float32(d**-0.5)
    out = np.empty((T, Hv, d), np.float32)
    no_out = np.zeros((0, 1, 1), np.float32)
    pools = {"replay": np.zeros((layers, 2, Hv, d, d), np.float32),
             "snapshot": np.zeros((layers, T + 1, Hv, d, d), np.float32)}
    dsts = {"replay": np.ones(T, np.int64), "snapshot": np.arange(1, T + 1, dtype=np.int64)}

    def timed(f) -> float:
        f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return median(ts) * 1e3

    res: dict = {"layers": layers, "state": [Hv, d, d], "T": T}
    for mode in ("replay", "snapshot"):
        pool, dst = pools[mode], dsts[mode]
        res[f"window_{mode}_ms"] = round(timed(lambda pool=pool, dst=dst: [
            gdn.gdn_recurrence(q, k, v, g, beta, kmap, sc, pool[i], 0, dst, out) for i in range(layers)]), 3)
    pool = pools["replay"]
    res["replay_commit_ms"] = {keep: round(timed(lambda keep=keep: [
        gdn.gdn_recurrence(q[:keep], k[:keep], v[:keep], g[:keep], beta[:keep], kmap, sc, pool[i], 0,
                           np.ones(keep, np.int64), no_out) for i in range(layers)]), 3) for keep in range(1, T)}
    del pools
    return res


def copy_workload(model, n_tokens: int, max_draft: int, reps: int, edit_every: int = 12) -> dict:
    """Plain vs lookup on a copy workload: the prompt holds (an edited copy of) the model's own answer to the
    question it ends with."""

    question = [int(t) for t in np.random.default_rng(5).integers(0, 256, 24)]

    def run(prompt, drafter, mode):
        s = GuildSession(model, n_ctx=len(prompt) + n_tokens + 16)
        s.state = model.new_state(s.n_ctx, rollback=mode)
        spent = [0.0]
        commit = state_mod.HybridState.commit

        def timed(self, keep):
            t = time.perf_counter()
            commit(self, keep)
            spent[0] += time.perf_counter() - t

        state_mod.HybridState.commit = timed
        try:
            toks, st = s.generate(prompt, n_tokens, drafter=drafter, max_draft=max_draft)
        finally:
            state_mod.HybridState.commit = commit
        return toks, st, spent[0]

    answer, _, _ = run(question, None, "replay")
    # the document to copy is the model's own answer with every `edit_every`-th token changed: lookup drafts
    # run into each edit (a rejection, rolled back) and pick up again three tokens later
    doc = [(t + 1) % model.args.vocab_size if i % edit_every == edit_every - 1 else t for i, t in enumerate(answer)]
    prompt = question + doc + question
    res: dict = {"prompt_tokens": len(prompt), "generated": n_tokens, "max_draft": max_draft,
                 "edit_every": edit_every}
    plain_toks = None
    for mode in ("replay", "snapshot"):
        for strategy in ("plain", "lookup"):
            tps, commit_ms, summ, toks = [], [], None, None
            for _ in range(reps):
                drafter = SuffixDrafter() if strategy == "lookup" else None
                toks, st, spent = run(prompt, drafter, mode)
                tps.append(st.decode_tok_s)
                commit_ms.append(spent * 1e3)
                summ = st.summary()
            if plain_toks is None:
                plain_toks = toks
            res[f"{strategy}/{mode}"] = {
                "tok_s": round(median(tps), 2),
                "commit_ms_total": round(median(commit_ms), 3),
                "windows": summ["windows"], "tokens_per_window": summ["tokens_per_window"],
                "acceptance": summ["acceptance"], "parity": toks == plain_toks,
            }
    for mode in ("replay", "snapshot"):
        res[f"lookup_vs_plain/{mode}"] = round(res[f"lookup/{mode}"]["tok_s"] / res[f"plain/{mode}"]["tok_s"], 3)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.perf_hybrid", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--qtype", default="Q8_0")
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per copy-workload run")
    ap.add_argument("--max-draft", type=int, default=4)
    ap.add_argument("--copy-bias", type=float, default=5.0, help="see guild.tools.tiny_hybrid.write_tiny_hybrid")
    ap.add_argument("--edit-every", type=int, default=12, help="copy workload: every n-th token of the copy edited")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if 32 + (a.reps + 2) * 36 > BENCH_MODEL["context"]:  # the V(T) windows all advance one state
        ap.error(f"--reps {a.reps}: at most {(BENCH_MODEL['context'] - 32) // 36 - 2}")



    numba.set_num_threads(a.threads)
    report: dict = {"model": dict(BENCH_MODEL, qtype=a.qtype), "threads": a.threads}
    with tempfile.TemporaryDirectory(prefix="guild-perf-hybrid-") as d:
        t = time.perf_counter()
        model = load_model(build(Path(d), a.qtype))
        report["layer_pattern"] = model.layer_pattern
        print(f"model {model.layer_pattern} built+loaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        rng = np.random.default_rng(0)
        window_costs(model, 2, rng)  # warm-up: compile every kernel variant
        report["window"] = window_costs(model, a.reps, rng)
        del model
        report["real_size_rollback"] = real_size_rollback(max(3, a.reps // 2))
        copy_model = load_model(build(Path(d), a.qtype, a.copy_bias))
        copy_workload(copy_model, 8, a.max_draft, 1, a.edit_every)  # warm-up
        report["copy_workload"] = copy_workload(copy_model, a.tokens, a.max_draft, max(3, a.reps // 3), a.edit_every)
    _print(report)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    return 0


def _print(r: dict) -> None:
    w = r["window"]
    print(f"hybrid qwen35moe {r['layer_pattern']}, {r['model']['qtype']}, {r['threads']} threads")
    print(f"window = forward + commit(T), rollback={w['rollback']}")
    print("T          " + " ".join(f"{t:>7}" for t in range(1, 9)))
    print("V(T) ms    " + " ".join(f"{w['V_ms'][t]:7.2f}" for t in range(1, 9)))
    print("V(T)/V(1)  " + " ".join(f"{w['V_ms'][t] / w['V_ms'][1]:7.2f}" for t in range(1, 9)))
    print("recur. ms  " + " ".join(f"{w['recurrence_ms'][t]:7.3f}" for t in range(1, 9)))
    print("recur. %   " + " ".join(f"{100 * w['recurrence_share'][t]:7.2f}" for t in range(1, 9)))
    o = w["rollback_T5"]
    print(f"T=5 rollback, V(5) = {o['V5_ms']:.2f} ms:")
    for mode in ("replay", "snapshot"):
        m = o[mode]
        c = " ".join(f"{k}:{v:.3f}" for k, v in m["commit_ms"].items())
        print(f"  {mode:8}  forward {m['forward_ms']:.2f} ms, recurrence {m['recurrence_ms']:.3f} ms, "
              f"commit(keep) ms {c}")
    print(f"  replay overhead (worst keep < 5): {o['replay_overhead_worst_ms']:.3f} ms = "
          f"{o['replay_overhead_worst_pct_of_V5']:.2f}% of V(5)")
    print(f"  snapshot overhead (every window): {o['snapshot_overhead_ms']:.3f} ms = "
          f"{o['snapshot_overhead_pct_of_V5']:.2f}% of V(5)")
    z = r["real_size_rollback"]
    print(f"recurrence alone at Qwen3.5-35B-A3B size ({z['layers']} layers of {'x'.join(map(str, z['state']))}), "
          f"T={z['T']}: window {z['window_replay_ms']:.2f} ms in place, {z['window_snapshot_ms']:.2f} ms with "
          f"snapshots; replaying keep rows at commit: "
          + ", ".join(f"{k}: {v:.2f} ms" for k, v in z["replay_commit_ms"].items()))
    c = r["copy_workload"]
    print(f"copy workload: prompt {c['prompt_tokens']} tokens (every {c['edit_every']}th of the copy edited), "
          f"{c['generated']} generated, k <= {c['max_draft']}")
    for key in ("plain/replay", "lookup/replay", "plain/snapshot", "lookup/snapshot"):
        x = c[key]
        print(f"  {key:16} {x['tok_s']:7.2f} tok/s  commit {x['commit_ms_total']:7.2f} ms  windows {x['windows']:3}"
              f"  tokens/window {x['tokens_per_window']}  acceptance {x['acceptance']}  parity {x['parity']}")
    print(f"  lookup/plain: replay {c['lookup_vs_plain/replay']}x, snapshot {c['lookup_vs_plain/snapshot']}x")


if __name__ == "__main__":
    sys.exit(main())
