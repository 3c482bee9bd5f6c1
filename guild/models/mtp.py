"""Multi-token-prediction head, DeepSeek-V3 (arXiv 2412.19437 §2.2) / Qwen3.5 `mtp` form:

    h'_p = Block(eh_proj([RMSNorm_e(emb(x_{p+1})) ; RMSNorm_h(h_p)]))       logits(x_{p+2}) = head(RMSNorm_s(h'_p))

h_p is the base model's final hidden state at position p after its output norm (what its LM head reads, as
vLLM passes it); the block is one layer of the base's own kind with its own one-layer KV cache, committed by
`keep` like the model's. Drafting d_{i+1} from d_i chains the head on its own normed output.

Sources, first found wins: an explicit sidecar path; the model file's own `nextn` block (qwen35moe/glm4moe
naming: `blk.{n_layers}.nextn.*` plus that block's layer tensors); `<model>.mtp.gguf` beside the model; a head
shipped in guild/heads/ for the embedded model. A sidecar (`guild train-mtp`) uses the same names at block 0
and records the base's identity digest, checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.backends import Layout, Linear, rows_on
from ..engine.gpu import place_head
from ..engine.state import DeviceKVCache, KVCache
from ..errors import GuildError
from ..formats.gguf import GGUFFile, f32
from ..formats.repack_cache import pack
from ..window import MAX_DRAFT
from .base import check_finite
from .llama import Window
from .validate import check_mtp_head, mtp_feature_layers

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"  # heads shipped for the embedded models
SIDECAR_SUFFIX = ".mtp.gguf"
ARCH = "guild-mtp"


class MtpError(GuildError):
    """No usable MTP head: missing, trained for another model, or malformed."""


@dataclass(frozen=True)
class MtpInfo:
    source: str  # file the head was read from
    kind: str  # "nextn" (the model's own block) or "sidecar"
    ffn: str  # "moe" or "dense"
    heldout_acceptance: float | None  # measured by train-mtp, when it trained the head
    draft_vocab: int  # tokens the draft LM head scores (vocab size when the full head is used)
    depth: int = 1  # drafts the head was trained to chain (train-mtp --depth; 1 for a nextn block)


class MtpHead:
    """One MTP module over a base model (which it shares embeddings, LM head and rope tables with)."""

    def __init__(self, base, g: GGUFFile, bid: int, kind: str, draft_vocab: int | None = None):
        p = f"blk.{bid}.nextn."
        need = [p + n + ".weight" for n in ("eh_proj", "enorm", "hnorm", "shared_head_norm")]
        missing = [n for n in need if not g.has(n)]
        if missing:
            raise MtpError(f"{g.path}: MTP head lacks {', '.join(missing)}")
        check_mtp_head(g, base, bid)  # shapes against the base, draft ids in range, finite weights
        a = base.args
        self.base, self.args = base, a
        self.enorm, self.hnorm = f32(g.tensor(p + "enorm.weight")), f32(g.tensor(p + "hnorm.weight"))
        self.head_norm = f32(g.tensor(p + "shared_head_norm.weight"))
        eh = g.tensor(p + "eh_proj.weight")
        if tuple(eh.shape) != (a.dim, 2 * a.dim):
            raise MtpError(f"{g.path}: {p}eh_proj is {tuple(eh.shape)}, expected ({a.dim}, {2 * a.dim})")
        self.eh_proj = Linear([eh])
        # EAGLE-3 (arXiv 2503.01840): the base's output rows of a low, a middle and a high layer, RMS-normed,
        # fused with its normed final hidden by fc into the hidden the head reads (the draft's first step only)
        self.feature_layers = mtp_feature_layers(g, a.n_layers)
        self.fc = Linear([g.tensor(p + "fc.weight")]) if self.feature_layers else None
        self.unit = np.ones(a.dim, np.float32)
        self.unit.flags.writeable = False  # as the file's norm weights: one compiled rmsnorm for both
        base.mtp_features = self.feature_layers  # the base's forwards keep those rows from now on
        if g.has(p + "embed_tokens.weight"):
            e = g.tensor(p + "embed_tokens.weight")
            self.embed = pack(e.qtype, e.data, e.shape[0], e.shape[1])
        else:
            self.embed = base.embed
        head = g.tensor(p + "shared_head_head.weight") if g.has(p + "shared_head_head.weight") else None
        self.output = Linear([head]).parts[0] if head is not None else base.output
        self.block = base.mtp_block(g, bid)
        ffn = "moe" if g.has(f"blk.{bid}.ffn_gate_inp.weight") else "dense"
        # the draft LM head: the full vocabulary, or the rows of the tokens the head most often predicts
        self.vocab_ids = None
        if draft_vocab and g.has("mtp.draft_vocab") and head is None:
            ids = np.asarray(g.tensors["mtp.draft_vocab"].data, np.int64).reshape(-1)[:draft_vocab]  # I32
            t = base.gguf.tensor("output.weight" if base.gguf.has("output.weight") else "token_embd.weight")
            self.output = pack(t.qtype, np.ascontiguousarray(t.data[ids]), ids.size, t.shape[1])
            self.vocab_ids = ids
        acc = g.get("guild.mtp.train.heldout_acceptance", float, None)
        depth = g.get("guild.mtp.train.depth", int, 1)
        if not 1 <= depth <= MAX_DRAFT:
            raise MtpError(f"{g.path}: guild.mtp.train.depth {depth} is outside 1..{MAX_DRAFT}")
        self.info = MtpInfo(str(g.path), kind, ffn, acc, self.output.n_rows, depth)
        # the weights the forward reads: these, or their device twins where the base placed the head
        self.w = place_head(base, self, g, bid, p)

    @property
    def be(self):
        """The backend the head runs on: where the base's layout puts it (the CPU for a CPU model)."""
        return self.base.layout.head_be

    def new_cache(self, n_ctx: int):
        a, be = self.args, self.be
        if be.device:
            return DeviceKVCache([be], a.n_kv_heads, a.head_dim, n_ctx)
        return KVCache(1, a.n_kv_heads, a.head_dim, n_ctx)

    def base_hidden(self, x, features=()):
        """The hidden [R, dim] the head reads from the base's final residual rows x and, for a head that fuses
        layers, their output rows `features` (ForwardResult.hidden/.features: arrays or DeviceRows), on the
        head's backend: rows left on that device move nowhere."""
        a, be, W = self.args, self.be, self.w
        x = rows_on(x, be)
        if W.fc is None:
            h = be.empty(x.shape)
            be.rmsnorm(x, self.base.out_norm, a.norm_eps, h)
            return h
        if len(features) != len(self.feature_layers):
            raise ValueError(f"MtpHead.base_hidden: {len(features)} feature rows for layers {self.feature_layers}")
        R, d = x.shape[0], a.dim
        cat = be.empty((R, (1 + len(features)) * d))  # [normed final ; rms(f_low) ; rms(f_mid) ; rms(f_high)]
        be.rmsnorm(x, self.base.out_norm, a.norm_eps, cat[:, :d])
        for i, f in enumerate(features, 1):
            be.rmsnorm(be.contiguous(rows_on(f, be)), W.unit, a.norm_eps, cat[:, i * d : (i + 1) * d])
        h = be.empty((R, d))
        be.matmul(W.fc, cat, h)
        return h

    def forward(self, tokens, hidden, cache, n_logits: int = 1):
        """Rows p = cache.pos.. with inputs (hidden_p [normed, on the head's backend], tokens_p = x_{p+1});
        writes them to the cache (uncommitted: call cache.commit(keep)). Returns (h' normed [R, dim] on the
        head's backend, logits [n_logits, n] of the last n_logits rows over the draft vocabulary, on the host;
        None when n_logits is 0)."""
        a, be, W = self.args, self.be, self.w
        toks = np.ascontiguousarray(tokens, np.int64).reshape(-1)
        R = toks.size
        if tuple(hidden.shape) != (R, a.dim):
            raise ValueError(f"MtpHead.forward: hidden {tuple(hidden.shape)} for {R} tokens of dim {a.dim}")
        pos0 = cache.begin(R)
        lay = Layout([be], be, be, self.base.layout.rope, be)
        lay._stage = self.base.layout._stage  # the base's staging buffers (one window at a time)
        w = Window([cache], np.array([0, R]), [pos0], np.arange(pos0, pos0 + R, dtype=np.int64), a.n_heads, 1, lay,
                   toks)
        with be.activate():
            e = w.embed(W)
            cat = be.empty((R, 2 * a.dim))  # [R, 2 dim]: [enorm(emb) ; hnorm(h)]
            be.rmsnorm(e, W.enorm, a.norm_eps, cat[:, : a.dim])
            be.rmsnorm(be.contiguous(hidden), W.hnorm, a.norm_eps, cat[:, a.dim :])
            x = be.empty((R, a.dim))
            be.matmul(W.eh_proj, cat, x)
            self.base.block(0, W.block, x, be.empty((R, a.dim)), w)
            h = be.empty((R, a.dim))
            be.rmsnorm(x, W.head_norm, a.norm_eps, h)
            if not n_logits:
                return h, None
            logits = be.empty((n_logits, W.output.n_rows))
            be.matmul(W.output, be.contiguous(h[R - n_logits :]), logits)
            logits = lay.download(be, logits)
        check_finite(logits, self.info.source)
        return h, logits

    def token(self, j: int) -> int:
        """Token id of column j of the draft logits."""
        return int(self.vocab_ids[j]) if self.vocab_ids is not None else int(j)


