"""`guild run`: load a model (path or tag), tokenize the prompt, decode, stream text, return stats."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import BadFlagError
from .gguf import GGUFFile
from .models import load_model
from .sampling import GREEDY, SamplingParams
from .session import GenerationStats, GuildSession
from .tokenizer import Tokenizer
from .upcycle import resolve_model


def set_threads(threads: int | None) -> int:
    """Numba worker threads for the kernels (None = all cores); returns the count in use."""
    import numba

    if threads is not None:
        if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
            raise BadFlagError(f"--threads must be in 1..{numba.config.NUMBA_NUM_THREADS}, got {threads}")
        numba.set_num_threads(threads)
    return numba.get_num_threads()


@dataclass
class Loaded:
    path: str
    gguf: GGUFFile
    model: object
    tokenizer: Tokenizer
    load_s: float


def load(model: str | None) -> Loaded:
    t0 = time.perf_counter()
    path = str(resolve_model(model))
    g = GGUFFile(path)
    tok = Tokenizer.from_metadata(g.metadata)
    m = load_model(g)
    return Loaded(path, g, m, tok, time.perf_counter() - t0)


@dataclass
class RunResult:
    text: str
    tokens: list[int]
    stats: GenerationStats
    model: str
    threads: int
    load_s: float
    seed: int

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "threads": self.threads,
            "seed": self.seed,
            "load_s": round(self.load_s, 3),
            "text": self.text,
            "tokens": self.tokens,
            **self.stats.as_dict(),
        }


def run(
    model: str | None,
    prompt: str,
    *,
    chat: bool = False,
    max_tokens: int = 128,
    threads: int | None = None,
    context: int = 4096,
    prefill_batch: int = 512,
    sampling: SamplingParams = GREEDY,
    on_text: Callable[[str], None] | None = None,
) -> RunResult:
    if context < 16:
        raise BadFlagError(f"--context must be >= 16, got {context}")
    if max_tokens < 1:
        raise BadFlagError(f"--max-tokens must be >= 1, got {max_tokens}")
    if prefill_batch < 1:
        raise BadFlagError(f"--prefill-batch must be >= 1, got {prefill_batch}")
    n_threads = set_threads(threads)
    lm = load(model)
    tok = lm.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    ids = tok.encode(text, add_special=True)
    session = GuildSession(lm.model, n_ctx=context, prefill_batch=prefill_batch, eos_ids=tok.eos_ids)
    detok = tok.detokenizer()
    pieces: list[str] = []

    def on_token(t: int) -> None:
        if t in tok.eos_ids:
            return
        s = detok.push(t)
        if s:
            pieces.append(s)
            if on_text is not None:
                on_text(s)

    out, stats = session.generate(ids, max_tokens, on_token, sampling=sampling)
    tail = detok.flush()
    if tail:
        pieces.append(tail)
        if on_text is not None:
            on_text(tail)
    return RunResult("".join(pieces), out, stats, lm.path, n_threads, lm.load_s, sampling.seed)
