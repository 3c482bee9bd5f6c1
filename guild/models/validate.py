"""What a model file must hold before any kernel reads it: every tensor's shape (per architecture, from the
table below, in terms of the metadata), the metadata ranges the forward code divides by or allocates from,
the size of what loading will allocate, and finite weights (a scan of float tensors and of quant-block scales).
One GuildError naming the file, key or tensor and what was expected. Called once by models.load_model and by
the MTP head loader; the forward code trusts what passed.

Shapes are numpy order (GGUF dims reversed), as guild.formats.gguf.Tensor.shape; names as llama.cpp's converter
writes them (gguf-py/gguf/constants.py MODEL_TENSORS; conversion per llama.cpp src/llama-model.cpp load_tensors).
"""

from __future__ import annotations

import math
import os
import resource

import numpy as np
from gguf import GGMLQuantizationType as Q

from ..errors import GuildError, MetadataError, MissingTensorError, UnsupportedQuantTypeError
from ..formats.finite import EXP_MASK, SCALE_OFFSETS, nonfinite_count, nonfinite_error
from ..kvtypes import F32_KV, KVTypes
from .base import NumericsError, check_finite  # noqa: F401  (re-exported)


class ModelValidationError(GuildError):
    """The file's tensors or metadata do not describe a model guild can run safely."""


# -- the per-architecture table ------------------------------------------------------------------------
# (tensor name under its prefix, accepted shapes, required). Shape entries are expressions over the symbols of
# `symbols()`; a capitalised free symbol (F, FE, S, E) is bound by its first tensor and must agree afterwards.
REQ, OPT = True, False
GLOBAL = [("token_embd.weight", [("vocab", "dim")], REQ), ("output_norm.weight", [("dim",)], REQ),
          ("output.weight", [("vocab", "dim")], OPT)]
LLAMA_ATTN = [("attn_norm.weight", [("dim",)], REQ), ("attn_q.weight", [("H*hd", "dim")], REQ),
              ("attn_k.weight", [("Hkv*hd", "dim")], REQ), ("attn_v.weight", [("Hkv*hd", "dim")], REQ),
              ("attn_output.weight", [("dim", "H*hd")], REQ), ("ffn_norm.weight", [("dim",)], REQ)]
QK_NORM = [("attn_q_norm.weight", [("hd",)], REQ), ("attn_k_norm.weight", [("hd",)], REQ)]
DENSE_FFN = [("ffn_gate.weight", [("F", "dim")], REQ), ("ffn_up.weight", [("F", "dim")], REQ),
             ("ffn_down.weight", [("dim", "F")], REQ)]
MOE_FFN = [("ffn_gate_inp.weight", [("E", "dim")], REQ), ("ffn_gate_exps.weight", [("E", "FE", "dim")], REQ),
           ("ffn_up_exps.weight", [("E", "FE", "dim")], REQ), ("ffn_down_exps.weight", [("E", "dim", "FE")], REQ)]
HYBRID_NORMS = [("attn_norm.weight", [("dim",)], REQ), ("post_attention_norm.weight", [("dim",)], REQ)]
HYBRID_ATTN = [("attn_q.weight", [("2*H*hd", "dim")], REQ), ("attn_k.weight", [("Hkv*hd", "dim")], REQ),
               ("attn_v.weight", [("Hkv*hd", "dim")], REQ), ("attn_output.weight", [("dim", "H*hd")], REQ),
               *QK_NORM]
DELTANET = [("ssm_conv1d.weight", [("conv", "K")], REQ), ("ssm_dt.bias", [("nv",)], REQ),
            ("ssm_a", [("nv",)], REQ), ("ssm_norm.weight", [("dk",)], REQ), ("ssm_out.weight", [("dim", "nv*dk")], REQ)]
