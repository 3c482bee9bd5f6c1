"""What the hybrid case (cases/hybrid.py) times on the Gated-DeltaNet path, per rollback ("replay": a commit
reruns the kept rows of the recurrence from the committed state; "snapshot": a window writes the state after
every row): a model's windows and commits, the recurrence alone at a real model's size, and one reply with the
time its commits took."""

from __future__ import annotations

import time

import numpy as np

from ..engine import state as state_mod
from ..engine.session import GuildSession
from ..engine.timing import time_windows
from ..kernels.cpu import deltanet as gdn
from .runners import median_seconds

MAX_T = 8
KEEP_T = 5  # the window whose commit(keep) is timed
ROLLBACKS = ("replay", "snapshot")


def windows(m, mode: str, repeats: int, ctx: int) -> dict:
    """V(T) (forward + commit of all T rows) and V(T)/V(1), T = 1..MAX_T, the recurrence kernel's share of it, and
    commit(keep) of a KEEP_T-row window for each keep, each keep from the same position on a fresh state."""
    rng, vocab = np.random.default_rng(0), m.args.vocab_size
    st = m.new_state(ctx, rollback=mode)
    m.forward(rng.integers(0, vocab, 32), st)
    st.commit(32)
    Ts = range(1, MAX_T + 1)
    t = time_windows(m, st, lambda r, T: rng.integers(0, vocab, T), Ts, repeats, warmup=2, keep=lambda T: T,
                     clock=True)
    vt = {T: float(np.median(t.window_ms(T))) for T in Ts}
    share = {T: float(np.median(np.divide(t.kernel("gdn_recurrence", T), t.window_ms(T)))) for T in Ts}
    commit = {}
    for keep in range(1, KEEP_T + 1):
        st = m.new_state(16 + (repeats + 1) * KEEP_T, rollback=mode)
        m.forward(rng.integers(0, vocab, 16), st)
        st.commit(16)
        w = time_windows(m, st, lambda r, T: rng.integers(0, vocab, T), [KEEP_T], repeats, warmup=1,
                         keep=lambda T, keep=keep: keep)
        commit[keep] = float(np.median(w.commit_ms[KEEP_T]))
    return {"window_ms": vt, "window_ratio": {T: v / vt[1] for T, v in vt.items()}, "recurrence_share": share,
            "commit_ms": commit}


def recurrence(mode: str, repeats: int, layers: int = 30, Hv: int = 32, Hk: int = 16, d: int = 128) -> dict:
    """The recurrence alone (default: Qwen3.5-35B-A3B's 30 DeltaNet layers of 32 value heads of 128 x 128): ms of
    a KEEP_T-row window in `mode`'s layout and, for replay, the replay of keep rows its commit pays, keep < KEEP_T."""
    rng, T = np.random.default_rng(1), KEEP_T
    q, k = rng.standard_normal((2, T, Hk, d)).astype(np.float32)
    gdn.l2norm_heads(q, 1e-6)
    gdn.l2norm_heads(k, 1e-6)
    v = rng.standard_normal((T, Hv, d)).astype(np.float32)
    g = -rng.uniform(0.05, 0.5, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0.2, 0.8, (T, Hv)).astype(np.float32)
    kmap, sc = np.arange(Hv) % Hk, np.float32(d**-0.5)
    pool = np.zeros((layers, 2 if mode == "replay" else T + 1, Hv, d, d), np.float32)

    def ms(n: int, dst, out) -> float:  # n rows through every layer
        return median_seconds(lambda: [gdn.gdn_recurrence(q[:n], k[:n], v[:n], g[:n], beta[:n], kmap, sc, pool[i],
                                                          0, dst, out) for i in range(layers)], 0, repeats) * 1e3

    dst = np.ones(T, np.int64) if mode == "replay" else np.arange(1, T + 1, dtype=np.int64)
    figs: dict = {"recurrence_ms": ms(T, dst, np.empty((T, Hv, d), np.float32))}
    if mode == "replay":  # the in-place layout's price, paid only when drafts are rejected
        figs["commit_ms"] = {n: ms(n, np.ones(n, np.int64), np.zeros((0, 1, 1), np.float32)) for n in range(1, T)}
    return figs


def reply(m, prompt: list[int], n: int, mode: str, drafter=None, max_draft: int = 4):
    """(tokens, SessionStats, ms spent in the state's commits) of one greedy reply on a fresh session."""
    s = GuildSession(m, n_ctx=len(prompt) + n + 16)
    s.state = m.new_state(s.n_ctx, rollback=mode)
    spent = [0.0]
    commit = state_mod.HybridState.commit

    def timed(self, keep):
        t = time.perf_counter()
        commit(self, keep)
        spent[0] += time.perf_counter() - t

    state_mod.HybridState.commit = timed  # the commit of every window, rollbacks included
    try:
        toks, st = s.generate(prompt, n, drafter=drafter, max_draft=max_draft)
    finally:
        state_mod.HybridState.commit = commit
    return [int(t) for t in toks], st, spent[0] * 1e3


def copy_prompt(m, n: int, edit_every: int) -> list[int]:
    """A question, the model's own answer to it with every edit_every-th token changed (lookup's drafts run into
    each edit, a rejection rolled back, and pick up again after it), the question again."""
    question = [int(t) for t in np.random.default_rng(5).integers(0, 256, 24)]
    answer = reply(m, question, n, "replay")[0]
    doc = [(t + 1) % m.args.vocab_size if i % edit_every == edit_every - 1 else t for i, t in enumerate(answer)]
    return question + doc + question
