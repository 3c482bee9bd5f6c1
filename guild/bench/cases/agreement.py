"""The upcycled MoE beside its dense source: greedy top-1 agreement, the dense model's greedy continuation of a
few chat prompts fed to both (teacher forcing) and their argmax compared at every generated position.

    python -m guild.bench agreement -n 64
"""

from __future__ import annotations

import numpy as np

from ...engine.session import GuildSession
from ...upcycle import embedded_dense_path, ensure_embedded_moe
from ..harness import Run, Runner
from .models import loaded

ROUNDS = 1
PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "List three uses of a paperclip.",
)


def add_args(ap) -> None:
    ap.add_argument("-n", "--tokens", type=int, default=64, help="greedy tokens per prompt (default: %(default)s)")


def check(a) -> None:
    a.dense, a.moe = str(embedded_dense_path()), str(ensure_embedded_moe())


def points(a) -> list[dict]:
    return [{"model": "smollm2-135m-moe", "against": "smollm2-135m"}]


def runners(a) -> list[Runner]:
    def measure(pt):
        dense, moe = loaded(a.dense, a.threads), loaded(a.moe, a.threads).model
        agree = total = 0
        for p in PROMPTS:
            tok = dense.tokenizer
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special=True)
            gen, _ = GuildSession(dense.model, n_ctx=len(ids) + a.tokens + 8).generate(ids, a.tokens)
            seq = np.array(ids + gen[:-1], np.int64)
            pred = moe.forward(seq, GuildSession(moe, n_ctx=len(seq) + 8).state)[len(ids) - 1:].argmax(1)
            agree += int(np.sum(pred == np.array(gen)))
            total += len(gen)
        return Run({"agreement": agree / total})

    return [Runner("guild", measure)]
