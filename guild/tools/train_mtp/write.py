"""train-mtp's export: the head's tensors as written (names, types) and the head GGUF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from ...formats.files import atomic_path
from .config import QUANTIZABLE

# =========================================================================================================
# Export
# =========================================================================================================
NEXTN = {"eh_proj": "blk.0.nextn.eh_proj.weight", "enorm": "blk.0.nextn.enorm.weight",
         "hnorm": "blk.0.nextn.hnorm.weight", "shared_head_norm": "blk.0.nextn.shared_head_norm.weight",
         "fc": "blk.0.nextn.fc.weight"}
F32_TENSORS = frozenset({"enorm", "hnorm", "shared_head_norm", "attn_norm", "attn_q_norm", "attn_k_norm",
                         "ffn_norm", "ffn_gate_inp"})


def gguf_name(key: str) -> str:
    return NEXTN.get(key, f"blk.0.{key}.weight")


def written_type(key: str, qtypes: dict[str, str]) -> str:
    """The type a head tensor is written in: norms and the router F32; FFN matrices in the base's type when
    gguf.quants can write it (Q4_0/Q4_1/Q5_0/Q8_0); everything else (attention, eh_proj) F16."""
    if key in F32_TENSORS:
        return "F32"
    if key.startswith("ffn_") and qtypes.get(key) in QUANTIZABLE:
        return qtypes[key]
    return "F16"


def export_tensors(params: dict[str, np.ndarray], qtypes: dict[str, str]) -> list[tuple[str, np.ndarray, str]]:
    """(GGUF name, data as written, type name) per head tensor: norms and router F32, FFN matrices in the base's
    type when gguf.quants can write it (Q4_0/Q4_1/Q5_0/Q8_0), everything else F16."""
    out = []
    for key, w in params.items():
        w = np.ascontiguousarray(w, np.float32)
        typ = written_type(key, qtypes)
        if typ == "F32":
            out.append((gguf_name(key), w, typ))
        elif typ == "F16":
            out.append((gguf_name(key), w.astype(np.float16), typ))
        else:
            out.append((gguf_name(key), quantize(w, GGMLQuantizationType[typ]), typ))
    return out


def dequantized(tensors: list[tuple[str, np.ndarray, str]], shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    """The float32 values the written tensors carry (what inference will compute with), by GGUF name."""
    out = {}
    for name, data, typ in tensors:
        if typ in ("F32", "F16"):
            out[name] = data.astype(np.float32)
        else:
            out[name] = dequantize(data, GGMLQuantizationType[typ]).astype(np.float32).reshape(shapes[name])
    return out


def write_head_gguf(path: Path, tensors, meta: dict) -> int:
    """Write the head GGUF atomically (temp file + rename); returns its size in bytes."""

    path = Path(path)
    with atomic_path(path, "the MTP head") as tmp:
        w = GGUFWriter(tmp, "guild-mtp")
        try:
            for k, v in meta.items():
                if isinstance(v, bool):
                    w.add_bool(k, v)
                elif isinstance(v, int):
                    w.add_uint64(k, v) if v >= 2**32 else w.add_uint32(k, v)
                elif isinstance(v, float):
                    w.add_float32(k, v)
                elif isinstance(v, list):
                    w.add_array(k, v)
                else:
                    w.add_string(k, str(v))
            for name, data, typ in tensors:
                raw = None if typ in ("F32", "F16", "I32") else GGMLQuantizationType[typ]
                w.add_tensor(name, data, raw_dtype=raw)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()
    return path.stat().st_size