def _sidecar(base, path: Path, draft_vocab: int | None) -> MtpHead:
    g = GGUFFile(path)
    if g.architecture != ARCH:
        raise MtpError(f"{path}: not an MTP head (general.architecture is '{g.architecture}', expected '{ARCH}')")
    want = base.gguf.identity_digest()
    got = g.get("guild.mtp.base_digest", str, "")
    if got != want:
        name = g.get("guild.mtp.base_name", str, "?")
        raise MtpError(f"{path}: MTP head was trained for another model ({name}, digest {got[:12]}), "
                       f"not {Path(base.gguf.path).name} ({want[:12]})")
    return MtpHead(base, g, 0, "sidecar", draft_vocab)


def find_mtp_head(base, path: str | Path | None = None, draft_vocab: int | None = None) -> MtpHead | None:
    """The model's MTP head from the first source that has one (see the module docstring), or None."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise MtpError(f"MTP head {p}: no such file")
        return _sidecar(base, p, draft_vocab)
    g = base.gguf
    n = base.n_mtp
    if n and g.has(f"blk.{base.args.n_layers}.nextn.eh_proj.weight"):
        return MtpHead(base, g, base.args.n_layers, "nextn", draft_vocab)
    cand = sidecar_path(g.path)
    return _sidecar(base, cand, draft_vocab) if cand is not None else None


def sidecar_path(model_path: str | Path) -> Path | None:
    """The sidecar head a model would use: `<model>.mtp.gguf` beside it, else one shipped in guild/heads/."""
    model = Path(model_path)
    for cand in (model.with_name(model.stem + SIDECAR_SUFFIX), HEADS_DIR / (model.stem + SIDECAR_SUFFIX)):
        if cand.is_file():
            return cand
    return None


def load_mtp_head(base, path: str | Path | None = None, draft_vocab: int | None = None) -> MtpHead:
    """As find_mtp_head, but a missing head is an error that says how to make one."""
    head = find_mtp_head(base, path, draft_vocab)
    if head is None:
        name = Path(base.gguf.path).name
        raise MtpError(f"{name} has no MTP head (no nextn tensors, no {Path(name).stem}{SIDECAR_SUFFIX} beside "
                       f"it); train one: guild train-mtp {base.gguf.path} -o "
                       f"{Path(base.gguf.path).with_suffix('')}{SIDECAR_SUFFIX}")
    return head
