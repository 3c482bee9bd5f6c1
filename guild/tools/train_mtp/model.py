"""train-mtp's torch model: the base's last layer as the head's block, the head, quantisation-aware training and
the fused LM-head cross-entropy."""

from __future__ import annotations

import math

import numpy as np

from ...formats.gguf import f32
from ...kernels.rope import rope_tables
from .config import CE_CHUNK, EMB_INIT_REL, QUANTIZABLE
from .write import written_type

# =========================================================================================================
# Base weights and the torch head
# =========================================================================================================
BLOCK_TENSORS_ATTN = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output")
FFN_DENSE = ("ffn_gate", "ffn_up", "ffn_down")
FFN_MOE = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def base_block(g, args) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The base's last layer dequantised to float32 ({short name: array}, numpy shapes as in the GGUF) and the
    quant type names of its tensors."""

    p = f"blk.{args.n_layers - 1}."
    names = list(BLOCK_TENSORS_ATTN)
    if args.qk_norm:
        names += ["attn_q_norm", "attn_k_norm"]
    names += ["ffn_norm", *(FFN_MOE if args.is_moe else FFN_DENSE)]
    weights, qtypes = {}, {}
    for n in names:
        t = g.tensor(p + n + ".weight")
        weights[n] = np.array(f32(t), np.float32)  # a writable copy (f32 may return the mmap)
        qtypes[n] = t.qtype.name
    return weights, qtypes


def fake_quant(torch, w, qtype: str):
    """w rounded as gguf.quants.quantize + dequantize would round it (Q4_0, Q4_1, Q5_0, Q8_0: blocks of 32 along
    the last axis, f16 scales), with a straight-through gradient: quantisation-aware training, so that the
    head written in the base's quant type is the head that was trained."""
    b = w.detach().reshape(-1, 32)
    if qtype == "Q4_1":
        mx, mn = b.amax(-1, keepdim=True), b.amin(-1, keepdim=True)
        d = (mx - mn) / 15
        q = torch.trunc((b - mn) * torch.where(d == 0, 0.0, 1.0 / d) + 0.5).clamp(0, 15)
        deq = q * d.half().float() + mn.half().float()
    elif qtype in ("Q4_0", "Q5_0"):
        n = 8.0 if qtype == "Q4_0" else 16.0
        d = b.gather(-1, b.abs().argmax(-1, keepdim=True)) / -n
        q = torch.trunc(b * torch.where(d == 0, 0.0, 1.0 / d) + (n + 0.5)).clamp(0, 2 * n - 1)
        deq = (q - n) * d.half().float()
    elif qtype == "Q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        x = b * torch.where(d == 0, 0.0, 1.0 / d)
        a = x.abs()
        q = torch.sign(x) * (torch.floor(a) + torch.floor(2 * (a - torch.floor(a))))
        deq = q * d.half().float()
    else:
        raise ValueError(f"fake_quant: {qtype}")
    return deq.view(w.shape) + (w - w.detach())  # the value deq exactly, the gradient 1


