"""Placement of a model on a GPU: attention, norms, routers, dense and shared FFNs, Gated-DeltaNet mixers,
embeddings, output and the MTP head on the device (CuPy RawKernels, kernels/cuda/), routed experts always on
the CPU (Numba, kernels/cpu/moe.py).

There is no GPU forward here. `split_onto_device` returns the model itself (a shallow copy of the CPU model, same class)
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

Placement (guild.engine.placement, the algorithm `guild optimize` writes into a plan): layers [0, gpu_layers) run
on the GPU with their state; later layers, if the VRAM budget is short, run on the CPU (x crosses once at the
boundary); embeddings and output (with the MTP head) on either side.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import numpy as np

from ..errors import DeviceOutOfMemoryError, GpuPathError
from ..formats.gguf import Tensor
from ..kvtypes import F32_KV, KVTypes
from ..plans.machine import fake_gpu_mib
from .backends import HOST, CudaBackend, HostBackend, Layout, Linear
from .backends.oom import allocating
from .placement import VRAM_RESERVE, VRAM_SHARE, GpuSplit, Parts, default_placement, spill_report

__all__ = ["build", "describe", "device_backend", "place_head", "split_onto_device"]


# ---------------------------------------------------------------------------------------------------------
# device twins
def _check_arch(model) -> None:
    """The architecture class declares whether the GPU path can place it (Architecture.GPU)."""
    if not getattr(model, "GPU", False):
        raise GpuPathError(f"the GPU path cannot place '{model.args.arch}': its forward calls ops kernels/cuda lacks")


def _twin(obj, be, g, prefix: str):
    """A copy of a layer object with its weights on be: float32 arrays uploaded, Linear matrices packed for be
    (from their GGUF tensors), the router from the file; routed experts (lists) stay on the CPU."""
    t = copy.copy(obj)
    for k, v in vars(obj).items():
        if isinstance(v, np.ndarray) and v.dtype == np.float32:
            setattr(t, k, _upload(be, v, prefix + k))
        elif isinstance(v, Linear):
            setattr(t, k, _linear(be, v, v.tensors, prefix + k))
        elif k == "router":
            setattr(t, k, _linear(be, v, [g.tensor(prefix + "ffn_gate_inp.weight")], prefix + "ffn_gate_inp"))
    return t


def _twin_block(model, blk, be, g, prefix: str):
    """One of the model's blocks on be (the architecture says what a block holds: Architecture.map_block)."""
    return model.map_block(blk, lambda obj: _twin(obj, be, g, prefix), lambda v: _upload(be, v, prefix + "norm"))


def _upload(be, a: np.ndarray, name: str):
    with allocating(be, name, a.nbytes):
        return be.upload(a)


def _linear(be, cpu_weights, tensors, name: str):
    with allocating(be, name, sum(int(t.data.nbytes) for t in tensors)):
        return be.linear(cpu_weights, tensors, name)


def _matrix(be, cpu_weights, t: Tensor, name: str):
    return _linear(be, cpu_weights, [t], name)


def split_onto_device(cpu_model, device, split: GpuSplit, host: HostBackend = HOST):
    """The model with the placement's share on `device` (a CudaBackend, or HostBackend.fake_device() in tests)
    and the rest, routed experts always, on the host: a shallow copy of the CPU model, the same class and
    forward, with device twins of its blocks, a device Layout and `placement` set (which makes new_state build
    its state where each layer runs)."""
    a = cpu_model.args
    _check_arch(cpu_model)
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
                rope[be.name] = (_upload(be, cpu_model.cos, "rope cos"), _upload(be, cpu_model.sin, "rope sin"))
    blocks = []
    for i, (blk, be) in enumerate(zip(cpu_model.blocks(), bes, strict=True)):
        with be.activate():
            blocks.append(_twin_block(cpu_model, blk, be, g, f"blk.{i}."))
    eng.set_blocks(blocks)
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
        eng.out_norm = _upload(out_be, cpu_model.out_norm, "output_norm")
    eng._layout = Layout(bes, embed_be, out_be, rope)
    eng.cpu, eng.dev, eng.host, eng.placement = cpu_model, device, host, split
    eng.placed_context = a.context_length  # what the spill report sizes the state at (build: the --context)
    eng.placed_kv = F32_KV  # ... and its KV types (build: the run's)
    return eng


