"""Hybrid Gated-DeltaNet MoE decoder shared by qwen3next (Qwen3-Next) and qwen35moe (Qwen3.5-MoE).

Layers are Gated DeltaNet (linear attention with a recurrent state) except every `full_attention_interval`-th,
which is gated full attention; every layer has routed experts plus a sigmoid-gated shared expert. GGUF layout
as llama.cpp's converter writes it (conversion/qwen.py): norms stored with the +1 folded in except
`ssm_norm`, `ssm_a` = -exp(A_log), `ssm_conv1d` [C, K], `attn_q` = [query_h | gate_h] per head. Decode math per
HF transformers' modeling_qwen3_next. The window forward keeps row invariance; the recurrent state rolls back
per row through guild.engine.state.HybridState.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.backends import Linear
from ..engine.forward import ForwardResult
from ..engine.state import DeviceHybridState, HybridState
from ..errors import GuildError, MetadataError
from ..formats.gguf import GGUFFile, Tensor, f32
from ..formats.repack_cache import pack
from ..kernels.cpu.quant import ExpertList
from ..kvtypes import F32_KV, KVTypes
from ..window import MAX_WINDOW
from .base import Architecture, ModelArgs
from .llama import Window, _expert, output_logits
from .validate import hybrid_layer_rules


@dataclass(frozen=True)
class DeltaNetArgs:
    conv_kernel: int  # ssm.conv_kernel
    head_dim: int  # ssm.state_size: dk = dv
    k_heads: int  # ssm.group_count
    v_heads: int  # ssm.time_step_rank
    recurrent: tuple[bool, ...]  # per layer: DeltaNet (True) or full attention
    shared_ffn_dim: int  # expert_shared_feed_forward_length
    v_tiled: bool  # value head j reads key head j % k_heads (qwen35moe) instead of j // (v_heads / k_heads)

    def __post_init__(self):
        for f in ("conv_kernel", "head_dim", "k_heads", "v_heads"):
            if getattr(self, f) <= 0:
                raise GuildError(f"hybrid model: ssm {f} must be positive, got {getattr(self, f)}")
        if self.v_heads % self.k_heads:
            raise GuildError(f"hybrid model: ssm.time_step_rank {self.v_heads} not a multiple of group_count")

    @property
    def conv_dim(self) -> int:  # channels of the conv: [q | k | v]
        return (2 * self.k_heads + self.v_heads) * self.head_dim

    @property
    def kmap(self) -> np.ndarray:
        j = np.arange(self.v_heads)
        return j % self.k_heads if self.v_tiled else j // (self.v_heads // self.k_heads)

    @classmethod
    def from_gguf(cls, g: GGUFFile, n_layers: int, v_tiled: bool) -> DeltaNetArgs:
        a = g.architecture
        dk = g.get(f"{a}.ssm.state_size", int)
        nv = g.get(f"{a}.ssm.time_step_rank", int)
        inner = g.get(f"{a}.ssm.inner_size", int)
        if inner != dk * nv:
            raise MetadataError(f"{g.path}: {a}.ssm.inner_size {inner} != state_size {dk} x time_step_rank {nv}")
        rec = g.get(f"{a}.attention.recurrent_layers", list, None)
        if rec is None:
            every = g.get(f"{a}.full_attention_interval", int, 4)
            if every <= 0:
                raise MetadataError(f"{g.path}: {a}.full_attention_interval must be positive, got {every}")
            rec = [(i + 1) % every != 0 for i in range(n_layers)]
        return cls(
            conv_kernel=g.get(f"{a}.ssm.conv_kernel", int), head_dim=dk, k_heads=g.get(f"{a}.ssm.group_count", int),
            v_heads=nv, recurrent=tuple(bool(x) for x in rec[:n_layers]),
            shared_ffn_dim=g.get(f"{a}.expert_shared_feed_forward_length", int, 0), v_tiled=v_tiled,
        )


def _rows(t: Tensor, idx: np.ndarray) -> Tensor:
    """Tensor made of rows idx of a 2-D tensor (rows stay whole quant blocks)."""
    return Tensor(t.name, t.qtype, (idx.size, t.shape[1]), np.ascontiguousarray(t.data[idx]))


class DeltaNetLayer:
    """Weights of one Gated DeltaNet token mixer; `proj` fuses every input projection: [q k v | z | b | a]."""

    def __init__(self, g: GGUFFile, p: str, d: DeltaNetArgs, ba_fused: bool):
        nk, nv, dk = d.k_heads, d.v_heads, d.head_dim
        r = nv // nk
        if g.has(p + "ssm_in.weight"):  # older qwen3next files: [q, k, v, z] per key-head group
            w = g.tensor(p + "ssm_in.weight")
            grp = (2 + 2 * r) * dk
            base = np.arange(nk)[:, None] * grp
            part = [(base + off + np.arange(n)).ravel() for off, n in ((0, dk), (dk, dk), (2 * dk, r * dk))]
            z_rows = (base + (2 + r) * dk + np.arange(r * dk)).ravel()
            parts = [_rows(w, np.concatenate(part)), _rows(w, z_rows)]
        else:
            parts = [g.tensor(p + "attn_qkv.weight"), g.tensor(p + "attn_gate.weight")]
        if ba_fused:  # qwen3next ssm_ba: [b (r), a (r)] per key-head group -> [b | a] in value-head order
            ba = g.tensor(p + "ssm_ba.weight")
            grp = np.arange(nk)[:, None] * 2 * r + np.arange(r)
            parts += [_rows(ba, grp.ravel()), _rows(ba, (grp + r).ravel())]
        else:
            parts += [g.tensor(p + "ssm_beta.weight"), g.tensor(p + "ssm_alpha.weight")]
        self.proj = Linear(parts)
        if self.proj.n_out != d.conv_dim + nv * dk + 2 * nv:
            raise GuildError(f"{g.path}: {p}DeltaNet projections have {self.proj.n_out} rows, "
                             f"want {d.conv_dim + nv * dk + 2 * nv} from the ssm.* metadata")
        conv = f32(g.tensor(p + "ssm_conv1d.weight")).reshape(d.conv_dim, d.conv_kernel)
        self.conv_wt = np.ascontiguousarray(conv.T)  # [K, C]
        self.dt_bias = f32(g.tensor(p + "ssm_dt.bias"))
        self.a = f32(g.tensor(p + "ssm_a"))
        self.norm = f32(g.tensor(p + "ssm_norm.weight"))
        self.out = Linear([g.tensor(p + "ssm_out.weight")])


class AttentionLayer:
    """Gated full attention: attn_q gives [query | output gate] per head, QK-norm, partial rope."""

    def __init__(self, g: GGUFFile, p: str):
        self.qkv = Linear([g.tensor(p + f"attn_{n}.weight") for n in "qkv"])
        self.q_norm = f32(g.tensor(p + "attn_q_norm.weight"))
        self.k_norm = f32(g.tensor(p + "attn_k_norm.weight"))
        self.wo = Linear([g.tensor(p + "attn_output.weight")])


class MoeLayer:
    """Routed experts (softmax -> top-k -> renormalise) plus the shared expert scaled by sigmoid(w . x)."""

    def __init__(self, g: GGUFFile, p: str, args: ModelArgs):
        self.router = Linear([g.tensor(p + "ffn_gate_inp.weight")]).parts[0]
        gate, up, down = (g.tensor(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        self.experts_gu = ExpertList(Linear([_expert(gate, e), _expert(up, e)]).parts[0]
                                     for e in range(args.n_experts))
        self.experts_down = ExpertList(Linear([_expert(down, e)]).parts[0] for e in range(args.n_experts))
        self.shexp_gu = Linear([g.tensor(p + "ffn_gate_shexp.weight"), g.tensor(p + "ffn_up_shexp.weight")])
        self.shexp_down = Linear([g.tensor(p + "ffn_down_shexp.weight")])
        sg = g.tensor(p + "ffn_gate_inp_shexp.weight")
        self.shexp_gate = Linear([Tensor(sg.name, sg.qtype, (1, args.dim), sg.data.reshape(1, -1))])


class HybridMoe(Architecture):
    """Window forward of a hybrid DeltaNet/attention MoE; `V_TILED`, `BA_FUSED` set by the architecture."""

    GPU = True
    V_TILED = False
    BA_FUSED = True

    def __init__(self, g: GGUFFile, args: ModelArgs, d: DeltaNetArgs, rollback: str = "snapshot"):
        self.gguf, self.args, self.d, self.rollback = g, args, d, rollback
        self.n_mtp = 0  # MTP blocks after the trunk (set by from_gguf)
        if len(d.recurrent) != args.n_layers:
            raise MetadataError(f"{g.path}: recurrent_layers has {len(d.recurrent)} entries for "
                                f"{args.n_layers} layers")
        self.mixers = []
        self.ffns = []
        self.norms = []
        for i in range(args.n_layers):
            p = f"blk.{i}."
            self.mixers.append(DeltaNetLayer(g, p, d, self.BA_FUSED) if d.recurrent[i] else AttentionLayer(g, p))
            self.ffns.append(MoeLayer(g, p, args))
            self.norms.append((f32(g.tensor(p + "attn_norm.weight")), f32(g.tensor(p + "post_attention_norm.weight"))))
        emb = g.tensor("token_embd.weight")
        self.embed = pack(emb.qtype, emb.data, emb.shape[0], emb.shape[1])
        self.out_norm = f32(g.tensor("output_norm.weight"))
        self.output = self.embed if not g.has("output.weight") else Linear([g.tensor("output.weight")]).parts[0]
        self.n_rot = args.rope_dim or args.head_dim
        self.build_rope()

    @classmethod
    def from_gguf(cls, g: GGUFFile, rollback: str = "snapshot", **overrides):
        a = g.architecture
        n_mtp = g.get(f"{a}.nextn_predict_layers", int, 0)  # MTP blocks appended after the trunk: not run here
        overrides.setdefault("n_layers", g.get(f"{a}.block_count", int) - n_mtp)
        overrides.setdefault("rope_neox", True)
        overrides.setdefault("qk_norm", True)
        overrides.setdefault("norm_topk_prob", True)  # llama.cpp hard-codes it for both architectures
        args = ModelArgs.from_gguf(g, **overrides)
        if not args.is_moe:
            raise MetadataError(f"{g.path}: {a} needs {a}.expert_count > 0")
        model = cls(g, args, DeltaNetArgs.from_gguf(g, args.n_layers, cls.V_TILED), rollback)
        model.n_mtp = n_mtp
        return model

    @property
    def layer_pattern(self) -> str:
        """One letter per block: R Gated DeltaNet, A full attention, M an MTP block (in the file, not run), e.g.
        "RRRARRRA": the string guild.cli.inspect.layer_pattern derives from the metadata."""
        return "".join("R" if r else "A" for r in self.d.recurrent) + "M" * self.n_mtp

    def mtp_block(self, g: GGUFFile, bid: int):
        """Block `bid` of file g (an MTP block: full attention + MoE), in the form `block` runs."""
        p = f"blk.{bid}."
        norms = (f32(g.tensor(p + "attn_norm.weight")), f32(g.tensor(p + "post_attention_norm.weight")))
        return norms, AttentionLayer(g, p), MoeLayer(g, p, self.args)

    @classmethod
    def validation_args(cls, g: GGUFFile, overrides: dict) -> tuple[ModelArgs, DeltaNetArgs]:
        a = g.architecture
        n_mtp = g.get(f"{a}.nextn_predict_layers", int, 0)
        n_layers = g.get(f"{a}.block_count", int) - n_mtp
        if n_mtp < 0 or not 0 < n_layers <= len(g.tensors):
            raise MetadataError(f"{g.path}: {a}.block_count minus nextn_predict_layers ({n_layers}) must be "
                                f"in 1..{len(g.tensors)}")
        args = ModelArgs.from_gguf(g, **{"n_layers": n_layers, "qk_norm": True, **overrides})
        if not args.is_moe:
            raise MetadataError(f"{g.path}: {a} needs {a}.expert_count > 0")
        d = DeltaNetArgs.from_gguf(g, args.n_layers, cls.V_TILED)
        if len(d.recurrent) != args.n_layers:
            raise MetadataError(f"{g.path}: {a}.attention.recurrent_layers has {len(d.recurrent)} entries "
                                f"for {args.n_layers} layers")
        return args, d

    @classmethod
    def layer_rules(cls, g: GGUFFile, prefix: str, args: ModelArgs, extra, layer: int | None) -> list:
        recurrent = layer is not None and extra.recurrent[layer]  # an MTP block is full attention
        return hybrid_layer_rules(g, prefix, recurrent, cls.BA_FUSED)

    def state_bytes(self, n_ctx: int, kv: KVTypes = F32_KV) -> list[int]:
        """A KV cache per attention layer; per DeltaNet layer a float32 snapshot pool of 1 + MAX_WINDOW states
        and the conv history."""
        a, d = self.args, self.d
        cache = n_ctx * kv.token_bytes(1, a.n_kv_heads, a.head_dim)
        rec = ((1 + MAX_WINDOW) * d.v_heads * d.head_dim * d.head_dim + (d.conv_kernel - 1) * d.conv_dim) * 4
        return [rec if r else cache for r in d.recurrent]

    def blocks(self) -> list:
        return list(zip(self.norms, self.mixers, self.ffns, strict=True))

    def set_blocks(self, blocks: list) -> None:
        self.norms, self.mixers, self.ffns = ([b[j] for b in blocks] for j in range(3))

    @staticmethod
    def map_block(blk, layer_object, vector):
        (n_in, n_post), mixer, ffn = blk
        return (vector(n_in), vector(n_post)), layer_object(mixer), layer_object(ffn)

    def new_state(self, n_ctx: int | None = None, kv: KVTypes = F32_KV, rollback: str | None = None) -> HybridState:
        a, d = self.args, self.d
        n_ctx = self.rope_positions(n_ctx)
        rec = [i for i, r in enumerate(d.recurrent) if r]
        att = [i for i, r in enumerate(d.recurrent) if not r]
        if self.placement is not None:  # each layer's state where guild.engine.gpu placed the layer
            return DeviceHybridState(self.layout.layer_be, att, rec, a.n_kv_heads, a.head_dim, n_ctx, d.kmap,
                                     d.head_dim, d.head_dim, d.conv_dim, d.conv_kernel, rollback or self.rollback, kv)
        return HybridState(a.n_layers, att, rec, a.n_kv_heads, a.head_dim, n_ctx, d.kmap, d.head_dim, d.head_dim,
                           d.conv_dim, d.conv_kernel, rollback or self.rollback, kv)

    def forward(self, tokens, state: HybridState, last_only: bool = False) -> np.ndarray:
        """Logits [T, vocab] ([1, vocab] if last_only) of a window at the state's position; the rows are
        written but not committed: call state.commit(keep)."""
        return self.forward_batch([(tokens, state)], last_only)[0].logits

    def forward_batch(self, windows, last_only: bool = False) -> list[ForwardResult]:
        """Windows of several sessions in one pass: rows side by side through every matmul and expert; the
        recurrence, conv and attention run per session over its own state."""
        w = Window.open(self, windows, prefill=last_only)
        x = w.embed(self)
        for li in range(self.args.n_layers):
            x = w.enter(li, x)
            with w.be(li).activate():  # the layer's kernels on the stream its transfers use (a device's own)
                self.block(li, (self.norms[li], self.mixers[li], self.ffns[li]), x, w.be(li).empty(x.shape), w)
            w.leave(li, x)
        return output_logits(self, x, w, last_only)

    def block(self, li: int, blk, x, h, w: Window) -> None:
        """One block (norms, mixer, MoE) over the residual rows x in place, on the layer's backend; `li` is its
        slot in each state (an MTP head runs its own attention block on its own one-layer KV cache)."""
        (norm_in, norm_post), mixer, ffn = blk
        be = w.be(li)
        be.rmsnorm(x, norm_in, self.args.norm_eps, h)
        if isinstance(mixer, DeltaNetLayer):
            be.add(x, self._deltanet(li, be, mixer, h, w))
        else:
            be.add(x, self._attention(li, be, mixer, h, w))
        hm = w.layout.moe_rows(be, x.shape[0], self.args.dim, self.args.n_experts_used)
        be.rmsnorm(x, norm_post, self.args.norm_eps, hm)
        be.add(x, self._moe(li, be, ffn, hm, w))

    def _deltanet(self, li: int, be, L: DeltaNetLayer, h, w: Window):
        d, eps = self.d, self.args.norm_eps
        states, offs = w.states, w.offs
        R = h.shape[0]
        nk, nv, dk = d.k_heads, d.v_heads, d.head_dim
        C = d.conv_dim
        proj = be.empty((R, L.proj.n_out))  # [R, C + nv dk + 2 nv]: [q k v | z | b | a]
        be.matmul(L.proj, h, proj)
        xconv = be.contiguous(proj[:, :C])
        z = be.contiguous(proj[:, C : C + nv * dk]).reshape(R, nv, dk)
        b = be.contiguous(proj[:, C + nv * dk : C + nv * dk + nv])
        alpha = be.contiguous(proj[:, C + nv * dk + nv :])
        g = be.empty((R, nv))
        beta = be.empty((R, nv))
        be.gdn_gates(alpha, b, L.dt_bias, L.a, g, beta)
        conv = be.empty((R, C))
        for i, st in enumerate(states):
            r0, r1 = offs[i], offs[i + 1]
            be.conv1d_silu(xconv[r0:r1], st.recurrent(li)[1], L.conv_wt, conv[r0:r1])
        q = be.contiguous(conv[:, : nk * dk]).reshape(R, nk, dk)
        k = be.contiguous(conv[:, nk * dk : 2 * nk * dk]).reshape(R, nk, dk)
        v = be.contiguous(conv[:, 2 * nk * dk :]).reshape(R, nv, dk)
        be.l2norm_heads(q, 1e-6)  # HF l2norm: x / sqrt(sum x^2 + 1e-6)
        be.l2norm_heads(k, 1e-6)
        core = be.empty((R, nv, dk))
        for i, st in enumerate(states):
            r0, r1 = offs[i], offs[i + 1]
            pool = st.recurrent(li)[0]
            _, kmap, dst = st.rec_args(li)
            be.gdn_recurrence(q[r0:r1], k[r0:r1], v[r0:r1], g[r0:r1], beta[r0:r1], kmap, st.scale, pool, st.cur,
                              dst, core[r0:r1])
            st.keep_rows(li, xconv[r0:r1], q[r0:r1], k[r0:r1], v[r0:r1], g[r0:r1], beta[r0:r1])
        y = be.empty((R, nv, dk))
        be.gated_rmsnorm(core, z, L.norm, eps, y)
        out = be.empty((R, L.out.n_out))
        be.matmul(L.out, y.reshape(R, nv * dk), out)
        return out

    def _attention(self, li: int, be, L: AttentionLayer, h, w: Window):
        a = self.args
        R = h.shape[0]
        H, Hkv, hd = a.n_heads, a.n_kv_heads, a.head_dim
        qkv = be.empty((R, L.qkv.n_out))  # [R, 2 H hd + 2 Hkv hd]
        be.matmul(L.qkv, h, qkv)
        qg = qkv[:, : 2 * H * hd].reshape(R, H, 2 * hd)
        q = be.contiguous(qg[:, :, :hd])
        gate = be.contiguous(qg[:, :, hd:]).reshape(R, H * hd)
        k = be.contiguous(qkv[:, 2 * H * hd : (2 * H + Hkv) * hd]).reshape(R, Hkv, hd)
        v = be.contiguous(qkv[:, (2 * H + Hkv) * hd :]).reshape(R, Hkv, hd)
        be.rmsnorm_heads(q, L.q_norm, a.norm_eps)
        be.rmsnorm_heads(k, L.k_norm, a.norm_eps)
        pos, (cos, sin) = w.positions_on(be), w.rope[be.name]
        be.rope(q, pos, cos, sin, self.n_rot, True)
        be.rope(k, pos, cos, sin, self.n_rot, True)
        att = be.empty((R, H, hd))
        w.attend(li, be, q, k, v, att)
        gated = be.empty((R, H * hd))
        be.sigmoid_mul(att.reshape(R, H * hd), gate, gated)
        out = be.empty((R, L.wo.n_out))
        be.matmul(L.wo, gated, out)
        return out

    def _moe(self, li: int, be, L: MoeLayer, h, w: Window):
        a = self.args
        R = h.shape[0]
        ffn, w.distinct[li] = w.layout.routed_experts(be, h, L.router, L.experts_gu, L.experts_down,
                                                      a.n_experts_used, a.norm_topk_prob)
        gu = be.empty((R, L.shexp_gu.n_out))
        be.matmul(L.shexp_gu, h, gu)
        act = be.empty((R, L.shexp_gu.n_out // 2))
        be.swiglu(gu, act)
        shared = be.empty((R, L.shexp_down.n_out))
        be.matmul(L.shexp_down, act, shared)
        sg = be.empty((R, 1))
        be.matmul(L.shexp_gate, h, sg)
        gated = be.empty((R, a.dim))
        be.sigmoid_mul(shared, sg, gated)
        be.add(ffn, gated)  # llama.cpp: (routed + shared) + residual
        return ffn