DELTANET_IN_OLD = [("ssm_in.weight", [("conv+nv*dk", "dim")], REQ)]  # older qwen3next: [q, k, v, z] per group
DELTANET_IN = [("attn_qkv.weight", [("conv", "dim")], REQ), ("attn_gate.weight", [("nv*dk", "dim")], REQ)]
BA_FUSED = [("ssm_ba.weight", [("2*nv", "dim")], REQ)]
BA_SPLIT = [("ssm_beta.weight", [("nv", "dim")], REQ), ("ssm_alpha.weight", [("nv", "dim")], REQ)]
SHARED_EXPERT = [("ffn_gate_inp_shexp.weight", [("dim",), (1, "dim")], REQ),
                 ("ffn_gate_shexp.weight", [("S", "dim")], REQ),
                 ("ffn_up_shexp.weight", [("S", "dim")], REQ), ("ffn_down_shexp.weight", [("dim", "S")], REQ)]
MTP_HEAD = [("nextn.eh_proj.weight", [("dim", "2*dim")], REQ), ("nextn.enorm.weight", [("dim",)], REQ),
            ("nextn.hnorm.weight", [("dim",)], REQ), ("nextn.shared_head_norm.weight", [("dim",)], REQ),
            ("nextn.embed_tokens.weight", [("vocab", "dim")], OPT),
            ("nextn.shared_head_head.weight", [("vocab", "dim")], OPT)]
SAME_QTYPE = (("ffn_gate_exps.weight", "ffn_up_exps.weight"),)  # fused into one packed matrix per expert


