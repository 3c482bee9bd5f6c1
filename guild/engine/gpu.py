"""Placement of a model on a GPU: attention, norms, routers, dense and shared FFNs, Gated-DeltaNet mixers,
embeddings, output and the MTP head on the device (CuPy RawKernels, kernels/cuda/), routed experts always on
the CPU (Numba, kernels/cpu/moe.py).

There is no GPU forward here. `place` returns the model itself (a shallow copy of the CPU model, same class)
with device twins of the parts a placement puts on the GPU and a device Layout (guild.engine.backends); its
forward is the architecture's one forward (guild/models/), written against the backends, so a model feature is
written once for the CPU, the GPU and the counting host backend. The placement decides where each tensor
lives; the forward does not know.

Schedule of one window (one CUDA stream; pinned host staging buffers, reused across windows):

    H2D   tokens, positions, last-row indices                       (one copy per device)
    GPU   embedding rows
    per layer l:
      GPU   rmsnorm, mixer (attention with its KV cache, or Gated DeltaNet with its recurrent state), norms
      dense FFN:  GPU gate|up, swiglu, x += down
      MoE FFN:    GPU router matmul, softmax/top-k, written beside h in one staging buffer
                  D2H   h, expert ids, weights                      (one copy; the host waits for it)
                  CPU   routed experts: each chosen expert read once for all rows that chose it
                  H2D   expert output                               (one copy)
                  GPU   (+ shared expert) x += expert output
    GPU   final norm, output matmul;  D2H logits                    (one copy)
    D2H   the final hidden rows, only when a consumer reads them (the MTP drafter on another backend,
          calibration): ForwardResult.hidden is a DeviceRows

What overlaps what. Kernel launches are asynchronous: the host enqueues a layer's work and runs ahead until
the D2H of the MoE rows, the only wait per layer, so the GPU executes while Python is still launching. The
CPU experts of layer l depend on h_l and every later GPU step depends on x_l + experts_l, so the experts overlap
none of the window's GPU work. (Splitting a window into two row groups would let one group's attention overlap
the other's experts, but it reads each shared expert twice, the very union cost verification windows avoid.)

Row invariance: every GPU kernel keeps a row's arithmetic independent of T and of the other rows
(kernels/cuda/*.cu), and the CPU experts are the CPU model's, so rows stay invariant on the GPU too. GPU and
CPU logits agree within a tolerance (different summation orders), not bitwise; on the counting host backend
(HostBackend.fake_device) they are bitwise.

Placement (GpuSplit): layers [0, gpu_layers) run on the GPU with their state; later layers, if the VRAM budget is
short, run on the CPU (x crosses once at the boundary); embeddings and output (with the MTP head) on either side.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import GpuPathError, GuildError
from ..gguf import Tensor
from ..machine import fake_gpu_mib
from ..models.deltanet import HybridMoe
from ..models.llama import Linear
from ..plan import group_of
from ..window import MAX_WINDOW
from .backends import HOST, CudaBackend, HostBackend, Layout
from .state import DeviceHybridState, DeviceKVCache

GPU_ARCHS = ("llama", "qwen3", "qwen3moe", "qwen3next", "qwen35moe")
_RESERVE = 512 * 2**20  # VRAM left for the CUDA context, activations and the memory pool's slack

__all__ = ["CudaBackend", "DeviceKVCache", "GpuSplit", "HostBackend", "build", "default_placement", "gpu_sizes",
           "place", "placement_from_plan"]


# ---------------------------------------------------------------------------------------------------------
# placement
@dataclass(frozen=True)
class GpuSplit:
    """What runs on the GPU: layers [0, gpu_layers) (attention, norms, router, dense FFN, their KV cache), the
    embedding table and the output matrix. Routed experts always stay on the CPU.

    From a plan's placement section (a mapping): `gpu_layers` (int), `embed` and `output` ("gpu" | "cpu")."""

    gpu_layers: int
    embed_gpu: bool = True
    output_gpu: bool = True

    @classmethod
    def from_section(cls, sec: Mapping, n_layers: int) -> GpuSplit:
        try:
            n = int(sec.get("gpu_layers", n_layers))
            emb, out = (str(sec.get(k, "gpu")).lower() for k in ("embed", "output"))
        except (TypeError, ValueError) as e:
            raise GuildError(f"plan placement section: {e}") from None
        if not 0 <= n <= n_layers or emb not in ("gpu", "cpu") or out not in ("gpu", "cpu"):
            raise GuildError(f"plan placement section invalid for a {n_layers}-layer model: {dict(sec)}")
        return cls(n, emb == "gpu", out == "gpu")

    def as_section(self) -> dict:
        return {"gpu_layers": self.gpu_layers, "embed": "gpu" if self.embed_gpu else "cpu",
                "output": "gpu" if self.output_gpu else "cpu"}

    @property
    def uses_gpu(self) -> bool:
        return self.gpu_layers > 0 or self.embed_gpu or self.output_gpu


