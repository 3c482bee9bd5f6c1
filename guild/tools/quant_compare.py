"""guild against llama.cpp on files made by llama.cpp's own quantizer (`make bench-full`).

The embedded dense model (SmolLM2-135M-Instruct, Q4_1) is requantised with `llama_cpp.llama_model_quantize`
into each of FTYPES (files that mix the types llama.cpp picks per tensor: Q3_K_M holds Q3_K, Q4_K, Q5_K, Q6_K...),
then on each file both engines decode greedily from the same prompts and score the same token sequence
(prompt + guild's greedy tokens, teacher-forced): same greedy tokens, top-1 agreement of the logits, their
largest absolute difference and relative RMS difference. llama.cpp keeps its KV cache in float32 here, as guild
does by default; beside each row, llama.cpp against itself with its default f16 KV cache: how far a rounding that
small moves this model's logits (its top-1 margins are thin), the floor under any agreement figure. Needs
`llama_cpp` (llama-cpp-python); without it the tool says so and exits 0. Results: results/quant_compare.md and
.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# llama.cpp file types that need no importance matrix (IQ2_* and IQ1_* do)
FTYPES = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS", "IQ4_NL", "IQ3_XXS", "IQ3_S", "Q5_1", "Q8_0")
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.")


def llama_cpp_module():
    """The `llama_cpp` module, or None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def quantize(llama_cpp, src: Path, out: Path, ftype: str, threads: int) -> Path:
    """`src` requantised by llama.cpp into `ftype` (a LLAMA_FTYPE_MOSTLY_* name) at `out`, unless made before."""
    if out.is_file():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    params.allow_requantize = True  # the source is itself quantised (Q4_1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({ftype}) returned {rc}")
    tmp.replace(out)
    return out


def logit_stats(a: np.ndarray, b: np.ndarray) -> dict:
    """How close two [n, vocab] logit arrays are: top-1 agreement, max |a-b|, RMS(a-b)/RMS(b)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"logits {a.shape} vs {b.shape}")
    d = a - b
    return {"rows": int(a.shape[0]), "top1_agree": float(np.mean(a.argmax(1) == b.argmax(1))),
            "max_abs": float(np.abs(d).max()), "rel_rms": float(np.sqrt(np.mean(d * d) / np.mean(b * b)))}


def guild_side(path: str, prompts, n: int) -> list[dict]:
    """Per prompt: guild's prompt ids, greedy tokens, and the logits of every position of prompt + tokens."""
    from ..engine.session import GuildSession
    from ..load import load

    lm = load(path, progress=False)
    out = []
    for p in prompts:
        ids = lm.tokenizer.encode(p, add_special=True)
        toks, _ = GuildSession(lm.model, n_ctx=len(ids) + n + 8, eos_ids=()).generate(ids, n)
        seq = ids + list(toks[:-1])
        s = GuildSession(lm.model, n_ctx=len(seq) + 8)
        logits = lm.model.forward(np.array(seq, np.int64), s.state)
        out.append({"ids": ids, "tokens": [int(t) for t in toks], "seq": seq, "logits": logits})
    return out


GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1


def llama_side(path: str, runs: list[dict], n: int, threads: int, kv_type: int = GGML_TYPE_F32) -> list[dict]:
    """llama.cpp on the same prompt ids: its greedy tokens, and its logits over guild's teacher-forced sequence;
    its KV cache in `kv_type` (a ggml type: float32 as guild's default, or llama.cpp's own default f16)."""
    from .perf import open_llama_cpp

    out = []
    for r in runs:
        llm = open_llama_cpp(path, n_ctx=len(r["seq"]) + n + 8, n_threads=threads, logits_all=True,
                             type_k=kv_type, type_v=kv_type)
        toks = []
        for t in llm.generate(r["ids"], temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            toks.append(int(t))
            if len(toks) == n:
                break
        llm.reset()
        llm.eval(r["seq"])
        out.append({"tokens": toks, "logits": np.array(llm.scores[: len(r["seq"])], np.float32)})
        del llm
    return out


def compare(guild_runs: list[dict], llama_runs: list[dict]) -> dict:
    """Same greedy tokens (count over all prompts) and the pooled logit statistics."""
    same = sum(sum(int(x == y) for x, y in zip(g["tokens"], ll["tokens"], strict=False))
               for g, ll in zip(guild_runs, llama_runs, strict=True))
    total = sum(len(g["tokens"]) for g in guild_runs)
    stats = logit_stats(np.concatenate([g["logits"] for g in guild_runs]),
                        np.concatenate([ll["logits"] for ll in llama_runs]))
    return {"same_tokens": same, "tokens": total, **stats}


def table(rows: dict) -> str:
    lines = ["| file | same greedy tokens | top-1 agreement | max abs logit diff | rel. RMS diff | llama.cpp f16 KV "
             "vs f32 KV: top-1, rel. RMS |", "|---" * 6 + "|"]
    for name, r in rows.items():
        f = r.get("llama_f16_kv")
        floor = "" if f is None else f"{f['top1_agree'] * 100:.1f}%, {f['rel_rms']:.3g}"
        lines.append(f"| {name} | {r['same_tokens']}/{r['tokens']} | {r['top1_agree'] * 100:.1f}% | "
                     f"{r['max_abs']:.3g} | {r['rel_rms']:.3g} | {floor} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m guild.tools.quant_compare", description=__doc__)
    ap.add_argument("--types", default=",".join(FTYPES), help="llama.cpp file types (LLAMA_FTYPE_MOSTLY_*)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="results")
    a = ap.parse_args(argv)
    llama_cpp = llama_cpp_module()
    if llama_cpp is None:
        print("quant_compare: llama_cpp is not importable (pip install llama-cpp-python); skipped", file=sys.stderr)
        return 0
    from ..formats.repack_cache import cache_root
    from ..upcycle import embedded_dense_path
    from .perf import write_results

    src = embedded_dense_path()
    rows = {}
    for ftype in a.types.split(","):
        path = quantize(llama_cpp, src, cache_root() / "quants" / f"{src.stem}.{ftype}.gguf", ftype, a.threads)
        g = guild_side(str(path), PROMPTS, a.tokens)
        ll = llama_side(str(path), g, a.tokens, a.threads)
        rows[ftype] = compare(g, ll)
        f16 = compare(llama_side(str(path), g, a.tokens, a.threads, GGML_TYPE_F16), ll)
        rows[ftype]["llama_f16_kv"] = {k: f16[k] for k in ("top1_agree", "max_abs", "rel_rms")}
        print(json.dumps({ftype: rows[ftype]}), file=sys.stderr)
    write_results(a.out, "quant_compare", rows, table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
