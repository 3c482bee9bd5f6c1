"""GPU execution of the llama family (llama incl. Mixtral-style MoE, qwen3, qwen3moe): attention, norms, the
router, dense FFNs, embeddings/output and the KV cache on the GPU (CuPy RawKernels, kernels/cuda/), routed
experts on the CPU (Numba, kernels/cpu/moe.py).

Orchestration. The window forward below is written once against the backends of guild.engine.backends: the
CPU kernels' signatures, allocation, and staged transfers. `CudaBackend` runs it on the GPU; `HostBackend`
runs it with the CPU kernels on NumPy arrays, both for the layers a placement leaves on the CPU and, as a
separate instance (`HostBackend.fake_device()`), as a stand-in GPU in CPU tests, where the same
orchestration, transfers included (counted), must give bitwise the CPU model's logits.

Schedule of one window (one CUDA stream; pinned host staging buffers, reused across windows):

    H2D   tokens, positions, last-row indices                       (one copy)
    GPU   embedding rows
    per layer l:
      GPU   rmsnorm, q|k|v matmul, (QK-norm), rope, KV write, attention, x += Wo att, rmsnorm
      dense FFN:  GPU gate|up, swiglu, x += down
      MoE FFN:    GPU router matmul, softmax/top-k, written beside h in one staging buffer
                  D2H   h, expert ids, weights                      (one copy; the host waits for it)
                  CPU   routed experts: each chosen expert read once for all rows that chose it
                  H2D   expert output                               (one copy)
                  GPU   x += expert output
    GPU   final norm, output matmul;  D2H logits                    (one copy)

What overlaps what. Kernel launches are asynchronous: the host enqueues a layer's work and runs ahead until
the D2H of the MoE rows, the only wait per layer, so the GPU executes while Python is still launching. The
CPU experts of layer l depend on h_l (everything the GPU did in layers <= l) and every later GPU step of the
window depends on x_l + experts_l (these families have no shared expert or parallel branch), so the experts
overlap none of the window's GPU work: nothing they depend on, and nothing that does not depend on them
exists. After the experts, the H2D, the residual add and all of layer l+1 up to its D2H are enqueued back to
back without waiting. (Splitting a window into two row groups would let one group's attention overlap the
other's experts, but it reads each shared expert twice, the very union cost verification windows avoid.)

Row invariance: every GPU kernel keeps a row's arithmetic independent of T and of the other rows
(kernels/cuda/*.cu), and the CPU experts are the CPU model's, so rows stay invariant on the GPU too. GPU and
CPU logits agree within a tolerance (different summation orders), not bitwise.

Placement (GpuSplit): layers [0, gpu_layers) run on the GPU with their KV cache; later layers, if the VRAM budget is
short, run on the CPU (x crosses once at the boundary); embeddings and output on either side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import ContextOverflowError, GpuPathError, GuildError
from ..kernels.cpu.moe import experts_ffn
from ..models.base import ForwardResult
from ..plan import group_of
from .backends import CudaBackend, HostBackend

GPU_ARCHS = ("llama", "qwen3", "qwen3moe")
_ALIGN = 256  # staging buffer sections start on this many bytes
_RESERVE = 512 * 2**20  # VRAM left for the CUDA context, activations and the memory pool's slack


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
    for name in ("attention", "kv_cache", "norms", "router", "dense_ffn"):
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
    """Bytes the GPU needs per part: layers (weights + KV cache at n_ctx), embed, output."""
    a, g = model.args, model.gguf
    kv = 2 * a.n_kv_heads * a.head_dim * n_ctx * 4
    layers = []
    for i in range(a.n_layers):
        p = f"blk.{i}."
        names = ["attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"]
        names += ["ffn_gate_inp"] if a.is_moe else ["ffn_gate", "ffn_up", "ffn_down"]
        w = sum(_tensor_bytes(g.tensors[p + n + ".weight"]) for n in names if g.has(p + n + ".weight"))
        layers.append(w + kv)
    embed = _tensor_bytes(g.tensors["token_embd.weight"])
    output = embed if not g.has("output.weight") else _tensor_bytes(g.tensors["output.weight"])
    return {"layers": layers, "embed": embed, "output": output, "tied": not g.has("output.weight"), "kv_per_layer": kv}


def default_placement(model, free_bytes: int, n_ctx: int) -> GpuSplit:
    """Fill the VRAM left after a reserve: layers in order, then the output matrix, then the embeddings
    (an embedding lookup on the CPU costs only the rows' upload)."""
    s = gpu_sizes(model, n_ctx)
    budget = int(free_bytes) - _RESERVE
    n = 0
    for b in s["layers"]:
        if b > budget:
            break
        budget -= b
        n += 1
    out = n == len(s["layers"]) and s["output"] <= budget
    if out:
        budget -= s["output"]
    emb = out and (s["tied"] or s["embed"] <= budget)
    return GpuSplit(n, emb, out)


# ---------------------------------------------------------------------------------------------------------
# state
class DeviceKVCache:
    """KVCache's contract with each layer's cache on that layer's backend. `commit(keep)` and `truncate(n)`
    move the position only: attention reads positions <= pos0 + t, all written earlier or in the same window,
    so rows past the position are never read before being rewritten (no zeroing pass on the GPU)."""

    def __init__(self, engine: GpuLlama, n_ctx: int):
        a = engine.args
        self.n_ctx = n_ctx
        self.pos = 0
        self.pending = 0
        self.k, self.v = [], []
        try:
            for L in engine.layers:
                with L.be.activate():
                    self.k.append(L.be.zeros((a.n_kv_heads, a.head_dim, n_ctx)))
                    self.v.append(L.be.zeros((a.n_kv_heads, n_ctx, a.head_dim)))
        except Exception as e:
            if type(e).__name__ == "OutOfMemoryError":
                raise GpuPathError(f"GPU out of memory for a KV cache of {n_ctx} tokens") from None
            raise
        self._be = [L.be for L in engine.layers]

    def begin(self, T: int) -> int:
        if self.pending:
            raise RuntimeError("KVCache.begin: previous window not committed")
        if self.pos + T > self.n_ctx:
            raise ContextOverflowError(f"context full: {self.pos} + {T} tokens exceed the context of {self.n_ctx} "
                                       "tokens", self.n_ctx)
        self.pending = T
        return self.pos

    def write(self, layer: int, k, v) -> None:
        self._be[layer].kv_write(self.k[layer], self.v[layer], k, v, self.pos)

    def commit(self, keep: int) -> None:
        if not 0 <= keep <= self.pending:
            raise ValueError(f"commit({keep}) outside the open window of {self.pending} rows")
        self.pos += keep
        self.pending = 0

    def truncate(self, n: int) -> None:
        if self.pending:
            raise RuntimeError("KVCache.truncate: a window is open")
        self.pos = max(0, min(n, self.pos))

    @property
    def nbytes(self) -> int:
        return sum(int(k.nbytes) + int(v.nbytes) for k, v in zip(self.k, self.v, strict=True))


# ---------------------------------------------------------------------------------------------------------
# model
class _Layer:
    def __init__(self, be, cpu_layer, g, i: int, moe: bool):
        p = f"blk.{i}."
        t = g.tensor
        self.be = be
        self.attn_norm = be.upload(cpu_layer.attn_norm)
        self.qkv = be.linear(cpu_layer.qkv, [t(p + f"attn_{n}.weight") for n in "qkv"], p + "attn_qkv")
        self.wo = be.linear(cpu_layer.wo, [t(p + "attn_output.weight")], p + "attn_output")
        self.q_norm = None if cpu_layer.q_norm is None else be.upload(cpu_layer.q_norm)
        self.k_norm = None if cpu_layer.k_norm is None else be.upload(cpu_layer.k_norm)
        self.ffn_norm = be.upload(cpu_layer.ffn_norm)
        if moe:
            self.router = be.linear(cpu_layer.router, [t(p + "ffn_gate_inp.weight")], p + "ffn_gate_inp")
            self.experts_gu, self.experts_down = cpu_layer.experts_gu, cpu_layer.experts_down  # CPU, always
        else:
            self.gu = be.linear(cpu_layer.gu, [t(p + "ffn_gate.weight"), t(p + "ffn_up.weight")], p + "ffn_gate_up")
            self.down = be.linear(cpu_layer.down, [t(p + "ffn_down.weight")], p + "ffn_down")


class _Staging:
    """A growable host buffer (pinned on a GPU) and, if `with_dev`, its device twin; reused across windows.
    Reuse is safe: every window ends waiting for the stream, and within a window each reuse comes after a
    wait that orders it behind the previous use."""

    def __init__(self, with_dev: bool = True):
        self.with_dev = with_dev
        self.dev = self.host = None
        self.size = 0

    def get(self, be, nbytes: int):
        if nbytes > self.size:
            self.size = max(nbytes, 2 * self.size)
            self.dev = be.empty((self.size,), np.uint8) if self.with_dev and be.device else None
            self.host = be.pinned(self.size)
        return self.dev, self.host


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class GpuLlama:
    """A llama-family model with the placement's share on `device` (a CudaBackend, or a fake device in tests)
    and the rest, routed experts always, on the CPU. Same interface as models.llama.Llama for sessions:
    `args`, `gguf`, `new_state`, `forward`, `forward_batch`."""

    hosts_mtp_head = False  # the MTP head's block runs with the CPU model's layers only

    def __init__(self, cpu_model, device, placement: GpuSplit, host: HostBackend | None = None):
        a = cpu_model.args
        if a.arch not in GPU_ARCHS:
            raise GpuPathError(f"the GPU path supports {', '.join(GPU_ARCHS)}, not '{a.arch}'")
        if a.head_dim > 256:
            raise GpuPathError(f"head_dim {a.head_dim} > 256 is not supported on the GPU")
        if not 0 <= placement.gpu_layers <= a.n_layers:
            raise GpuPathError(f"placement: gpu_layers {placement.gpu_layers} not in 0..{a.n_layers}")
        self.cpu, self.args, self.gguf = cpu_model, a, cpu_model.gguf
        self.dev, self.host, self.placement = device, host or HostBackend(), placement
        g = self.gguf
        self.n_rot = cpu_model.n_rot
        self.layers = []
        self._tables = {}  # backend name -> (cos, sin)
        for i, cl in enumerate(cpu_model.layers):
            be = device if i < placement.gpu_layers else self.host
            with be.activate():
                self.layers.append(_Layer(be, cl, g, i, a.is_moe))
                self._rope_tables(be)
        self.embed_be = device if placement.embed_gpu else self.host
        self.out_be = device if placement.output_gpu else self.host
        emb_t = g.tensor("token_embd.weight")
        with self.embed_be.activate():
            self.embed = self.embed_be.linear(cpu_model.embed, [emb_t], "token_embd")
        with self.out_be.activate():
            if cpu_model.tied:
                same = self.out_be is self.embed_be
                self.output = self.embed if same else self.out_be.linear(cpu_model.output, [emb_t], "output")
            else:
                self.output = self.out_be.linear(cpu_model.output, [g.tensor("output.weight")], "output")
            self.out_norm = self.out_be.upload(cpu_model.out_norm)
        self._stage = _Staging()  # MoE rows: ids | weights | h  (D2H)
        self._ffn = _Staging()  # expert output (H2D)
        self._meta = _Staging()  # tokens | positions | last rows (H2D)
        self._logits = _Staging(with_dev=False)  # logits (D2H)
        self._move = _Staging(with_dev=False)  # x across the placement boundary

    @property
    def returns_hidden(self) -> bool:
        """The final residual rows come back only when the output side is the host (no transfer for them)."""
        return not self.out_be.device

    def _rope_tables(self, be):
        if be.name not in self._tables:
            self._tables[be.name] = (be.upload(self.cpu.cos), be.upload(self.cpu.sin))

    @classmethod
    def build(cls, cpu_model, device_info, n_ctx: int, placement: GpuSplit | Mapping | None = None) -> GpuLlama:
        """The GPU engine on a CUDA device (guild.engine.device.Device) with a plan's placement or the default."""
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
            return cls(cpu_model, CudaBackend(device_info.index), placement)
        except Exception as e:
            if type(e).__name__ == "OutOfMemoryError":
                raise GpuPathError(f"GPU out of memory while uploading the model ({e})") from None
            raise

    def describe(self) -> str:
        p = self.placement
        return (f"{self.dev.name}: {p.gpu_layers}/{self.args.n_layers} layers"
                + (", embeddings" if p.embed_gpu else "") + (", output" if p.output_gpu else "")
                + (", experts on CPU" if self.args.is_moe else ""))

    def new_state(self, n_ctx: int | None = None) -> DeviceKVCache:
        a = self.args
        n_ctx = min(n_ctx or a.context_length, a.context_length)
        return DeviceKVCache(self, n_ctx)

    def forward(self, tokens, state: DeviceKVCache, last_only: bool = False) -> np.ndarray:
        return self.forward_batch([(tokens, state)], last_only)[0].logits

    # -- the window ---------------------------------------------------------------------------------
    def _to(self, x, src, dst):
        """Move x [R, D] (contiguous) from backend src to dst, through a pinned host buffer."""
        if src is dst:
            return x
        if not src.device and not dst.device:
            return x
        nbytes = x.size * 4
        if src.device:
            with src.activate():
                _, host = self._move.get(src, nbytes)
                src.to_host(src.bytes_of(x), host[:nbytes])
                src.wait()
            x_host = host[:nbytes].view(np.float32).reshape(x.shape).copy()
            if not dst.device:
                return x_host
            x = x_host
        with dst.activate():
            _, host = self._move.get(dst, nbytes)
            host[:nbytes] = x.reshape(-1).view(np.uint8)
            out = dst.empty(x.shape)
            dst.to_device(host[:nbytes], dst.bytes_of(out))
        return out

    def forward_batch(self, windows, last_only: bool = False) -> list[ForwardResult]:
        """Windows of several sessions [(tokens, state), ...] in one pass, as models.llama.Llama.forward_batch.
        The final residual rows come back only when they end on the host (no transfer is made for them)."""
        a = self.args
        toks = [np.ascontiguousarray(t, np.int64).reshape(-1) for t, _ in windows]
        states = [st for _, st in windows]
        sizes = [t.size for t in toks]
        pos0s = [st.begin(n) for st, n in zip(states, sizes, strict=True)]
        offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        R = int(offs[-1])
        positions = np.concatenate([np.arange(p, p + n, dtype=np.int64) for p, n in zip(pos0s, sizes, strict=True)])
        last = offs[1:] - 1
        meta_host = np.concatenate([np.concatenate(toks), positions, last])
        # the window's indices on the device: one H2D
        dev = self.dev
        meta = {self.host.name: (meta_host[:R], meta_host[R : 2 * R], last)}
        if dev.device and any(be is dev for be in (self.embed_be, self.out_be, *(L.be for L in self.layers))):
            with dev.activate():
                d, h = self._meta.get(dev, meta_host.nbytes)
                h[: meta_host.nbytes] = meta_host.view(np.uint8)
                dev.to_device(h[: meta_host.nbytes], d[: meta_host.nbytes])
                md = d[: meta_host.nbytes].view(np.int64)
                meta[dev.name] = (md[:R], md[R : 2 * R], md[2 * R :])
        H, Hkv, hd, D = a.n_heads, a.n_kv_heads, a.head_dim, a.dim
        scale = 1.0 / np.sqrt(hd)
        eps = a.norm_eps

        distinct = np.zeros(a.n_layers, np.int32)
        be = self.embed_be
        with be.activate():
            x = be.empty((R, D))
            be.dequantize_rows(self.embed, meta[be.name][0], x)
        for li, L in enumerate(self.layers):
            x = self._to(x, be, L.be)
            be = L.be
            with be.activate():
                pos = meta[be.name][1]
                cos, sin = self._tables[be.name]
                h = be.empty((R, D))
                be.rmsnorm(x, L.attn_norm, eps, h)
                qkv = be.empty((R, (H + 2 * Hkv) * hd))
                be.matmul(L.qkv, h, qkv)
                q, k, v = be.split_qkv(qkv, H, Hkv, hd)
                if L.q_norm is not None:
                    be.rmsnorm_heads(q, L.q_norm, eps)
                    be.rmsnorm_heads(k, L.k_norm, eps)
                be.rope(q, pos, cos, sin, self.n_rot, a.rope_neox)
                be.rope(k, pos, cos, sin, self.n_rot, a.rope_neox)
                att = be.empty((R, H, hd))
                for i, st in enumerate(states):
                    r0, r1 = int(offs[i]), int(offs[i + 1])
                    st.write(li, k[r0:r1], v[r0:r1])
                    be.attention(q[r0:r1], st.k[li], st.v[li], pos0s[i], scale, att[r0:r1])
                be.matmul(L.wo, att.reshape(R, H * hd), x, accumulate=True)
                if a.is_moe:
                    distinct[li] = self._moe(L, be, x, R)  # the union over the batch is what it paid for
                else:
                    be.rmsnorm(x, L.ffn_norm, eps, h)
                    gu = be.empty((R, L.gu.n_out))
                    be.matmul(L.gu, h, gu)
                    act = be.empty((R, gu.shape[1] // 2))
                    be.swiglu(gu, act)
                    be.matmul(L.down, act, x, accumulate=True)
        x = self._to(x, be, self.out_be)
        be = self.out_be
        n = len(windows)
        hidden = [None] * n if be.device else [x[offs[i] : offs[i + 1]] for i in range(n)]
        with be.activate():
            if last_only:
                x = be.take_rows(x, last, meta[be.name][2])
            n_out = x.shape[0]
            h = be.empty((n_out, D))
            be.rmsnorm(x, self.out_norm, eps, h)
            logits = be.empty((n_out, a.vocab_size))
            be.matmul(self.output, h, logits)
            if be.device:
                nbytes = n_out * a.vocab_size * 4
                _, host = self._logits.get(be, nbytes)
                be.to_host(be.bytes_of(logits), host[:nbytes])
                be.wait()
                logits = host[:nbytes].view(np.float32).reshape(n_out, a.vocab_size).copy()
        rows = [(i, i + 1) for i in range(n)] if last_only else [(offs[i], offs[i + 1]) for i in range(n)]
        split = [logits[a:b] for a, b in rows]
        return [ForwardResult(lg, hd, distinct) for lg, hd in zip(split, hidden, strict=True)]

    def _moe(self, L, be, x, R: int) -> int:
        """Route on `be`, run the experts on the CPU, add their output into x (one D2H + one H2D on a device)."""
        a = self.args
        D, k, E = a.dim, a.n_experts_used, a.n_experts
        o_w = _align(R * k * 8)
        o_h = o_w + _align(R * k * 4)
        nbytes = o_h + R * D * 4
        if be.device:
            buf, host = self._stage.get(be, nbytes)
        else:
            buf = host = np.empty(nbytes, np.uint8)
        ids = be.view(buf, 0, (R, k), np.int64)
        w = be.view(buf, o_w, (R, k), np.float32)
        h = be.view(buf, o_h, (R, D), np.float32)
        be.rmsnorm(x, L.ffn_norm, a.norm_eps, h)
        logits = be.empty((R, E))
        be.matmul(L.router, h, logits)
        be.softmax_topk(logits, k, a.norm_topk_prob, ids, w)
        if be.device:
            be.to_host(buf[:nbytes], host[:nbytes])
            be.wait()  # the only wait of the layer: the experts need these rows
        hh = host[o_h:nbytes].view(np.float32).reshape(R, D)
        ww = host[o_w : o_w + R * k * 4].view(np.float32).reshape(R, k)
        ii = host[: R * k * 8].view(np.int64).reshape(R, k)
        if not be.device:
            out = np.empty((R, D), np.float32)
            n = experts_ffn(hh, ii, ww, L.experts_gu, L.experts_down, out)
            x += out
            return n
        fdev, fhost = self._ffn.get(be, R * D * 4)
        out = fhost[: R * D * 4].view(np.float32).reshape(R, D)
        n = experts_ffn(hh, ii, ww, L.experts_gu, L.experts_down, out)
        be.to_device(fhost[: R * D * 4], fdev[: R * D * 4])
        be.add(x, fdev[: R * D * 4].view(np.float32).reshape(R, D))
        return n