def placement_from_plan(pl, model, n_ctx: int) -> GpuSplit:
    """The engine's placement from a plan's (guild.plan.Placement: per-group device cpu|gpu|split and GPU
    bytes, filled by calib/placement.py in layer order). The engine keeps a layer whole on one side, so it takes
    the longest prefix of layers whose every per-layer group (attention, KV cache, norms, router, dense FFN)
    fits in that group's GPU bytes: never more on the GPU than the plan budgeted."""
    a, g = model.args, model.gguf
    groups = {x.name: x for x in pl.groups}
    per_layer: dict[str, list[int]] = {}
    for t in g.tensors.values():
        grp, lay = group_of(t.name)
        if lay >= 0:
            per_layer.setdefault(grp, [0] * a.n_layers)[lay] += int(t.data.nbytes)
    per_layer["kv_cache"] = [gpu_sizes(model, n_ctx)["kv_per_layer"]] * a.n_layers
    n = a.n_layers if pl.gpu else 0
    for name in ("attention", "recurrent", "kv_cache", "norms", "router", "dense_ffn", "shared_experts"):
        grp = groups.get(name)
        if grp is None or name not in per_layer:
            continue
        if grp.device == "cpu":
            n = 0
        elif grp.device == "split":
            used = k = 0
            while k < a.n_layers and used + per_layer[name][k] <= grp.gpu_bytes:
                used += per_layer[name][k]
                k += 1
            n = min(n, k)

    def on(name: str) -> bool:
        grp = groups.get(name)
        return grp is not None and grp.device == "gpu"

    out = on("output")
    emb = on("embeddings") or (model.tied and out)
    return GpuSplit(n, emb, out)


def _tensor_bytes(t) -> int:
    return int(t.data.nbytes)


def gpu_sizes(model, n_ctx: int) -> dict:
    """Bytes the GPU needs per part at a context of n_ctx: each layer (its tensors but the routed experts, plus
    its KV cache, or for a Gated-DeltaNet layer its snapshot pool of 1 + MAX_WINDOW states and conv history),
    the embedding table, the output head (with the final norm), and the MTP head's block and norms when the file
    has one (a sidecar head is counted when it is placed)."""
    a, g = model.args, model.gguf
    kv = 2 * a.n_kv_heads * a.head_dim * n_ctx * 4
    d = getattr(model, "d", None)
    layers = [0] * a.n_layers
    mtp = 0
    for t in g.tensors.values():
        grp, lay = group_of(t.name)
        if lay < 0 or grp == "routed_experts":
            continue
        if lay < a.n_layers:
            layers[lay] += _tensor_bytes(t)
        else:
            mtp += _tensor_bytes(t)
    for i in range(a.n_layers):
        if d is not None and d.recurrent[i]:
            layers[i] += ((1 + MAX_WINDOW) * d.v_heads * d.head_dim * d.head_dim + (d.conv_kernel - 1) * d.conv_dim) * 4
        else:
            layers[i] += kv
    embed = _tensor_bytes(g.tensors["token_embd.weight"])
    output = embed if not g.has("output.weight") else _tensor_bytes(g.tensors["output.weight"])
    return {"layers": layers, "embed": embed, "output": output, "tied": not g.has("output.weight"), "kv_per_layer": kv,
            "mtp": mtp}


def spill_report(model, split: GpuSplit, n_ctx: int) -> str:
    """What a placement leaves on the CPU besides the routed experts, in words (empty when nothing spilled)."""
    s, a = gpu_sizes(model, n_ctx), model.args
    cpu = []
    if split.gpu_layers < a.n_layers:
        nb = sum(s["layers"][split.gpu_layers :])
        cpu.append(f"layers {split.gpu_layers}..{a.n_layers - 1} ({nb / 2**20:.1f} MiB)")
    if not split.output_gpu:
        cpu.append(f"output head ({s['output'] / 2**20:.1f} MiB)" + (" and MTP head" if s["mtp"] else ""))
    if not split.embed_gpu:
        cpu.append(f"embeddings ({s['embed'] / 2**20:.1f} MiB)")
    return "spilled to the CPU: " + ", ".join(cpu) if cpu else ""


