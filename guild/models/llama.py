"""Llama-family decoder (SmolLM2, Llama 2/3, Mistral) and Mixtral-style MoE when `llama.expert_count` is set.

The window forward: T tokens at positions pos..pos+T-1 → logits [T, vocab]; every op keeps row invariance.
qwen3 / qwen3moe subclass this with QK-norm and NEOX rope.
"""

from __future__ import annotations

import numpy as np

from ..engine.backends import HOST, DeviceRows, Layout, Linear
from ..engine.forward import ForwardResult
from ..engine.state import DeviceKVCache, KVCache
from ..errors import UnsupportedQuantTypeError
from ..formats.gguf import GGUFFile, Tensor, f32
from ..formats.repack_cache import pack
from ..kernels.cpu.quant import ExpertList
from ..kvtypes import F32_KV, KVTypes
from .base import Architecture, ModelArgs, check_finite
from .decode_step import DecodeStep
from .validate import llama_layer_rules


def _expert(t, e):
    """Expert e's slice of a stacked expert tensor, as a 2-D tensor view."""
    return Tensor(f"{t.name}[{e}]", t.qtype, t.shape[1:], t.data[e])


class Layer:
    def __init__(self, g: GGUFFile, i: int, args: ModelArgs, qk_norm: bool):
        p = f"blk.{i}."
        self.attn_norm = f32(g.tensor(p + "attn_norm.weight"))
        self.qkv = Linear([g.tensor(p + f"attn_{n}.weight") for n in "qkv"])
        self.wo = Linear([g.tensor(p + "attn_output.weight")])
        self.q_norm = f32(g.tensor(p + "attn_q_norm.weight")) if qk_norm else None
        self.k_norm = f32(g.tensor(p + "attn_k_norm.weight")) if qk_norm else None
        self.ffn_norm = f32(g.tensor(p + "ffn_norm.weight"))
        self.moe = g.has(p + "ffn_gate_inp.weight")
        if self.moe:
            self.router = Linear([g.tensor(p + "ffn_gate_inp.weight")]).parts[0]
            gate, up, down = (g.tensor(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
            E = args.n_experts
            if up.qtype != gate.qtype:
                raise UnsupportedQuantTypeError(f"{g.path}: {p}ffn_gate_exps and ffn_up_exps differ in quant type")
            self.experts_gu = ExpertList(Linear([_expert(gate, e), _expert(up, e)]).parts[0] for e in range(E))
            self.experts_down = ExpertList(Linear([_expert(down, e)]).parts[0] for e in range(E))
        else:
            self.gu = Linear([g.tensor(p + "ffn_gate.weight"), g.tensor(p + "ffn_up.weight")])
            self.down = Linear([g.tensor(p + "ffn_down.weight")])

    def matrices(self) -> list:
        """Every packed matrix of the block."""
        own = self.qkv.parts + self.wo.parts
        if self.moe:
            return own + [self.router] + self.experts_gu + self.experts_down
        return own + self.gu.parts + self.down.parts


# a decode row's layers in one compiled call on the host (DecodeStep), else its halves one call each
# (Layout.attention_row, ffn_row, moe_row); off: op by op, the same bits
FUSED_ROW = True
WHOLE_STEP = True  # off: the halves a layer at a time (the per-op timings of guild.bench step)


class Llama(Architecture):
    GPU = True
    MTP_TRAINABLE = True
    ROPE_NEOX = False
    QK_NORM = False
    n_mtp = 0  # nextn (MTP) blocks the file appends after the trunk (hybrids read it from the metadata)

    def __init__(self, g: GGUFFile, args: ModelArgs):
        self.gguf, self.args = g, args
        self.layers = [Layer(g, i, args, args.qk_norm) for i in range(args.n_layers)]
        emb = g.tensor("token_embd.weight")
        self.embed = pack(emb.qtype, emb.data, emb.shape[0], emb.shape[1])
        self.out_norm = f32(g.tensor("output_norm.weight"))
        self.tied = not g.has("output.weight")
        self.output = self.embed if self.tied else Linear([g.tensor("output.weight")]).parts[0]
        self.n_rot = args.rope_dim or args.head_dim
        self.build_rope()

    @classmethod
    def from_gguf(cls, g: GGUFFile, **overrides):
        overrides.setdefault("rope_neox", cls.ROPE_NEOX)
        overrides.setdefault("qk_norm", cls.QK_NORM)
        return cls(g, ModelArgs.from_gguf(g, **overrides))

    @classmethod
    def validation_args(cls, g: GGUFFile, overrides: dict) -> tuple[ModelArgs, None]:
        return ModelArgs.from_gguf(g, **{"qk_norm": cls.QK_NORM, **overrides}), None

    @classmethod
    def layer_rules(cls, g: GGUFFile, prefix: str, args: ModelArgs, extra, layer: int | None) -> list:
        return llama_layer_rules(g, prefix, args)

    def state_bytes(self, n_ctx: int, kv: KVTypes = F32_KV) -> list[int]:
        a = self.args
        return [n_ctx * kv.token_bytes(1, a.n_kv_heads, a.head_dim)] * a.n_layers

    def blocks(self) -> list:
        return self.layers

    def set_blocks(self, blocks: list) -> None:
        self.layers = list(blocks)

    @staticmethod
    def map_block(blk, layer_object, vector):
        return layer_object(blk)

    def prefill_row_invariant(self) -> bool:
        """On the CPU every op of a block is computed row by row in a fixed order; only matrices that take
        BLAS for large chunks (unquantised wide ones, or --numerics f32) break it."""
        return self.placement is None and self.output.row_invariant and all(
            m.row_invariant for L in self.layers for m in L.matrices())

    def new_state(self, n_ctx: int | None = None, kv: KVTypes = F32_KV) -> KVCache | DeviceKVCache:
        a = self.args
        n_ctx = self.rope_positions(n_ctx)
        if self.placement is not None:  # each layer's cache where guild.engine.gpu placed the layer
            return DeviceKVCache(self.layout.layer_be, a.n_kv_heads, a.head_dim, n_ctx, kv)
        return KVCache(a.n_layers, a.n_kv_heads, a.head_dim, n_ctx, kv)

    def mtp_block(self, g: GGUFFile, bid: int) -> Layer:
        """Block `bid` of file g (an MTP head's), built like this model's layers."""
        return Layer(g, bid, self.args, self.args.qk_norm)

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, tokens, state: KVCache, last_only: bool = False) -> np.ndarray:
        """Run a window of T tokens at the state's committed position; returns logits [T, vocab] ([1, vocab] if
        last_only). The rows are written to the cache but not committed: call state.commit(keep)."""
        return self.forward_batch([(tokens, state)], last_only)[0].logits

    def block(self, li: int, L: Layer, x, h, w: Window) -> None:
        """One decoder layer over the residual rows x [R, dim] in place (h: scratch), on the layer's backend;
        `li` is the layer's slot in each state's cache (an MTP head runs its own block on its own cache). A decode
        row on the host takes each half in one compiled call where it can (the same bits: FUSED_ROW)."""
        row = x.shape[0] == 1 and FUSED_ROW
        if not (row and self._attention_row(li, L, x, w)):
            self._attention(li, L, x, h, w)
        if not (row and self._ffn_row(li, L, x, w)):
            self._ffn(li, L, x, h, w)

    def _attention_row(self, li: int, L: Layer, x, w: Window) -> bool:
        a, be, st = self.args, w.be(li), w.states[0]
        return len(w.states) == 1 and type(st) is KVCache and w.layout.attention_row(
            be, x, L.attn_norm, L.qkv, L.q_norm, L.k_norm, L.wo, a.norm_eps, (a.n_heads, a.n_kv_heads, a.head_dim),
            self.n_rot, a.rope_neox, st, li, w.pos0s[0], w.positions_on(be), *w.rope[be.name], w.scores)

    def _ffn_row(self, li: int, L: Layer, x, w: Window) -> bool:
        a, be = self.args, w.be(li)
        if not L.moe:
            return w.layout.ffn_row(be, x, L.ffn_norm, a.norm_eps, L.gu, L.down)
        if w.layout.moe_row(be, x, L.ffn_norm, a.norm_eps, L.router, L.experts_gu, L.experts_down, a.n_experts_used,
                            a.norm_topk_prob):
            w.distinct[li] = a.n_experts_used
            return True
        return False

    def _ffn(self, li: int, L: Layer, x, h, w: Window) -> None:
        """The FFN half of a layer, op by op on the layer's backend."""
        a, be = self.args, w.be(li)
        R = x.shape[0]
        if L.moe:
            hm = w.layout.moe_rows(be, R, a.dim, a.n_experts_used)
            be.rmsnorm(x, L.ffn_norm, a.norm_eps, hm)
            # the union over the batch is what this forward paid for
            ffn, w.distinct[li] = w.layout.routed_experts(be, hm, L.router, L.experts_gu, L.experts_down,
                                                          a.n_experts_used, a.norm_topk_prob)
            be.add(x, ffn)
        else:
            be.rmsnorm(x, L.ffn_norm, a.norm_eps, h)
            gu = be.empty((R, L.gu.n_out))
            be.matmul(L.gu, h, gu)
            act = be.empty((R, L.gu.n_out // 2))
            be.swiglu(gu, act)
            be.matmul(L.down, act, x, accumulate=True)

    def _attention(self, li: int, L: Layer, x, h, w: Window) -> None:
        """The attention half of a layer, op by op on the layer's backend (any rows, sessions and device)."""
        a, be = self.args, w.be(li)
        R = x.shape[0]
        H, Hkv, hd = a.n_heads, a.n_kv_heads, a.head_dim
        be.rmsnorm(x, L.attn_norm, a.norm_eps, h)
        qkv = be.empty((R, (H + 2 * Hkv) * hd))
        be.matmul(L.qkv, h, qkv)
        q, k, v = be.split_qkv(qkv, H, Hkv, hd)
        if L.q_norm is not None:
            be.rmsnorm_heads(q, L.q_norm, a.norm_eps)
            be.rmsnorm_heads(k, L.k_norm, a.norm_eps)
        pos, (cos, sin) = w.positions_on(be), w.rope[be.name]
        be.rope(q, pos, cos, sin, self.n_rot, a.rope_neox)
        be.rope(k, pos, cos, sin, self.n_rot, a.rope_neox)
        att = be.empty((R, H, hd))
        w.attend(li, be, q, k, v, att)
        be.matmul(L.wo, att.reshape(R, H * hd), x, accumulate=True)

    def forward_batch(self, windows, last_only: bool = False) -> list[ForwardResult]:
        """Windows of several sessions [(tokens, state), ...] in one pass: the rows of all windows go through
        every matmul and expert together (weights read once), attention runs per session over its own cache.
        Row invariance makes each session's logits bitwise those of running it alone (while the total stays
        within the kernels' row-invariant batch)."""
        w = Window.open(self, windows)
        x = w.embed(self)
        if FUSED_ROW and WHOLE_STEP and DecodeStep.of(self).run(self, x, w):  # a step or a window: every layer at once
            return output_logits(self, x, w, last_only)
        for li, L in enumerate(self.layers):
            x = w.enter(li, x)
            with w.be(li).activate():  # the layer's kernels on the stream its transfers use (a device's own)
                self.block(li, L, x, w.be(li).empty(x.shape), w)
            w.leave(li, x)
        return output_logits(self, x, w, last_only)


class Window:
    """What every layer of a batched forward needs besides the rows: the sessions' states, the row offsets of
    their windows, their first positions, all rows' positions (and on every backend of the layout), one
    attention-scores scratch [longest window x heads, longest context], the distinct routed experts per layer
    it records, and the layout: which backend runs each layer."""

    __slots__ = ("states", "offs", "pos0s", "positions", "scores", "distinct", "layout", "rope", "meta", "tokens",
                 "cur", "experts", "keep", "features")

    def __init__(self, states, offs, pos0s, positions, n_heads: int, n_layers: int, layout: Layout | None = None,
                 tokens: np.ndarray | None = None):
        sizes = np.diff(offs)
        max_len = max(int(p + n) for p, n in zip(pos0s, sizes, strict=True))
        self.states, self.offs, self.pos0s, self.positions = states, offs, pos0s, positions
        self.scores = np.empty((int(sizes.max()) * n_heads, max_len), np.float32)
        self.distinct = np.zeros(n_layers, np.int32)
        self.layout = layout or Layout([HOST] * n_layers, HOST, HOST, {})
        self.rope = self.layout.rope
        self.tokens = tokens if tokens is not None else np.zeros(positions.size, np.int64)
        idx = [st.dst for st in states if hasattr(st, "dst_on")]  # hybrid states' per-row buffers
        self.meta = self.layout.meta(self.tokens, positions, np.asarray(offs[1:], np.int64) - 1, idx)
        if idx:
            for name, m in self.meta.items():
                for st, d in zip((st for st in states if hasattr(st, "dst_on")), m[3], strict=True):
                    st.dst_on(name, d)
        self.cur = self.layout.embed_be
        self.experts = None  # the model's expert cache (guild.engine.experts), if it streams its experts
        self.keep: tuple[int, ...] = ()  # layers whose output rows the MTP head fuses (model.mtp_features)
        self.features: list = []  # (backend, rows) copied after each of them

    @classmethod
    def open(cls, model, windows, **begin) -> Window:
        """Begin every session's window (state.begin) and lay the rows side by side."""
        toks = [np.ascontiguousarray(t, np.int64).reshape(-1) for t, _ in windows]
        states = [st for _, st in windows]
        sizes = [t.size for t in toks]
        pos0s = [st.begin(n, **begin) for st, n in zip(states, sizes, strict=True)]
        offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        positions = np.concatenate([np.arange(p, p + n, dtype=np.int64) for p, n in zip(pos0s, sizes, strict=True)])
        a = model.args
        w = cls(states, offs, pos0s, positions, a.n_heads, a.n_layers, model.layout, np.concatenate(toks))
        w.experts = getattr(model, "expert_cache", None)
        w.keep = tuple(getattr(model, "mtp_features", ()))
        return w

    def be(self, li: int):
        return self.layout.layer_be[li]

    def positions_on(self, be):
        return self.meta[be.name][1]

    def embed(self, model):
        """The window's token embeddings [R, dim] on the embedding's backend."""
        be = self.layout.embed_be
        with be.activate():
            x = be.empty((self.tokens.size, model.args.dim))
            be.dequantize_rows(model.embed, self.meta[be.name][0], x)
        return x

    def enter(self, li: int, x):
        """x moved to layer li's backend if the placement changes there (one transfer at a boundary)."""
        be = self.be(li)
        x = self.layout.move(x, self.cur, be)
        self.cur = be
        if self.experts is not None and not be.device and li in self.experts.layers:
            self.experts.layers[li].predict(x)  # its experts read while attention runs
        return x

    def leave(self, li: int, x) -> None:
        """After layer li: a copy of its output rows when the MTP head fuses them (the next layer adds to x in
        place), left on the layer's backend."""
        if li in self.keep:
            be = self.be(li)
            with be.activate():
                self.features.append((be, be.concat([x])))  # concat of one array: a copy on that backend

    def attend(self, li: int, be, q, k, v, att) -> None:
        """Each session's rows write their keys/values into its cache and attend over it."""
        scale = np.float32(1.0 / np.sqrt(q.shape[2]))
        for i, st in enumerate(self.states):
            r0, r1 = int(self.offs[i]), int(self.offs[i + 1])
            st.write(li, k[r0:r1], v[r0:r1])
            kc, vc = st.kv_layer(li)
            be.attention(q[r0:r1], kc, vc, self.pos0s[i], scale, att[r0:r1], self.scores)


def output_logits(model, x, w: Window, last_only: bool) -> list[ForwardResult]:
    """Final norm and LM head over the residual rows x [R, dim] on the output's backend, split back per window;
    with last_only, only each window's last row. Each result keeps its window's final residual rows [T, dim]
    (before the final norm: the MTP head's input; a DeviceRows when they stay on a device, moved only when read)
    and the forward's distinct experts."""
    a, offs, lay = model.args, w.offs, w.layout
    be = lay.out_be
    x = lay.move(x, w.cur, be)
    n = len(offs) - 1
    hidden = _window_rows(lay, be, x, offs)
    feats = [_window_rows(lay, fbe, f, offs) for fbe, f in w.features]
    feats = [tuple(f[i] for f in feats) for i in range(n)]
    with be.activate():
        if last_only:
            x = be.take_rows(x, offs[1:] - 1, w.meta[be.name][2])
        h = be.empty(x.shape)
        be.rmsnorm(x, model.out_norm, a.norm_eps, h)
        logits = be.empty((x.shape[0], a.vocab_size))
        be.matmul(model.output, h, logits)
        logits = lay.download(be, logits)
    check_finite(logits, model.gguf.path)
    split = [logits[i : i + 1] for i in range(n)] if last_only else [logits[offs[i] : offs[i + 1]] for i in range(n)]
    return [ForwardResult(lg, hd, w.distinct, ft) for lg, hd, ft in zip(split, hidden, feats, strict=True)]


def _window_rows(lay, be, x, offs) -> list:
    """Each window's rows of x [R, D]: slices, or DeviceRows when x is on a device (moved only when read)."""
    n = len(offs) - 1
    if be.device:
        return [DeviceRows(lay, be, x, offs[i], offs[i + 1]) for i in range(n)]
    return [x[offs[i] : offs[i + 1]] for i in range(n)]
