"""train-mtp's teacher pass (the base's forward over the documents) and the dataset it gives."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...engine.backends import HOST
from ...formats.files import atomic_path
from .config import HELDOUT_FRACTION, TrainMtpError


# =========================================================================================================
# Teacher pass: base forward → (tokens, greedy next token, normed hidden)
# =========================================================================================================
def teacher_pass(model, docs, seq_len: int, advance: Callable[[int], None], layers: tuple[int, ...] = ()) -> dict:
    """Each document cut into chunks of seq_len tokens (state reset per chunk); per row: the token, the base's
    greedy next token, the final hidden after the base's output norm and the output rows of `layers` (the
    head's fused features), float16."""

    dim = model.args.dim
    cols: dict[str, list] = {k: [] for k in DATA_ARRAYS}
    state = model.new_state(seq_len)
    kept, model.mtp_features = model.mtp_features, tuple(layers)
    try:
        for group, ids in docs:
            ids = np.asarray(ids, np.int64)
            for s in range(0, ids.size, seq_len):
                chunk = ids[s : s + seq_len]
                if chunk.size < 3:
                    continue
                for k, v in _chunk_rows(model, chunk, state).items():
                    cols[k].append(v)
                cols["lens"].append(chunk.size)
                cols["groups"].append(group)
                advance(int(chunk.size))
    finally:
        model.mtp_features = kept
    empty = {"tokens": np.zeros(0, np.int32), "greedy": np.zeros(0, np.int32), "rms": np.zeros(0, np.float32),
             "hidden": np.zeros((0, dim), np.float16), "features": np.zeros((0, len(layers) * dim), np.float16)}
    out = {k: np.concatenate(cols[k]) if cols[k] else e for k, e in empty.items()}
    out["lens"] = np.asarray(cols["lens"], np.int64)
    out["groups"] = np.asarray(cols["groups"], dtype=object).astype(str) if cols["groups"] else np.zeros(0, "<U1")
    return out


def _chunk_rows(model, chunk: np.ndarray, state) -> dict:
    """One chunk's rows through the base from position 0 (the state left empty)."""
    state.truncate(0)
    out = model.forward_batch([(chunk, state)])[0]
    state.commit(0)
    x = np.ascontiguousarray(out.hidden, np.float32)
    hn = np.empty_like(x)
    HOST.rmsnorm(x, model.out_norm, model.args.norm_eps, hn)  # parallel over a chunk's rows
    feats = [np.asarray(f, np.float16) for f in out.features]
    return {"tokens": chunk.astype(np.int32), "greedy": out.logits.argmax(-1).astype(np.int32),
            "hidden": hn.astype(np.float16),
            "features": np.concatenate(feats, 1) if feats else np.zeros((chunk.size, 0), np.float16),
            "rms": np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1)).astype(np.float32)}


def _save_npz(path: Path, arrays: dict, meta: dict) -> None:
    with atomic_path(path, "the teacher data") as tmp, open(tmp, "wb") as f:
        np.savez(f, meta=np.asarray(json.dumps(meta, sort_keys=True)), **arrays)


def _load_npz(path: Path, meta: dict) -> dict | None:
    """The arrays saved at `path` if its meta equals `meta`, else None."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if json.loads(str(z["meta"])) != json.loads(json.dumps(meta, sort_keys=True)):
                return None
            out = {k: z[k] for k in z.files if k != "meta"}
            return out if set(DATA_ARRAYS) <= set(out) else None
    except (OSError, ValueError, KeyError):
        return None


DATA_ARRAYS = ("tokens", "greedy", "hidden", "features", "rms", "lens", "groups")


@dataclass
class Dataset:
    tokens: np.ndarray  # int32 [R] every chunk's rows, concatenated
    greedy: np.ndarray  # int32 [R] the base's greedy next token at each row
    hidden: np.ndarray  # float16 [R, dim] normed final hidden
    features: np.ndarray  # float16 [R, n_layers_fused * dim] the fused layers' output rows
    rms: np.ndarray  # float32 [R] RMS of the final hidden before the norm
    starts: np.ndarray  # int64 [C] first row of each chunk
    lens: np.ndarray  # int64 [C]
    groups: np.ndarray  # str [C] document group (a file, a topic, a prompt)
    sources: np.ndarray  # int8 [C] 0 text, 1 generations

    @classmethod
    def join(cls, parts: list[dict]) -> Dataset:
        lens = np.concatenate([p["lens"] for p in parts]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        return cls(
            tokens=np.concatenate([p["tokens"] for p in parts]),
            greedy=np.concatenate([p["greedy"] for p in parts]),
            hidden=np.concatenate([p["hidden"] for p in parts]),
            features=np.concatenate([p["features"] for p in parts]),
            rms=np.concatenate([p["rms"] for p in parts]),
            starts=starts, lens=lens,
            groups=np.concatenate([p["groups"].astype(str) for p in parts]),
            sources=np.concatenate([np.full(p["lens"].size, s, np.int8) for s, p in enumerate(parts)]),
        )

    def split(self, seed: int, fraction: float = HELDOUT_FRACTION) -> tuple[np.ndarray, np.ndarray]:
        """(train chunk ids, held-out chunk ids): a seeded `fraction` of the document groups (at least one)."""
        names = np.unique(self.groups)
        if names.size < 2:
            raise TrainMtpError(f"the training budgets gave {names.size} document(s); at least 2 are needed to hold "
                                "one out (raise --text-tokens or --gen-tokens)")
        rng = np.random.default_rng([seed, 3])
        n_hold = max(1, int(round(fraction * names.size)))
        held = set(names[rng.permutation(names.size)[:n_hold]].tolist())
        mask = np.array([g in held for g in self.groups])
        return np.flatnonzero(~mask), np.flatnonzero(mask)

    def rows(self, chunks: np.ndarray) -> int:
        """MTP rows in these chunks (L - 1 per chunk of L tokens)."""
        return int((self.lens[chunks] - 1).sum())

    def batch(self, chunks: np.ndarray):
        """(hn [B, T, dim] f32, features [B, T, F] f32, next tokens [B, T] i64, targets [B, T] i64, valid [B, T]
        bool), T = max L - 1: MTP row t of a chunk reads the hidden and features at t and the token at t+1, and
        targets the greedy token at t+1."""
        T = int(self.lens[chunks].max()) - 1
        B = chunks.size
        dim = self.hidden.shape[1]
        hn = np.zeros((B, T, dim), np.float32)
        ft = np.zeros((B, T, self.features.shape[1]), np.float32)
        nxt = np.zeros((B, T), np.int64)
        tgt = np.zeros((B, T), np.int64)
        valid = np.zeros((B, T), bool)
        for b, c in enumerate(chunks):
            s, n = int(self.starts[c]), int(self.lens[c]) - 1
            hn[b, :n] = self.hidden[s : s + n]
            ft[b, :n] = self.features[s : s + n]
            nxt[b, :n] = self.tokens[s + 1 : s + n + 1]
            tgt[b, :n] = self.greedy[s + 1 : s + n + 1]
            valid[b, :n] = True
        return hn, ft, nxt, tgt, valid