def default_placement(model, free_bytes: int, n_ctx: int) -> GpuSplit:
    """Fill the VRAM left after a reserve: layers in order (weights and their state at n_ctx), then the output
    matrix with the MTP head, then the embeddings (an embedding lookup on the CPU costs only the rows' upload).
    tests/test_gpu_cli.py: an 8 GiB GTX 1070 at --context 4096 holds a whole tiny hybrid; a tiny budget splits it."""
    s = gpu_sizes(model, n_ctx)
    budget = int(free_bytes) - _RESERVE
    n = 0
    for b in s["layers"]:
        if b > budget:
            break
        budget -= b
        n += 1
    out = n == len(s["layers"]) and s["output"] + s["mtp"] <= budget
    if out:
        budget -= s["output"] + s["mtp"]
    emb = out and (s["tied"] or s["embed"] <= budget)
    return GpuSplit(n, emb, out)


# ---------------------------------------------------------------------------------------------------------
# device twins
def _twin(obj, be, g, prefix: str):
    """A copy of a layer object with its weights on be: float32 arrays uploaded, Linear matrices packed for be
    (from their GGUF tensors), the router from the file; routed experts (lists) stay on the CPU."""
    t = copy.copy(obj)
    for k, v in vars(obj).items():
        if isinstance(v, np.ndarray) and v.dtype == np.float32:
            setattr(t, k, be.upload(v))
        elif isinstance(v, Linear):
            setattr(t, k, be.linear(v, v.tensors, prefix + k))
        elif k == "router":
            setattr(t, k, be.linear(v, [g.tensor(prefix + "ffn_gate_inp.weight")], prefix + "ffn_gate_inp"))
    return t


def _twin_block(blk, be, g, prefix: str):
    """A llama Layer, or a hybrid block (norms, mixer, MoE), on be."""
    if isinstance(blk, tuple):
        (n_in, n_post), mixer, ffn = blk
        return (be.upload(n_in), be.upload(n_post)), _twin(mixer, be, g, prefix), _twin(ffn, be, g, prefix)
    return _twin(blk, be, g, prefix)


def _matrix(be, cpu_weights, t: Tensor, name: str):
    return be.linear(cpu_weights, [t], name)


def place(cpu_model, device, split: GpuSplit, host: HostBackend = HOST):
    """The model with the placement's share on `device` (a CudaBackend, or HostBackend.fake_device() in tests)
    and the rest, routed experts always, on the host: the same class and forward as the CPU model."""
    a = cpu_model.args
    if a.arch not in GPU_ARCHS:
        raise GpuPathError(f"the GPU path supports {', '.join(GPU_ARCHS)}, not '{a.arch}'")
    if a.head_dim > 256:
        raise GpuPathError(f"head_dim {a.head_dim} > 256 is not supported on the GPU")
    if not 0 <= split.gpu_layers <= a.n_layers:
        raise GpuPathError(f"placement: gpu_layers {split.gpu_layers} not in 0..{a.n_layers}")
    g = cpu_model.gguf
    eng = copy.copy(cpu_model)
    bes = [device if i < split.gpu_layers else host for i in range(a.n_layers)]
    embed_be = device if split.embed_gpu else host
    out_be = device if split.output_gpu else host
    rope = {}
    for be in (*bes, embed_be, out_be):
        if be.name not in rope:
            with be.activate():
                rope[be.name] = (be.upload(cpu_model.cos), be.upload(cpu_model.sin))
    if isinstance(cpu_model, HybridMoe):
        eng.norms, eng.mixers, eng.ffns = [], [], []
        for i, be in enumerate(bes):
            with be.activate():
                n, m, f = _twin_block((cpu_model.norms[i], cpu_model.mixers[i], cpu_model.ffns[i]), be, g, f"blk.{i}.")
            eng.norms.append(n)
            eng.mixers.append(m)
            eng.ffns.append(f)
    else:
        eng.layers = []
        for i, be in enumerate(bes):
            with be.activate():
                eng.layers.append(_twin_block(cpu_model.layers[i], be, g, f"blk.{i}."))
    emb_t = g.tensor("token_embd.weight")
    tied = not g.has("output.weight")
    with embed_be.activate():
        eng.embed = _matrix(embed_be, cpu_model.embed, emb_t, "token_embd")
    with out_be.activate():
        if tied and out_be is embed_be:
            eng.output = eng.embed
        else:
            eng.output = _matrix(out_be, cpu_model.output, g.tensor("token_embd.weight" if tied else "output.weight"),
                                 "output")
        eng.out_norm = out_be.upload(cpu_model.out_norm)
    eng._layout = Layout(bes, embed_be, out_be, rope)
    eng.cpu, eng.dev, eng.host, eng.placement = cpu_model, device, host, split
    eng.placed_context = a.context_length  # what the spill report sizes the state at (build: the --context)
    eng.returns_hidden = True  # always: a DeviceRows when they end on the device, moved only when read
    eng.hosts_mtp_head = True
    eng.new_state = types.MethodType(_new_state, eng)
    eng.describe = types.MethodType(_describe, eng)
    eng.place_head = types.MethodType(_place_head, eng)
    return eng