def alloc_limit() -> int:
    """Bytes one allocation driven by a file may take: half of physical memory, or of the address-space limit
    (RLIMIT_AS) when one is set and lower."""
    lim = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        lim = min(lim, soft // 2)
    return lim


def check_alloc(path: str, what: str, nbytes: int, fix: str = "") -> None:
    lim = alloc_limit()
    if nbytes > lim:
        raise ModelValidationError(f"{path}: {what} needs {nbytes / 2**30:.1f} GiB, more than the "
                                   f"{lim / 2**30:.1f} GiB one allocation may take here{fix}")


# -- metadata ------------------------------------------------------------------------------------------
def check_args(path: str, a, n_tensors: int) -> None:
    """Ranges of ModelArgs the forward code relies on (after ModelArgs' own positivity checks)."""
    key = a.arch
    if a.rope_dim < 0 or a.n_experts < 0 or a.n_experts_used < 0:
        raise MetadataError(f"{path}: {key}.rope.dimension_count, expert_count and expert_used_count must be >= 0")
    if a.n_layers > n_tensors:
        raise MetadataError(f"{path}: {key}.block_count {a.n_layers} exceeds the file's {n_tensors} tensors")
    if not (math.isfinite(a.rope_base) and a.rope_base > 0):
        raise MetadataError(f"{path}: {key}.rope.freq_base must be finite and > 0, got {a.rope_base}")
    if not (math.isfinite(a.norm_eps) and 0 < a.norm_eps < 1):
        raise MetadataError(f"{path}: {key}.attention.layer_norm_rms_epsilon must be in (0, 1), got {a.norm_eps}")
    n_rot = a.rope_dim or a.head_dim
    # rope tables: float64 angles plus cos/sin, float64 then float32 (kernels/ref.py rope_tables)
    check_alloc(path, f"{key}.context_length {a.context_length} (rope tables)", a.context_length * (n_rot // 2) * 32)


def check_context(model, n_ctx: int, kv: KVTypes = F32_KV) -> None:
    """`--context`: the KV cache a session of the model may grow to (keys and values in their stored types, every
    layer) and, past the trained context, the rope tables it grows to."""
    a = model.args
    path = getattr(model.gguf, "path", a.arch)
    check_alloc(path, f"--context {n_ctx} (KV cache)", kv.token_bytes(a.n_layers, a.n_kv_heads, a.head_dim) * n_ctx,
                "; give a smaller --context")
    check_alloc(path, f"--context {n_ctx} (rope tables)", n_ctx * ((a.rope_dim or a.head_dim) // 2) * 32,
                "; give a smaller --context")


def symbols(a, d=None) -> dict:
    s = {"dim": a.dim, "H": a.n_heads, "Hkv": a.n_kv_heads, "hd": a.head_dim, "vocab": a.vocab_size}
    if a.ffn_dim > 0:
        s["F"] = a.ffn_dim
    if a.n_experts:
        s["E"] = a.n_experts
    if a.expert_ffn_dim > 0:
        s["FE"] = a.expert_ffn_dim
    if d is not None:
        s.update(conv=d.conv_dim, K=d.conv_kernel, nv=d.v_heads, nk=d.k_heads, dk=d.head_dim)
        if d.shared_ffn_dim > 0:
            s["S"] = d.shared_ffn_dim
    return s


def _eval(expr, env: dict, free: dict):
    if isinstance(expr, int):
        return expr
    if expr in env or expr in free:
        return env.get(expr, free.get(expr))
    if expr[0].isupper() and expr.isalnum():
        return None  # free, unbound
    return eval(expr, {"__builtins__": {}}, env)  # our table's arithmetic over the symbols, never file text


def check_tensors(g, rules, prefix: str, env: dict, free: dict) -> None:
    """Each rule's tensor present (when required) with one of its shapes; binds free symbols."""
    for name, shapes, required in rules:
        full = prefix + name
        t = g.tensors.get(full)
        if t is None:
            if required:
                raise MissingTensorError(f"{g.path}: missing tensor '{full}'")
            continue
        g.tensor(full)  # supported quant type, whole blocks
        ok = False
        for shape in shapes:
            if len(shape) != len(t.shape):
                continue
            want = [_eval(e, env, free) for e in shape]
            if all(w is None or w == s for w, s in zip(want, t.shape, strict=True)):
                for e, s in zip(shape, t.shape, strict=True):
                    if isinstance(e, str) and _eval(e, env, free) is None:
                        free[e] = s
                ok = True
                break
        if not ok:
            def show(shape):
                return "(" + ", ".join(f"{e}={_eval(e, env, free)}" if _eval(e, env, free) is not None else str(e)
                                       for e in shape) + ")"
            raise ModelValidationError(f"{g.path}: tensor '{full}' has shape {tuple(t.shape)}, expected "
                                       + " or ".join(show(s) for s in shapes) + " from the metadata")
    for a_name, b_name in SAME_QTYPE:
        a, b = g.tensors.get(prefix + a_name), g.tensors.get(prefix + b_name)
        if a is not None and b is not None and a.qtype != b.qtype:
            raise UnsupportedQuantTypeError(f"{g.path}: {prefix}{a_name} ({a.qtype.name}) and {b_name} "
                                            f"({b.qtype.name}) must share a quant type")


def llama_layer_rules(g, prefix: str, a) -> list:
    rules = LLAMA_ATTN + (QK_NORM if a.qk_norm else [])
    if g.has(prefix + "ffn_gate_inp.weight"):
        if not a.is_moe:
            raise MetadataError(f"{g.path}: {prefix}ffn_gate_inp.weight is present but {a.arch}.expert_count "
                                f"is {a.n_experts}")
        return rules + MOE_FFN
    return rules + DENSE_FFN


def hybrid_layer_rules(g, prefix: str, recurrent: bool, ba_fused: bool) -> list:
    rules = list(HYBRID_NORMS)
    if recurrent:
        rules += DELTANET + (DELTANET_IN_OLD if g.has(prefix + "ssm_in.weight") else DELTANET_IN)
        rules += BA_FUSED if ba_fused else BA_SPLIT
    else:
        rules += HYBRID_ATTN
    return rules + MOE_FFN + SHARED_EXPERT


def check_model(g, cls, a, d=None) -> None:
    """The whole file against its architecture (cls: the model class, whose layer_rules name each block's
    tensors; d: its extra arguments, e.g. a hybrid's DeltaNetArgs)."""

    check_args(g.path, a, len(g.tensors))
    env = symbols(a, d)
    free: dict = {}
    check_tensors(g, GLOBAL, "", env, free)
    for i in range(a.n_layers):
        p = f"blk.{i}."
        check_tensors(g, cls.layer_rules(g, p, a, d, i), p, env, free)
    scan_finite(g)


def validate_file(g, cls, overrides: dict) -> None:
    """Build the arguments the way cls.from_gguf will (cls.validation_args: without loading anything), then
    check the file."""

    try:
        args, d = cls.validation_args(g, overrides)
    except GuildError as e:
        if str(e).startswith(str(g.path)):
            raise
        raise type(e)(f"{g.path}: {e}") from None
    check_model(g, cls, args, d)


def check_mtp_head(g, base, bid: int) -> None:
    """An MTP head file (or the model's own nextn block): the nextn tensors and block `bid` of the base's kind."""

    a = base.args
    d = getattr(base, "d", None)
    env = symbols(a, d)
    free: dict = {}
    p = f"blk.{bid}."
    check_tensors(g, MTP_HEAD, p, env, free)
    check_tensors(g, type(base).layer_rules(g, p, a, d, None), p, env, free)
    if g.has("mtp.draft_vocab"):
        t = g.tensors["mtp.draft_vocab"]
        if t.qtype != Q.I32 or len(t.shape) != 1:
            raise ModelValidationError(f"{g.path}: tensor 'mtp.draft_vocab' must be a 1-D I32 list of token ids")
        ids = np.asarray(t.data)
        if ids.size and (ids.min() < 0 or ids.max() >= a.vocab_size):
            raise ModelValidationError(f"{g.path}: tensor 'mtp.draft_vocab' holds ids outside 0..{a.vocab_size - 1}")
    layers = mtp_feature_layers(g, a.n_layers)
    fc = p + "nextn.fc.weight"
    if layers and not g.has(fc):
        raise ModelValidationError(f"{g.path}: the head fuses layers {list(layers)} but has no '{fc}'")
    if g.has(fc):
        want = (a.dim, (1 + len(layers)) * a.dim)
        if not layers or tuple(g.tensor(fc).shape) != want:
            raise ModelValidationError(f"{g.path}: '{fc}' is {tuple(g.tensor(fc).shape)}, expected {want} "
                                       f"(guild.mtp.feature_layers {list(layers)})")
    if g is not getattr(base, "gguf", None):  # the model's own nextn block was scanned with the model
        scan_finite(g)


FEATURE_KEY = "guild.mtp.feature_layers"


def mtp_feature_layers(g, n_layers: int) -> tuple[int, ...]:
    """The trunk layers whose output rows a head fuses with the final hidden (EAGLE-3's low/mid/high
    features): increasing, distinct, each before the last layer; () for a head that reads the final hidden only."""
    raw = g.metadata.get(FEATURE_KEY, [])
    if isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__") or \
            not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in raw):
        raise ModelValidationError(f"{g.path}: {FEATURE_KEY} must be a list of layer numbers")
    layers = tuple(int(v) for v in raw)
    if len(layers) > 8 or any(b <= a for a, b in zip(layers, layers[1:], strict=False)) or \
            any(not 0 <= v < n_layers - 1 for v in layers):
        raise ModelValidationError(f"{g.path}: {FEATURE_KEY} {list(layers)} must be at most 8 increasing layer "
                                   f"numbers in 0..{n_layers - 2}")
    return layers


# -- numerics ------------------------------------------------------------------------------------------
def scan_finite(g) -> None:
    """Every float tensor and block scale of g finite, once per file object (`g.finite_checked`; a repack cache
    built from a scanned file sets it). Each tensor's pages are released once read (GGUFFile.release), so the
    scan does not leave the whole file resident. While a repack runs (`g.scale_ledger`), the quantised tensors
    are left to it: its packers check the scales as they read them (guild/formats/finite.py)."""
    if getattr(g, "finite_checked", False):
        return
    release = getattr(g, "release", None)
    ledger = getattr(g, "scale_ledger", None)
    for name, t in g.tensors.items():
        if ledger is not None and t.qtype in SCALE_OFFSETS:
            ledger.defer(name)
        elif t.qtype in EXP_MASK or t.qtype in SCALE_OFFSETS:
            n = nonfinite_count(t)
            if release is not None:
                release(t.data)
            if n:
                raise nonfinite_error(g.path, name, t, n)
    if ledger is None:
        g.finite_checked = True