def describe(model) -> str:
    """Where a placed model runs, in words (with what spilled to the CPU)."""
    p = model.placement
    spill = spill_report(model.cpu, p, model.placed_context, model.placed_kv)
    return (f"{model.dev.name}: {p.gpu_layers}/{model.args.n_layers} layers"
            + (", embeddings" if p.embed_gpu else "") + (", output" if p.output_gpu else "")
            + (", experts on CPU" if model.args.is_moe else "") + (f"; {spill}" if spill else ""))


def place_head(model, head, g, bid: int, p: str):
    """The MTP head's weights on the model's head backend (with the output head): block, eh_proj, norms and the
    draft LM head (the --spec-mtp-vocab rows when the head has a draft vocabulary). The head itself when that
    backend is the host (a CPU model)."""
    be = model.layout.head_be
    if not be.device:
        return head
    try:
        return _place_head(model, head, g, bid, p, be)
    except DeviceOutOfMemoryError as e:
        raise DeviceOutOfMemoryError(e.device, f"the MTP head's {e.what}", e.needed, e.free) from None


def _place_head(model, head, g, bid: int, p: str, be):
    w = copy.copy(head)
    with be.activate():
        for k in ("enorm", "hnorm", "head_norm", "unit"):
            setattr(w, k, _upload(be, getattr(head, k), p + k))
        w.eh_proj = _linear(be, head.eh_proj, head.eh_proj.tensors, p + "eh_proj")
        if head.fc is not None:
            w.fc = _linear(be, head.fc, head.fc.tensors, p + "fc")
        w.block = _twin_block(model, head.block, be, g, f"blk.{bid}.")
        if g.has(p + "embed_tokens.weight"):
            w.embed = _matrix(be, head.embed, g.tensor(p + "embed_tokens.weight"), p + "embed_tokens")
        elif model.layout.embed_be is be:
            w.embed = model.embed
        else:
            w.embed = _matrix(be, model.cpu.embed, model.gguf.tensor("token_embd.weight"), "token_embd")
        if g.has(p + "shared_head_head.weight"):
            w.output = _matrix(be, head.output, g.tensor(p + "shared_head_head.weight"), p + "shared_head_head")
        elif head.vocab_ids is not None:
            bg = model.gguf
            t = bg.tensor("output.weight" if bg.has("output.weight") else "token_embd.weight")
            sub = Tensor(t.name + "[draft]", t.qtype, (head.vocab_ids.size, t.shape[1]),
                         np.ascontiguousarray(t.data[head.vocab_ids]))
            w.output = _matrix(be, head.output, sub, "output[draft]")
        else:
            w.output = model.output
    return w


def build(cpu_model, device_info, n_ctx: int, placement: GpuSplit | Mapping | None = None, kv: KVTypes = F32_KV):
    """The model placed on a CUDA device (guild.engine.device.Device) with a plan's placement or the default
    one for the VRAM free now, its KV caches in the stored types kv."""
    a = cpu_model.args
    _check_arch(cpu_model)
    if isinstance(placement, Mapping):
        placement = GpuSplit.from_section(placement, a.n_layers)
    if placement is None:
        placement = default_placement(cpu_model, device_info.free_bytes, n_ctx, kv)
    if not placement.uses_gpu:
        need = math.ceil((Parts.of_model(cpu_model, n_ctx, kv).layer(0) + VRAM_RESERVE) / VRAM_SHARE)
        raise GpuPathError(
            f"nothing fits on {device_info.name}: one layer at a context of {n_ctx} tokens needs "
            f"{need / 2**20:.0f} MiB, {device_info.free_bytes / 2**20:.0f} MiB free"
        )
    eng = split_onto_device(cpu_model, device_backend(device_info.index), placement)  # DeviceOutOfMemoryError
    eng.placed_context, eng.placed_kv = n_ctx, kv
    return eng


def device_backend(index: int = 0):
    """The backend of CUDA device `index`: a CudaBackend, or the counting host backend standing in for a GPU
    when GUILD_FAKE_GPU is set (guild.engine.device: tests and CI run --device cuda end to end without one), its
    memory the GUILD_FAKE_GPU MiB: an allocation past them fails as on a full GPU."""
    mib = fake_gpu_mib()
    return HostBackend.fake_device(mib << 20) if mib else CudaBackend(index)