def _new_state(self, n_ctx: int | None = None, rollback: str | None = None):
    a = self.args
    n_ctx = min(n_ctx or a.context_length, a.context_length)
    bes = self.layout.layer_be
    if isinstance(self, HybridMoe):
        d = self.d
        rec = [i for i, r in enumerate(d.recurrent) if r]
        att = [i for i, r in enumerate(d.recurrent) if not r]
        return DeviceHybridState(bes, att, rec, a.n_kv_heads, a.head_dim, n_ctx, d.kmap, d.head_dim, d.head_dim,
                                 d.conv_dim, d.conv_kernel, rollback or self.rollback)
    return DeviceKVCache(bes, a.n_kv_heads, a.head_dim, n_ctx)


def _describe(self) -> str:
    p = self.placement
    spill = spill_report(self.cpu, p, self.placed_context)
    return (f"{self.dev.name}: {p.gpu_layers}/{self.args.n_layers} layers"
            + (", embeddings" if p.embed_gpu else "") + (", output" if p.output_gpu else "")
            + (", experts on CPU" if self.args.is_moe else "") + (f"; {spill}" if spill else ""))


def _place_head(self, head, g, bid: int, p: str):
    """The MTP head's weights on the layout's head backend (with the output head): block, eh_proj, norms and the
    draft LM head (the --spec-mtp-vocab rows when the head has a draft vocabulary)."""
    be = self.layout.head_be
    if not be.device:
        return head
    w = copy.copy(head)
    with be.activate():
        for k in ("enorm", "hnorm", "head_norm"):
            setattr(w, k, be.upload(getattr(head, k)))
        w.eh_proj = be.linear(head.eh_proj, head.eh_proj.tensors, p + "eh_proj")
        w.block = _twin_block(head.block, be, g, f"blk.{bid}.")
        if g.has(p + "embed_tokens.weight"):
            w.embed = _matrix(be, head.embed, g.tensor(p + "embed_tokens.weight"), p + "embed_tokens")
        elif self.layout.embed_be is be:
            w.embed = self.embed
        else:
            w.embed = _matrix(be, self.cpu.embed, self.gguf.tensor("token_embd.weight"), "token_embd")
        if g.has(p + "shared_head_head.weight"):
            w.output = _matrix(be, head.output, g.tensor(p + "shared_head_head.weight"), p + "shared_head_head")
        elif head.vocab_ids is not None:
            bg = self.gguf
            t = bg.tensor("output.weight" if bg.has("output.weight") else "token_embd.weight")
            sub = Tensor(t.name + "[draft]", t.qtype, (head.vocab_ids.size, t.shape[1]),
                         np.ascontiguousarray(t.data[head.vocab_ids]))
            w.output = _matrix(be, head.output, sub, "output[draft]")
        else:
            w.output = self.output
    return w


def build(cpu_model, device_info, n_ctx: int, placement: GpuSplit | Mapping | None = None):
    """The model placed on a CUDA device (guild.engine.device.Device) with a plan's placement or the default
    one for the VRAM free now."""
    a = cpu_model.args
    if a.arch not in GPU_ARCHS:
        raise GpuPathError(f"the GPU path supports {', '.join(GPU_ARCHS)}, not '{a.arch}'")
    if isinstance(placement, Mapping):
        placement = GpuSplit.from_section(placement, a.n_layers)
    if placement is None:
        placement = default_placement(cpu_model, device_info.free_bytes, n_ctx)
    if not placement.uses_gpu:
        need = gpu_sizes(cpu_model, n_ctx)["layers"][0] + _RESERVE
        raise GpuPathError(
            f"nothing fits on {device_info.name}: one layer at a context of {n_ctx} tokens needs "
            f"{need / 2**20:.0f} MiB, {device_info.free_bytes / 2**20:.0f} MiB free"
        )
    try:
        eng = place(cpu_model, device_backend(device_info.index), placement)
        eng.placed_context = n_ctx
        return eng
    except Exception as e:
        if type(e).__name__ == "OutOfMemoryError":
            raise GpuPathError(f"GPU out of memory while uploading the model ({e})") from None
        raise


def device_backend(index: int = 0):
    """The backend of CUDA device `index`: a CudaBackend, or the counting host backend standing in for a GPU
    when GUILD_FAKE_GPU is set (guild.engine.device: tests and CI run --device cuda end to end without one)."""
    return HostBackend.fake_device() if fake_gpu_mib() else CudaBackend(index)
