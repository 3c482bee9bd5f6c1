"""guild against llama.cpp on files made by llama.cpp's own quantizer: the same greedy tokens and logits.

The embedded dense model (SmolLM2-135M-Instruct, Q4_1) is requantised by llama.cpp into each --types (mixtures:
Q3_K_M holds Q3_K, Q4_K, Q5_K, Q6_K...); on each, both engines decode greedily from the same prompt ids and score
prompt + guild's greedy tokens, teacher-forced. "guild vs llama.cpp" (its KV cache in float32, as guild's): the
share of the same greedy tokens, top-1 agreement, largest absolute and relative RMS logit difference. "llama.cpp
f16 KV vs f32 KV": how far llama.cpp's default f16 KV rounding moves this model's logits (its top-1 margins are
thin): the floor under any agreement figure. Without llama-cpp-python it says so and exits 0.

    python -m guild.bench quant --types Q2_K,Q4_K_M -t 2
"""

from __future__ import annotations

from functools import cache
from itertools import islice

import numpy as np

from ...engine.session import GuildSession
from ...errors import BadFlagError
from ...formats.repack_cache import cache_root
from ...load import load
from ...upcycle import embedded_dense_path
from .. import runners as R
from ..harness import Run, Runner

THREADS = 2
ROUNDS = 1  # both engines are deterministic here: another round repeats the same logits
# llama.cpp file types that need no importance matrix (IQ2_* and IQ1_* do)
FTYPES = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS", "IQ4_NL", "IQ3_XXS", "IQ3_S", "Q5_1", "Q8_0")
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.")
GGML_F32, GGML_F16 = 0, 1  # llama.cpp's type_k / type_v


def add_args(ap) -> None:
    ap.add_argument("--types", default=",".join(FTYPES), help="llama.cpp file types (default: %(default)s)")
    ap.add_argument("-n", "--tokens", type=int, default=32, help="greedy tokens per prompt (default: %(default)s)")


def check(a) -> None:
    a.type_list = [t.strip().upper() for t in a.types.split(",") if t.strip()]
    if a.tokens < 2 or not a.type_list:
        raise BadFlagError("--tokens must be >= 2 and --types name at least one file type")
    a.llama = R.llama_cpp_module()
    if a.llama is not None and (bad := [t for t in a.type_list if not hasattr(a.llama, f"LLAMA_FTYPE_MOSTLY_{t}")]):
        raise BadFlagError(f"--types: {bad[0]} is not a llama.cpp file type (LLAMA_FTYPE_MOSTLY_*)")


def points(a) -> list[dict]:
    return [{"type": t} for t in a.type_list]


def logit_stats(a: np.ndarray, b: np.ndarray) -> dict:
    """How close two [n, vocab] logit arrays are: top-1 agreement, max |a-b|, RMS(a-b)/RMS(b)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"logits {a.shape} vs {b.shape}")
    d = a - b
    return {"agreement": float(np.mean(a.argmax(1) == b.argmax(1))), "max_abs": float(np.abs(d).max()),
            "rel_rms": float(np.sqrt(np.mean(d * d) / np.mean(b * b)))}


def compare(runs: list[dict], ref: list[dict]) -> dict:
    """runs against ref: the share of the same greedy tokens over all prompts and the pooled logit statistics."""
    same = sum(sum(int(x == y) for x, y in zip(g["tokens"], r["tokens"], strict=False))
               for g, r in zip(runs, ref, strict=True))
    return {"same_tokens": same / sum(len(g["tokens"]) for g in runs),
            **logit_stats(np.concatenate([g["logits"] for g in runs]), np.concatenate([r["logits"] for r in ref]))}


@cache
def guild_side(path: str, prompts: tuple[str, ...], n: int) -> list[dict]:
    """Per prompt: guild's prompt ids, greedy tokens, and the logits of every position of prompt + tokens."""
    lm = load(path, progress=False)
    out = []
    for p in prompts:
        ids = lm.tokenizer.encode(p, add_special=True)
        toks, _ = GuildSession(lm.model, n_ctx=len(ids) + n + 8, eos_ids=()).generate(ids, n)
        seq = ids + list(toks[:-1])
        logits = lm.model.forward(np.array(seq, np.int64), GuildSession(lm.model, n_ctx=len(seq) + 8).state)
        out.append({"ids": ids, "tokens": [int(t) for t in toks], "seq": seq, "logits": logits})
    return out


@cache
def llama_side(path: str, n: int, threads: int, kv_type: int) -> list[dict]:
    """llama.cpp on guild's prompt ids: its greedy tokens, and its logits over guild's teacher-forced sequence, its
    KV cache in `kv_type`."""
    out = []
    for r in guild_side(path, PROMPTS, n):
        llm = R.open_llama_cpp(path, n_ctx=len(r["seq"]) + n + 8, n_threads=threads, logits_all=True,
                               type_k=kv_type, type_v=kv_type)
        toks = [int(t) for t in islice(llm.generate(r["ids"], temp=0.0, top_k=1, repeat_penalty=1.0, reset=True), n)]
        llm.reset()
        llm.eval(r["seq"])
        out.append({"tokens": toks, "logits": np.array(llm.scores[: len(r["seq"])], np.float32)})
        del llm
    return out


def runners(a) -> list[Runner]:
    def file(pt) -> str:
        src, t = embedded_dense_path(), pt["type"]
        return str(R.quantize(a.llama, src, cache_root() / "quants" / f"{src.stem}.{t}.gguf", t, a.threads))

    def vs_guild(pt):
        p = file(pt)
        return Run(compare(guild_side(p, PROMPTS, a.tokens), llama_side(p, a.tokens, a.threads, GGML_F32)))

    def floor(pt):
        p = file(pt)
        return Run(compare(*(llama_side(p, a.tokens, a.threads, kv) for kv in (GGML_F16, GGML_F32))))

    return [] if a.llama is None else [Runner("guild vs llama.cpp", vs_guild), Runner("llama.cpp f16 KV vs f32 KV",
                                                                                      floor)]


def notes(records, a) -> list[str]:
    return ["\nllama.cpp: not measured (llama-cpp-python is not importable here)"] if a.llama is None else []