def build_head(torch, args, block: dict, out_norm: np.ndarray, seq_len: int, seed: int,
               emb_std: float | None = None, hidden_scale: float = 1.0, qtypes: dict | None = None,
               n_features: int = 0):
    """The MTP head module, initialised from the base's last layer (see the module docstring).

    eh_proj = [N(0, emb_std) | identity] (emb_std default EMB_INIT_REL / sqrt(dim)); enorm and hnorm start at
    `hidden_scale` (the typical RMS of the base's final residual, so the block sees inputs of the scale the
    base's last layer was trained on), shared_head_norm at the base's output_norm. `qtypes`: {tensor: quant
    type} of the FFN matrices that will be written quantised: the forward uses them fake-quantised.
    `n_features` > 0: fc fuses the normed final hidden with that many RMS-normed layer outputs (EAGLE-3), starting
    as [identity | 0 ...] so the head starts as one that reads the final hidden only."""

    nn, F = torch.nn, torch.nn.functional
    dim, H, Hkv, hd, eps = args.dim, args.n_heads, args.n_kv_heads, args.head_dim, args.norm_eps
    n_rot = args.rope_dim or hd

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    class MtpHead(nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(int(seed))
            eh = torch.zeros(dim, 2 * dim)
            std = EMB_INIT_REL / math.sqrt(dim) if emb_std is None else emb_std
            eh[:, :dim] = torch.randn(dim, dim, generator=gen) * std
            eh[:, dim:] = torch.eye(dim)
            fused = {}
            if n_features:
                fc = torch.zeros(dim, (1 + n_features) * dim)
                fc[:, :dim] = torch.eye(dim)
                fused = {"fc": nn.Parameter(fc)}
            self.quant = {k: t for k in block if (t := written_type(k, qtypes or {})) in QUANTIZABLE}
            self.p = nn.ParameterDict({
                "eh_proj": nn.Parameter(eh),
                "enorm": nn.Parameter(torch.full((dim,), float(hidden_scale))),
                "hnorm": nn.Parameter(torch.full((dim,), float(hidden_scale))),
                "shared_head_norm": nn.Parameter(torch.from_numpy(np.array(out_norm, np.float32))),
                **{k: nn.Parameter(torch.from_numpy(np.array(v, np.float32))) for k, v in block.items()},
                **fused,
            })
            cos, sin = rope_tables(max(seq_len, 1), n_rot, args.rope_base, args.rope_scaling)
            self.register_buffer("cos", torch.from_numpy(cos), persistent=False)
            self.register_buffer("sin", torch.from_numpy(sin), persistent=False)

        def rope(self, x):  # x [B, T, h, hd]
            T = x.shape[1]
            c, s = self.cos[:T, None, :], self.sin[:T, None, :]
            rot, rest = x[..., :n_rot], x[..., n_rot:]
            if args.rope_neox:
                a, b = rot[..., : n_rot // 2], rot[..., n_rot // 2 :]
                rot = torch.cat([a * c - b * s, a * s + b * c], -1)
            else:
                a, b = rot[..., 0::2], rot[..., 1::2]
                rot = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
            return torch.cat([rot, rest], -1)

        def qkv(self, x):
            p = self.p
            B, T, _ = x.shape
            n = rms(x, p["attn_norm"])
            q = (n @ p["attn_q"].T).view(B, T, H, hd)
            k = (n @ p["attn_k"].T).view(B, T, Hkv, hd)
            v = (n @ p["attn_v"].T).view(B, T, Hkv, hd)
            if "attn_q_norm" in p:
                q, k = rms(q, p["attn_q_norm"]), rms(k, p["attn_k_norm"])
            q, k, v = self.rope(q).transpose(1, 2), self.rope(k).transpose(1, 2), v.transpose(1, 2)
            if Hkv != H:
                k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            return q, k, v

        def block(self, x, kvs=()):
            """One base-kind layer over x [B, T, dim] at positions 0..T-1. Alone (kvs empty): causal, the rows a
            catch-up commits. Chained at depth d = len(kvs) + 1 (training-time test, EAGLE-3): row p is the
            d-th draft of a chain whose committed rows end at p-d+1, so it attends to the first pass's keys
            j <= p-d+1, to pass k's key at p-d+k (k = 2..d-1), and to its own: what the drafter's cache holds
            when it chains. Returns (rows out, this pass's (k, v))."""
            p = self.p
            B, T, _ = x.shape
            q, k, v = self.qkv(x)
            if not kvs:
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(hd))
            else:
                d = len(kvs) + 1
                (k1, v1), chain = kvs[0], [*kvs[1:], (k, v)]
                s1 = (q @ k1.transpose(-1, -2)) / math.sqrt(hd)
                s1 = s1.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(-(d - 1)), float("-inf"))
                shifted = [(_shift(kk, d - j), _shift(vv, d - j)) for j, (kk, vv) in enumerate(chain, 2)]
                sd = [(q * kk).sum(-1, keepdim=True) / math.sqrt(hd) for kk, _ in shifted]
                w = torch.softmax(torch.cat([s1, *sd], -1), -1)
                att = w[..., :T] @ v1
                for j, (_, vv) in enumerate(shifted):
                    att = att + w[..., T + j : T + j + 1] * vv
            x = x + att.transpose(1, 2).reshape(B, T, H * hd) @ p["attn_output"].T
            n = rms(x, p["ffn_norm"])
            return x + (self.moe(n) if "ffn_gate_inp" in p else self.dense(n)), (k, v)

        def w(self, name):
            """A weight as the forward uses it: fake-quantised when it will be written quantised."""
            q = self.quant.get(name)
            return self.p[name] if q is None else fake_quant(torch, self.p[name], q)

        def dense(self, n):
            gate, up, down = self.w("ffn_gate"), self.w("ffn_up"), self.w("ffn_down")
            return (F.silu(n @ gate.T) * (n @ up.T)) @ down.T

        def moe(self, n):
            p = self.p
            gate, up, down = self.w("ffn_gate_exps"), self.w("ffn_up_exps"), self.w("ffn_down_exps")
            shape = n.shape
            h = n.reshape(-1, shape[-1])
            probs = torch.softmax(h @ p["ffn_gate_inp"].T, -1)
            w, ids = torch.topk(probs, args.n_experts_used, -1)
            if args.norm_topk_prob:
                w = w / w.sum(-1, keepdim=True)
            out = torch.zeros_like(h)
            for e in range(args.n_experts):
                rows, slot = torch.nonzero(ids == e, as_tuple=True)
                if rows.numel() == 0:
                    continue
                xe = h[rows]
                y = (F.silu(xe @ gate[e].T) * (xe @ up[e].T)) @ down[e].T
                out = out.index_add(0, rows, y * w[rows, slot, None])
            return out.view(shape)

        def hidden_in(self, hn, feats=None):
            """The hidden the head's first step reads: the base's normed final hidden, fused with the RMS-normed
            layer outputs feats [B, T, n_features * dim] by fc when the head has one."""
            if "fc" not in self.p:
                return hn
            parts = [hn, *(f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps) for f in feats.split(dim, -1))]
            return torch.cat(parts, -1) @ self.p["fc"].T

        def forward(self, hn, emb_next, feats=None, depth: int = 1):
            """hn [B, T, dim] base normed hidden, emb_next [B, T, dim] embedding of the next token, feats the
            fused layers' rows → per draft depth 1..depth the normed head outputs [B, T, dim] (shared_head_norm
            applied; the LM head comes after). Depth d row p chains on depth d-1's output at row p-1 and
            predicts the same target as depth 1 at row p (the committed token x_{p+1} is the accepted draft)."""
            p = self.p
            e = rms(emb_next, p["enorm"])
            h = self.hidden_in(hn, feats)
            outs, kvs = [], []
            for _ in range(depth):
                x = torch.cat([e, rms(h, p["hnorm"])], -1) @ p["eh_proj"].T
                y, kv = self.block(x, kvs)
                kvs.append(kv)
                outs.append(rms(y, p["shared_head_norm"]))
                h = _shift(outs[-1], 1, dim=1)
            return outs

    def _shift(t, n: int, dim: int = 2):
        """t moved n places later along `dim` (the first n zero): row p reads what row p-n had."""
        pad = torch.zeros_like(t.narrow(dim, 0, n))
        return torch.cat([pad, t.narrow(dim, 0, t.shape[dim] - n)], dim)

    return MtpHead()


def _lm_head_ce(torch):
    """Cross-entropy over the whole vocabulary through a frozen LM head, fused and chunked: the forward computes
    the loss, each row's argmax and the gradient w.r.t. the input at once, never holding [R, vocab] logits."""

    class LMHeadCE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, W, targets):
            R = x.shape[0]
            grad = torch.empty_like(x)
            loss = x.new_zeros(())
            pred = torch.empty(R, dtype=torch.int64)
            for s in range(0, R, CE_CHUNK):
                e = min(R, s + CE_CHUNK)
                lg = x[s:e] @ W.T
                t = targets[s:e]
                pred[s:e] = lg.argmax(-1)
                lse = torch.logsumexp(lg, -1)
                loss = loss + (lse - lg.gather(1, t[:, None])[:, 0]).sum()
                p = lg.sub_(lse[:, None]).exp_()
                p[torch.arange(e - s), t] -= 1.0
                grad[s:e] = p @ W
            ctx.save_for_backward(grad)
            ctx.mark_non_differentiable(pred)
            return loss / R, pred

        @staticmethod
        def backward(ctx, g_loss, g_pred):
            (grad,) = ctx.saved_tensors
            return grad * (g_loss / grad.shape[0]), None, None

    return LMHeadCE.apply
