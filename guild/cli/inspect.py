"""`guild inspect`: a `.gexec` plan (identity, placement, CPU tuning, speculative costs, a terminal chart of the
verify curve; `--json`, `--plot`) or a GGUF model (architecture, experts, quant types, tensors, layer pattern),
the latter from metadata and the tensor index, and what a first load repacks (the loader run with a hook that packs
nothing: no quantised weights are read)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..calib.optimize import size
from ..calib.probe import hardware_identity
from ..errors import BadFlagError, GuildError, PlanMismatchError
from ..formats.gguf import GGUFFile
from ..formats.repack_cache import survey
from ..kernels.rope import RopeScaling
from ..models import load_model
from ..models.base import gguf_rope
from ..models.mtp import ARCH as ARCH_MTP
from ..models.mtp import sidecar_path
from ..plans.plan import MAX_T, Plan, read_plan
from ..speculative.registry import DRAFTERS
from ..upcycle import TAGS, resolve_model


def is_gguf(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------------
# models
def layer_pattern(n_layers: int, interval: int, nextn: int = 0) -> str:
    """Hybrid layer schedule as llama.cpp derives it: layer i is recurrent (R) unless (i + 1) % interval == 0
    (full attention, A); the last `nextn` layers are MTP layers (M)."""
    base = n_layers - nextn
    s = "".join("R" if (i + 1) % interval else "A" for i in range(base))
    return s + "M" * nextn


def compress_pattern(s: str) -> str:
    """'RRRARRRA' → 'RRRA × 2' (the shortest repeating unit; a trailing MTP run kept apart)."""
    core, tail = s.rstrip("M"), s[len(s.rstrip("M")):]
    for p in range(1, len(core) + 1):
        if len(core) % p == 0 and core[:p] * (len(core) // p) == core:
            out = f"{core[:p]} × {len(core) // p}" if len(core) // p > 1 else core
            return out + (f" + {tail}" if tail else "")
    return s


def model_summary(path: str | os.PathLike) -> dict:

    g = GGUFFile(path)
    a = g.architecture
    if a == ARCH_MTP:
        return head_summary(path, g)
    n_layers = int(g.get(f"{a}.block_count", int, 0))
    n_exp = int(g.get(f"{a}.expert_count", int, 0))
    d = {
        "path": str(path), "kind": "model", "name": g.get("general.name", str, ""), "architecture": a,
        "layers": n_layers, "context_length": g.get(f"{a}.context_length", int, None),
        "embedding_length": g.get(f"{a}.embedding_length", int, None),
        "expert_count": n_exp, "expert_used_count": int(g.get(f"{a}.expert_used_count", int, 0)) if n_exp else 0,
        "rope": gguf_rope(g), **_file_fields(g),
    }
    interval = g.get(f"{a}.full_attention_interval", None, None)
    nextn = int(g.get(f"{a}.nextn_predict_layers", int, 0))
    if isinstance(interval, int) and interval > 0 and n_layers:
        pat = layer_pattern(n_layers, interval, nextn)
        d.update(full_attention_interval=interval, layer_pattern=pat, layer_pattern_short=compress_pattern(pat))
    if nextn:
        d["nextn_predict_layers"] = nextn
    side = sidecar_path(path)
    d["mtp_head"] = (f"nextn block (blk.{n_layers - nextn})" if nextn else str(side) if side else None)
    try:  # the rest is metadata: a file the loader refuses (weights missing, shapes off) is still described
        d["repack"] = survey(g, load_model)
    except GuildError as e:
        d["repack"] = {"error": str(e)}
    return d


def _file_fields(g: GGUFFile) -> dict:
    quant = Counter(t.qtype.name for t in g.tensors.values())
    return {"tensor_count": len(g.tensors), "quant_types": dict(sorted(quant.items(), key=lambda kv: (-kv[1], kv[0]))),
            "parameters": int(sum(t.n_elements for t in g.tensors.values())),
            "file_bytes": os.path.getsize(g.path), "sha256": g.identity_digest()}


def head_summary(path: str | os.PathLike, g: GGUFFile) -> dict:
    """An MTP head (guild train-mtp): the model it drafts for, its block, its draft vocabulary and how it was
    trained, from its guild.mtp.* metadata and tensor shapes."""
    meta = {k.removeprefix("guild.mtp."): v for k, v in g.metadata.items() if k.startswith("guild.mtp.")}
    train = {k.removeprefix("train."): v for k, v in meta.items() if k.startswith("train.")}
    shapes = {n: tuple(int(x) for x in t.shape) for n, t in g.tensors.items()}
    blocks = sorted({int(n.split(".")[1]) for n in shapes if n.startswith("blk.")})
    exps = next((v[0] for n, v in shapes.items() if n.endswith("ffn_gate_exps.weight")), 0)
    dim = next((v[-1] for n, v in shapes.items() if n.endswith("nextn.enorm.weight")), None)
    vocab = next((v[0] for n, v in shapes.items() if n == "mtp.draft_vocab"), None)
    return {
        "path": str(path), "kind": "mtp_head", "architecture": ARCH_MTP,
        "base": {"name": meta.get("base_name"), "architecture": meta.get("base_architecture"),
                 "digest": meta.get("base_digest")},
        "block": {"layers": len(blocks), "ffn": meta.get("ffn"), "expert_count": int(exps),
                  "embedding_length": None if dim is None else int(dim)},
        "draft_vocab": None if vocab is None else int(vocab),
        "feature_layers": [int(v) for v in meta.get("feature_layers", [])],
        "training": train,
        **_file_fields(g),
    }


def print_head(d: dict, console: Console) -> None:
    t = Table(title=escape(f"{Path(d['path']).name} · MTP head"), show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    b, blk, tr = d["base"], d["block"], d["training"]
    t.add_row("drafts for", escape(f"{b['name'] or '—'} ({b['architecture'] or '?'}) · identity sha256 "
                                   f"{(b['digest'] or '?')[:16]}…"))
    t.add_row("block", escape(f"{blk['layers']} layer of the base's kind · FFN {blk['ffn'] or '?'}"
                              + (f" ({blk['expert_count']} experts)" if blk["expert_count"] else "")
                              + (f" · width {blk['embedding_length']}" if blk["embedding_length"] else "")))
    t.add_row("draft vocabulary", f"{d['draft_vocab']} most frequent targets" if d["draft_vocab"] else "whole")
    t.add_row("reads", "the final hidden fused with the outputs of trunk blocks "
              + ", ".join(map(str, d["feature_layers"])) if d["feature_layers"] else "the final hidden")
    if "heldout_acceptance" in tr:
        before = tr.get("heldout_acceptance_step0")
        t.add_row("held-out acceptance", f"{tr['heldout_acceptance'] * 100:.1f}% over {tr.get('heldout_rows', '?')} "
                  "rows" + (f" (before training {before * 100:.1f}%)" if before is not None else ""))
    d2 = tr.get("heldout_acceptance_d2")
    if d2 is not None and d2 == d2:
        t.add_row("chained", f"second draft right {d2 * 100:.1f}% of the times the first was (trained to depth "
                  f"{tr.get('depth', '?')})")
    if "steps" in tr:
        t.add_row("training", escape(f"{tr['steps']} steps · {tr.get('rows', '?')} rows of {tr.get('seq_len', '?')} "
                                     f"tokens" + (f" · {tr['seconds'] / 60:.1f} min" if "seconds" in tr else "")))
    if "sources" in tr:
        t.add_row("training text", escape(str(tr["sources"])))
    t.add_row("parameters", f"{d['parameters'] / 1e6:.1f} M in {d['tensor_count']} tensors")
    t.add_row("quant types", escape(", ".join(f"{k} × {v}" for k, v in d["quant_types"].items())))
    t.add_row("file", f"{d['file_bytes'] / 2**20:.1f} MiB · identity sha256 {d['sha256'][:16]}…")
    console.print(t)


def print_model(d: dict, console: Console) -> None:
    if d.get("kind") == "mtp_head":
        return print_head(d, console)
    t = Table(title=escape(Path(d["path"]).name), show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("name", escape(d["name"]) or "—")
    t.add_row("architecture", escape(d["architecture"]))
    t.add_row("layers", str(d["layers"]))
    if "layer_pattern" in d:
        t.add_row("layer pattern", f"{d['layer_pattern_short']}  (R recurrent, A full attention"
                  + (", M MTP" if "M" in d["layer_pattern"] else "") + f"; interval {d['full_attention_interval']})")
    t.add_row("experts", f"{d['expert_count']} (top-{d['expert_used_count']})" if d["expert_count"] else "dense")
    t.add_row("context length", str(d["context_length"]) if d["context_length"] else "— (not in the file)")
    r = d["rope"]
    t.add_row("rope", f"base {r['freq_base']:g} · scaling "
              + (escape(RopeScaling(**{k: v for k, v in r.items() if k != "freq_base"}).describe())))
    t.add_row("parameters", f"{d['parameters'] / 1e6:.1f} M")
    t.add_row("tensors", str(d["tensor_count"]))
    t.add_row("quant types", escape(", ".join(f"{k} × {v}" for k, v in d["quant_types"].items())))
    t.add_row("file", f"{d['file_bytes'] / 2**20:.1f} MiB · identity sha256 {d['sha256'][:16]}…")
    t.add_row("MTP head", escape(d["mtp_head"]) if d["mtp_head"] else "none (guild train-mtp makes one)")
    for k, v in repack_rows(d["repack"]):
        t.add_row(k, escape(v))
    console.print(t)


def repack_rows(r: dict) -> list[tuple[str, str]]:
    """What a first load repacks into guild's cache, per layout and why, and what runs from the GGUF's bytes."""
    if "error" in r:
        return [("repacked", f"unknown: a load would refuse this file ({r['error']})")]
    why = {"int8 tiles": "int8 tile layout: integer dot products", "fp32 dequant-dot tiles": "fp32 tile layout: "
           + ("--numerics f32" if r["numerics"] == "f32" else "no int8 kernel for these types")}
    rows = [("repacked", f"{r['matrices']} matrices from {r['tensors_repacked']} tensors, {r['bytes'] / 1e9:.2f} GB "
             "in the repack cache (guild cache list)")]
    for kind, v in r["layouts"].items():
        types = ", ".join(f"{t} × {n}" for t, n in sorted(v["types"].items(), key=lambda kv: -kv[1]))
        rows.append(("", f"{v['matrices']} matrices, {v['bytes'] / 1e9:.2f} GB: {why[kind]} ({types})"))
    g = r["from_gguf"]
    names = ", ".join(g["names"][:4]) + (", …" if len(g["names"]) > 4 else "")
    rows.append(("from the GGUF", f"{g['tensors']} tensors, {g['bytes'] / 1e9:.2f} GB used as the file has them"
                 + (f" ({names})" if names else "")))
    return rows


# ---------------------------------------------------------------------------------------------------------
# plans
def plan_json(plan: Plan, hardware=None) -> dict:
    """Every calibrated field, plus whether the plan matches this machine (the model is not checked here)."""

    try:
        plan.hardware.check(hardware or hardware_identity(), plan.path)
        here = {"matches": True, "mismatch": None}
    except PlanMismatchError as e:
        here = {"matches": False, "mismatch": {"type": type(e).__name__, "message": str(e)}}
    return {"path": plan.path, "seal": "ok", "this_machine": here, **plan.to_dict()}


def verify_chart(plan: Plan, width: int = 40) -> list[str]:
    """The verify curve V(T) as text bars: █ the CPU-expert share, ░ the rest."""
    s = plan.drafting
    top = max(s.verify_window_ms)
    lines = []
    for t in range(MAX_T):
        v = s.verify_window_ms[t]
        n = max(1, round(v / top * width))
        e = round(s.verify_cpu_expert_ms[t] / top * width) if s.verify_cpu_expert_ms else 0
        e = min(e, n)
        lines.append(f"T={t + 1} {'█' * e}{'░' * (n - e)}{' ' * (width - n)} {v:8.2f} ms "
                     f"{v / s.verify_window_ms[0]:5.2f}×")
    return lines


def _ms(x: float | None, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x * scale)


def print_plan(plan: Plan, d: dict, console: Console, full: bool) -> None:

    h, hw, m = plan.header, plan.hardware, plan.model
    t = Table(title=escape(f"plan {plan.path}"), show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("format", f"{h.format} v{h.version} · guild {h.guild_version} · {h.created} · seal ok")
    t.add_row("optimize", f"--mode {h.mode} --context {h.context} --prefill-batch {h.prefill_batch} --spec {h.spec} "
                          f"--cache-type-k {h.cache_type_k} --cache-type-v {h.cache_type_v}")
    t.add_row("CPU", escape(f"{hw.cpu_model} · {hw.physical_cores} cores / {hw.logical_cpus} threads · "
                            f"{hw.numa_nodes} NUMA node(s)"))
    t.add_row("ISA", " ".join(hw.isa))
    t.add_row("GPU", escape(hw.gpu.describe()) if hw.gpu else "none")
    t.add_row("model", escape(f"{m.file} · {m.architecture} · {m.layers} layers · "
                              + (f"{m.expert_count} experts (top-{m.expert_used_count})" if m.expert_count else "dense")
                              + f" · sha256 {m.sha256[:16]}…"))
    here = d["this_machine"]
    t.add_row("this machine", "matches" if here["matches"] else f"[yellow]{escape(here['mismatch']['message'])}[/]")
    console.print(t)
    s = plan.drafting
    if not full:
        console.print(escape(f"threads {plan.cpu.threads} · V(1) {s.verify_window_ms[0]:.2f} ms, V(8) "
                             f"{s.verify_window_ms[-1]:.2f} ms at {s.context} tokens (KV {h.kv.describe()}) on "
                             f"{s.device}"
                             + (f" ({s.device_note})" if s.device_note else "") + " · --plan for every table"))
        return
    p = plan.placement
    title = f"placement at --context {p.context}"
    if p.gpu:
        spilled = [g.name for g in p.groups if g.device != "gpu" and g.name != "routed_experts"]
        title += (f" · VRAM: {size(p.gpu_bytes)} of a {size(p.vram_budget_bytes)} budget on {p.gpu}, "
                  f"{size(p.cpu_bytes)} on the CPU"
                  + (f" (spilled: {', '.join(spilled)})" if spilled else ""))
    t = Table(title=escape(title), caption=escape(p.note or ""), title_justify="left", caption_justify="left")
    for c in ("group", "device", "tensors", "size", "on the GPU"):
        t.add_column(c, justify="left" if c in ("group", "device") else "right")
    for g in p.groups:
        t.add_row(g.name, g.device, str(g.tensors), size(g.bytes), size(g.gpu_bytes) if p.gpu else "—")
    t.add_row("total", "", "", size(p.gpu_bytes + p.cpu_bytes), size(p.gpu_bytes) if p.gpu else "—", style="bold")
    console.print(t)
    c = plan.cpu
    t = Table(title=f"CPU tuning: {c.threads} threads · memory {c.memory_bandwidth_gbs:.1f} GB/s (copy, 1 thread)",
              title_justify="left")
    tried = sorted({n for k in c.kernels for n in k.threads_tried})
    for col in ("quant", "kernel", "timed on", *(f"{n} thr ms" for n in tried), "best", "G weights/s"):
        t.add_column(col, justify="left" if col in ("quant", "kernel", "timed on") else "right")
    for k in c.kernels:
        by_n = dict(zip(k.threads_tried, k.ms, strict=True))
        t.add_row(k.qtype, k.kernel, f"{k.timed} of {k.matrices} {k.role}",
                  *(f"{by_n[n]:.3f}" if n in by_n else "—" for n in tried), str(k.best_threads), f"{k.gweights_s:.2f}")
    console.print(t)
    t = Table(title=escape(f"speculative costs at {s.context} tokens ({s.filled_tokens} prefilled, median of "
                           f"{s.repeats}, KV {h.kv.describe()}) measured on {s.device}"),
              caption=escape(s.device_note) or None,
              title_justify="left", caption_justify="left")
    for col in ("T", "verify ms", "V(T)/V(1)", "CPU-expert ms", "distinct experts", "U(T)/U(1)"):
        t.add_column(col, justify="right")
    for i in range(MAX_T):
        t.add_row(str(i + 1), f"{s.verify_window_ms[i]:.2f}", f"{s.verify_window_ms[i] / s.verify_window_ms[0]:.2f}",
                  _ms(s.verify_cpu_expert_ms and s.verify_cpu_expert_ms[i]),
                  _ms(s.distinct_experts and s.distinct_experts[i]),
                  _ms(s.distinct_expert_ratio and s.distinct_expert_ratio[i]))
    console.print(t)
    alone = [d for d in DRAFTERS.values() if not d.needs_head]  # timed by replay; the others through the head
    heads = [d for d in DRAFTERS.values() if d.needs_head]
    console.print(" · ".join(f"{d.name} {_ms(s.draft_ms.get(d.name), 1e3, '{:.1f}')} µs" for d in alone)
                  + f" · KV commit {s.kv_commit_ms * 1e3:.1f} µs"
                  + "".join(f" · {d.name.upper()} step {_ms(s.draft_ms.get(d.name))} ms"
                            + (f", catch-up {_ms(s.catchup_ms.get(d.name))} ms" if d.follows_rows else "")
                            for d in heads)
                  + (f" ({escape(s.mtp_note)})" if s.mtp_note else "")
                  + f" · noise CV {s.noise_cv:.3f} · prefill {s.prefill_tok_s:.0f} tok/s")
    console.print("\nverify curve V(T)" + (" (█ CPU experts, ░ the rest)" if s.verify_cpu_expert_ms else ""))
    for line in verify_chart(plan):
        console.print(line, highlight=False)


PLOT_HINT = "--plot needs matplotlib: pip install 'guild[plot]'"


def _pyplot():
    try:
        import matplotlib  # optional: guild[plot]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GuildError(PLOT_HINT) from None
    return plt


def plot(plan: Plan, out: str | os.PathLike) -> Path:
    plt = _pyplot()
    s = plan.drafting
    T = list(range(1, MAX_T + 1))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].plot(T, s.verify_window_ms, "o-", label="verify window V(T)")
    if s.verify_cpu_expert_ms:
        axes[0].plot(T, s.verify_cpu_expert_ms, "s--", label="CPU experts")
    axes[0].set(xlabel="window rows T", ylabel="ms", title=f"window cost at {s.context} tokens")
    axes[0].legend()
    axes[1].plot(T, [v / s.verify_window_ms[0] for v in s.verify_window_ms], "o-", label="V(T)/V(1)")
    if s.distinct_expert_ratio:
        axes[1].plot(T, s.distinct_expert_ratio, "s--", label="U(T)/U(1) distinct experts")
    axes[1].plot(T, T, ":", color="grey", label="T (no sharing)")
    axes[1].set(xlabel="window rows T", ylabel="ratio to T=1", title="growth with T")
    axes[1].legend()
    fig.suptitle(f"{plan.model.file} · {plan.hardware.cpu_model} · {plan.cpu.threads} threads")
    fig.tight_layout()
    out = Path(out)
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise GuildError(f"--plot {out}: cannot write ({e.strerror})") from None
    finally:
        plt.close(fig)
    return out


def inspect(path: str | os.PathLike, *, full: bool = False, as_json: bool = False, plot_to: str | None = None,
            console: Console | None = None) -> dict:
    """Show a plan or a GGUF model; returns what `--json` prints."""
    console = console or Console(highlight=False)

    if str(path) in TAGS and not Path(path).is_file():  # a model tag: the embedded models
        path = resolve_model(str(path))
    if not Path(path).is_file():
        raise GuildError(f"{path}: no such file")
    if is_gguf(path):
        if plot_to:
            raise BadFlagError("--plot needs a .gexec plan, not a GGUF model")
        d = model_summary(path)
        if not as_json:
            print_model(d, console)
        return d
    plan = read_plan(path)
    if plot_to:
        _pyplot()  # a missing matplotlib fails before anything is printed
    d = plan_json(plan)
    if not as_json:
        print_plan(plan, d, console, full)
    if plot_to:
        plot(plan, plot_to)
    return d
