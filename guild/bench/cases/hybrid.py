"""The hybrid Gated-DeltaNet path under both rollbacks: "replay" (a commit reruns `keep` rows of the recurrence
from the committed state) and "snapshot" (a window writes the state after every row).

On a random qwen35moe built in a temp dir (8 layers "RRRA RRRA", dim 512, 64 experts top-8 + a shared expert,
DeltaNet 4 key / 8 value heads of 64, --qtype), per rollback: "window": V(T) and V(T)/V(1), T = 1..8, with the
recurrence kernel's share, and commit(keep) of a T = 5 window per keep; "recurrence 35B-A3B": the recurrence
alone at Qwen3.5-35B-A3B's size (30 layers of 32 value heads of 128 x 128), a 5-row window and (replay) the
replay of `keep` rows at commit; "plain" and "lookup" (SuffixDrafter, held to plain's tokens) on a copy
workload: the prompt holds the model's own answer with every --edit-every-th token changed, decode tok/s and
the commit's ms per reply (rollbacks included).

    python -m guild.bench hybrid -t 2 --rounds 3 [--repeats 9] [--qtype Q8_0]
"""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

from ...errors import BadFlagError
from ...models import load_model
from ...speculative.lookup import SuffixDrafter
from ...tools.tiny_hybrid import write_tiny_hybrid
from .. import deltanet as D
from ..harness import Run, Runner
from ..record import ratio

THREADS = 2
MODEL = dict(arch="qwen35moe", n_layers=8, full_attention_interval=4, dim=512, n_heads=8, n_kv_heads=2, head_dim=64,
             ffn=1024, n_experts=64, top_k=8, expert_ffn=128, shared_ffn=128, ssm_k_heads=4, ssm_v_heads=8,
             ssm_head_dim=64, vocab=512, context=2048, seed=11)


def add_args(ap) -> None:
    ap.add_argument("--repeats", type=int, default=9, help="windows per T within a round (default: %(default)s)")
    ap.add_argument("--qtype", default="Q8_0", help="the random model's weights (default: %(default)s)")
    ap.add_argument("-n", "--tokens", type=int, default=64, help="generated tokens per copy-workload reply")
    ap.add_argument("--max-draft", type=int, default=4, help="lookup's largest draft (default: %(default)s)")
    ap.add_argument("--copy-bias", type=float, default=5.0, help="see guild.tools.tiny_hybrid.write_tiny_hybrid")
    ap.add_argument("--edit-every", type=int, default=12, help="every n-th token of the copy edited")


def check(a) -> None:
    if not 1 <= a.repeats <= 48:  # V(T)'s windows all advance one state of MODEL's 2048 positions
        raise BadFlagError(f"--repeats must be in 1..48, got {a.repeats}")
    if a.tokens < 2 or a.max_draft < 1 or a.edit_every < 2:
        raise BadFlagError("--tokens and --edit-every must be >= 2, --max-draft >= 1")


def points(a) -> list[dict]:
    return [{"rollback": m} for m in D.ROLLBACKS]


@cache
def _tmp() -> tempfile.TemporaryDirectory:  # removed when the process exits
    return tempfile.TemporaryDirectory(prefix="guild-bench-hybrid-")


@cache
def model(qtype: str, copy_bias: float = 0.0):
    path = Path(_tmp().name) / f"{qtype}-{copy_bias}.gguf"
    return load_model(str(write_tiny_hybrid(path, qtype=qtype, copy_bias=copy_bias, **MODEL)))


@cache
def copy_prompt(qtype: str, copy_bias: float, n: int, edit_every: int) -> tuple[int, ...]:
    return tuple(D.copy_prompt(model(qtype, copy_bias), n, edit_every))


def runners(a) -> list[Runner]:
    def window(pt):
        return Run(D.windows(model(a.qtype), pt["rollback"], a.repeats, MODEL["context"]))

    def copy(lookup: bool):
        def measure(pt):
            m, prompt = model(a.qtype, a.copy_bias), list(copy_prompt(a.qtype, a.copy_bias, a.tokens, a.edit_every))
            toks, st, commit_ms = D.reply(m, prompt, a.tokens, pt["rollback"], SuffixDrafter() if lookup else None,
                                          a.max_draft)
            figs = {"decode_tok_s": st.decode_tok_s, "commit_ms": commit_ms,
                    "tokens_per_window": st.summary()["tokens_per_window"]}
            if lookup:
                figs["acceptance"] = st.summary()["acceptance"] or 0.0
            return Run(figs, toks)

        return measure

    return [Runner("window", window, warmup=lambda pt: D.windows(model(a.qtype), pt["rollback"], 1, MODEL["context"])),
            Runner("recurrence 35B-A3B", lambda pt: Run(D.recurrence(pt["rollback"], a.repeats))),
            Runner("plain", copy(False), reference=True, warmup=copy(False)),
            Runner("lookup", copy(True), exact=True, warmup=copy(True))]


def notes(records, a) -> list[str]:
    """lookup over plain; each rollback's price against V(5): replay's at the commit of a rejected draft (the worst
    keep < 5 over keeping all 5), snapshot's in every window (its recurrence over replay's)."""
    by, T = {(r.runner, r.point["rollback"]): r for r in records}, D.KEEP_T
    w = by[("window", "replay")]
    v5 = w.median("window_ms", T)
    rollback = max(w.median("commit_ms", k) for k in range(1, T)) - w.median("commit_ms", T)
    rec = {m: by[("window", m)].median("recurrence_share", T) * by[("window", m)].median("window_ms", T)
           for m in D.ROLLBACKS}
    extra = rec["snapshot"] - rec["replay"]
    return [*(f"\nlookup / plain, {m}: {ratio(by[('lookup', m)], by[('plain', m)], 'decode_tok_s'):.2f}×"
              for m in D.ROLLBACKS),
            f"\nagainst V(5) = {v5:.2f} ms: replay's rollback (worst keep < 5) {rollback:.3f} ms = "
            f"{100 * rollback / v5:.2f}%; snapshot's extra recurrence, every window: {extra:.3f} ms = "
            f"{100 * extra / v5:.2f}%"]
