"""Where a decode step's time goes: the share of a greedy step spent in Python outside the kernels and the
backend's ops, each op's ms per step (a decode row's layers are one call, "decode_layers"; llama.WHOLE_STEP off
splits it into halves), and the verifier's share of a T = 5 window (sampling with penalties on every row).

    python -m guild.bench step --models smollm2-135m-moe --rounds 3
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ...engine.sampling import SamplingParams
from ...engine.session import GuildSession
from ...engine.timing import time_windows
from ...engine.verify import Verifier
from ..harness import Run, Runner
from .models import add_model_args, chat_ids, loaded, model_paths

PENALISED = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1,
                           frequency_penalty=0.1, presence_penalty=0.1, seed=12345)


def add_args(ap) -> None:
    add_model_args(ap, default="smollm2-135m-moe")
    ap.add_argument("--steps", type=int, default=24, help="decode steps timed per round (default: %(default)s)")


def check(a) -> None:
    a.paths = model_paths(a)


def points(a) -> list[dict]:
    return [{"model": name} for name in a.paths]


def python_share(model, ids, steps: int) -> tuple[float, dict[str, float]]:
    """Greedy steps after a prefill of ids, every backend op on the clock: the share of a step's wall time outside
    the kernels and ops, and the median ms per step of each op."""
    s = GuildSession(model, n_ctx=len(ids) + steps + 8)
    nxt = [int(np.argmax(s.prefill(ids)))]

    def pick(out, window, T):
        nxt[0] = int(np.argmax(out.logits[-1]))

    t = time_windows(model, s.state, lambda r, T: nxt[:1], [1], steps, keep=lambda T: 1, after=pick, ops=True)
    names = sorted({n for k in t.kernel_ms[1] for n in k})
    return (1.0 - sum(t.kernels_total(1)) / sum(t.window_ms(1)),
            {n: statistics.median(t.kernel(n, 1)) for n in names})


def verifier_share(model, ids, T: int = 5, repeats: int = 9) -> float:
    """The verifier's share of a T-row window whose drafts are wrong from row 1, so every row is sampled."""
    s = GuildSession(model, n_ctx=len(ids) + 16)
    s.prefill(ids)
    ver, window, fwd, vt = Verifier(PENALISED), list(ids[-T:]), [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits = model.forward(window, s.state)
        t1 = time.perf_counter()
        ver.verify(logits, [window[0]] + [-1] * (T - 1), list(ids), s.state.pos, 100)
        vt.append(time.perf_counter() - t1)
        fwd.append(t1 - t0)
        s.state.commit(0)
    return statistics.median(vt) / (statistics.median(vt) + statistics.median(fwd))


def runners(a) -> list[Runner]:
    def measure(pt):
        p = a.paths[pt["model"]]
        model, ids = loaded(p, a.threads).model, list(chat_ids(p, a.threads))
        share, ops = python_share(model, ids, a.steps)
        return Run({"python_share": share, "op_ms": ops, "verifier_share": verifier_share(model, ids)})

    return [Runner("guild", measure, warmup=measure)]
