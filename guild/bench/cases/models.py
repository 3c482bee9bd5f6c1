"""Models a case measures, each loaded once per (model, numerics): a tag or GGUF path, or a synth preset's types
written once into a folder (guild.tools.synth); and the prompts every engine gets as the same token ids."""

from __future__ import annotations

import gc
import os
import textwrap
from functools import cache
from pathlib import Path

from ...errors import BadFlagError
from ...load import load
from ...upcycle import resolve_model

# 44 tokens under the embedded models' chat template: the time-to-first-token prompt
CHAT_PROMPT = "Why is the sky blue during the day, and red at sunset?"


def add_model_args(ap, default: str = "smollm2-135m,smollm2-135m-moe") -> None:
    ap.add_argument("--models", default=default, help="comma-separated tags or GGUF paths (default: %(default)s)")
    ap.add_argument("--synth", metavar="PRESET", help="also --types of this preset (python -m guild.tools.synth)")
    ap.add_argument("--types", default="Q4_K_M", help="comma-separated types for --synth (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the --synth files (default: %(default)s)")
    ap.add_argument("--dir", default="results/shapes", help="where --synth keeps its files")


def model_paths(a) -> dict[str, str]:
    """Each model's file by the name a record shows: tags resolved (the MoE built on first use), --synth files
    written once."""
    out = []
    for m in filter(None, (x.strip() for x in a.models.split(","))):
        if m.endswith(".gguf") and not os.path.isfile(m):
            raise BadFlagError(f"--models: {m}: no such file")
        out.append(str(resolve_model(m, progress=False)))
    if a.synth:
        from ...tools.synth import synth

        if a.layers < 1:
            raise BadFlagError("--layers must be >= 1")
        os.makedirs(a.dir, exist_ok=True)
        for t in filter(None, (x.strip() for x in a.types.split(","))):
            f = Path(a.dir) / f"{a.synth}-{a.layers}l-{t.lower()}.gguf"
            if not f.exists():
                synth(a.synth, f, layers=a.layers, type_name=t)
            out.append(str(f))
    if not out:
        raise BadFlagError("give --models or --synth")
    return {Path(p).name: p for p in out}


_HELD: dict = {}  # (path, threads, numerics) -> the one loaded model this process holds


def loaded(path: str, threads: int, numerics: str = "i8"):
    """The model at path, loaded once: one held at a time, the one before dropped before the next loads (a loaded
    model is resident memory, guild.formats.resident: two 8 GB slices side by side with a llama.cpp runner's copy
    ran a 24 GB host out of memory)."""
    key = (path, threads, numerics)
    if key not in _HELD:
        _HELD.clear()
        gc.collect()  # the old model's arrays go now, not at some later collection
        _HELD[key] = load(path, threads=threads, numerics=numerics, progress=False)
    return _HELD[key]


@cache
def chat_ids(path: str, threads: int) -> tuple[int, ...]:
    tok = loaded(path, threads).tokenizer  # as `guild run --chat` encodes a one-message chat
    return tuple(tok.encode(tok.apply_chat_template([{"role": "user", "content": CHAT_PROMPT}]), add_special=True))


@cache
def text_ids(path: str, threads: int, n: int) -> tuple[int, ...]:
    """n tokens of real text shipped with Python (the textwrap module's source, repeated as needed)."""
    tok = loaded(path, threads).tokenizer
    ids = tok.encode(Path(textwrap.__file__).read_text(), add_special=True)
    return tuple((ids * (n // len(ids) + 1))[:n])
