"""`guild run`: load a model (path or tag), set up a session and its drafter, decode one prompt or a whole
conversation, stream text, return stats."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .chat import Conversation, Turn, stream_text
from .errors import BadFlagError
from .gguf import GGUFFile
from .inputs import MAX_CORPUS_BYTES, read_text_file
from .models import load_model
from .models.validate import check_context
from .sampling import GREEDY, SamplingParams
from .session import GuildSession
from .spec import MtpOptions, check_flags, make_drafter
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
    device: str = "cpu"  # what runs the model, said in words (see use_device)
    mtp_heads: dict = field(default_factory=dict)  # (--mtp-head path or None, draft vocab) -> MtpHead | None


def load(model: str | None) -> Loaded:
    t0 = time.perf_counter()
    path = str(resolve_model(model))
    g = GGUFFile(path)
    tok = Tokenizer.from_metadata(g.metadata)
    m = load_model(g)
    return Loaded(path, g, m, tok, time.perf_counter() - t0)


def use_device(lm: Loaded, device: str | None, context: int, plan=None) -> None:
    """`--device auto|cpu|cuda`: move the model's attention/dense share to the GPU (the plan's placement when
    `plan` has one, else the default for the VRAM free now; routed experts stay on the CPU). `auto` falls back
    to the CPU, saying why in lm.device, where `cuda` raises."""
    from .device import resolve_device
    from .errors import GuildError

    dev = resolve_device(device)
    if not dev.is_cuda:
        lm.device = dev.describe()
        return
    from .engine_cuda import GpuLlama, placement_from_plan

    t0 = time.perf_counter()
    try:
        pl = getattr(plan, "placement", None)
        placement = placement_from_plan(pl, lm.model, context) if pl is not None and pl.gpu else None
        lm.model = GpuLlama.build(lm.model, dev, context, placement)
    except GuildError as e:
        if (device or "auto").lower() == "cuda":
            raise
        lm.device = f"cpu (auto: {e})"
        return
    lm.load_s += time.perf_counter() - t0
    lm.device = f"{dev.describe()} · {lm.model.describe()}"


def mtp_head_for(lm: Loaded, strategy: str, mtp: MtpOptions = MtpOptions()):
    """The MTP head `mtp` needs (an error saying how to train one when there is none) and `adaptive` uses when
    the model has one; None for the other strategies. The head runs with the CPU engine only (GpuLlama keeps its
    hidden rows on the device)."""
    if strategy not in ("mtp", "adaptive"):
        return None
    if not hasattr(lm.model, "mtp_block"):
        if strategy == "mtp" or mtp.head is not None:
            raise BadFlagError("MTP drafting runs with --device cpu for now (the GPU engine has no MTP head)")
        return None
    from .models.mtp import find_mtp_head, load_mtp_head

    key = (mtp.head, mtp.vocab)
    if key not in lm.mtp_heads:
        lm.mtp_heads[key] = find_mtp_head(lm.model, mtp.head, mtp.vocab or None)
    if lm.mtp_heads[key] is None and strategy == "mtp":
        load_mtp_head(lm.model, mtp.head)  # raises, saying how to make one
    return lm.mtp_heads[key]


def _check_device(device: str | None) -> None:
    """--device cuda without a usable GPU fails before the model loads."""
    if (device or "").lower() == "cuda":
        from .device import resolve_device

        resolve_device(device)


def load_on_device(model: str | None, device: str | None, context: int) -> Loaded | None:
    """`optimize --device`: the model loaded and placed on the GPU as pass 2 (calib/placement.py) places it, so
    that pass 4 measures the engine `run --gexec` will use; None when the device resolves to the CPU."""
    from types import SimpleNamespace

    from .device import resolve_device

    if not resolve_device(device).is_cuda:
        return None
    from .calib.placement import placement_for
    from .calib.probe import gpu_info

    lm = load(model)
    gi = gpu_info()
    use_device(lm, device, context, SimpleNamespace(placement=placement_for(lm.gguf, gi, context)) if gi else None)
    return lm


@dataclass(frozen=True)
class DecodeOptions:
    """How `guild run` decodes: strategy and its knobs, sampling, limits."""

    strategy: str = "adaptive"
    max_draft: int = 4
    min_match: int = 3
    lookup_window: int = 65536
    corpus: tuple[str, ...] = ()  # documents the retrieval drafter ingests
    sampling: SamplingParams = GREEDY
    max_tokens: int = 128
    context: int = 4096
    prefill_batch: int = 512
    gexec: str | None = None  # a `guild optimize` plan: its spec costs seed the scheduler, its threads apply
    strict_plan: bool = False  # fail on a plan for another machine/model instead of regenerating one
    device: str = "cpu"  # auto | cpu | cuda (the CLI's default is auto)
    mtp: MtpOptions = MtpOptions()  # how the MTP head drafts (mtp, adaptive)

    def __post_init__(self):
        check_flags(self.strategy, min_match=self.min_match, lookup_window=self.lookup_window)
        if self.mtp.head is not None and self.strategy not in ("mtp", "adaptive"):
            raise BadFlagError("--mtp-head needs --decode-strategy mtp or adaptive")
        if self.context < 16:
            raise BadFlagError(f"--context must be >= 16, got {self.context}")
        if self.max_tokens < 1:
            raise BadFlagError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.prefill_batch < 1:
            raise BadFlagError(f"--prefill-batch must be >= 1, got {self.prefill_batch}")
        if not 0 <= self.max_draft <= 7:
            raise BadFlagError(f"--spec-max-draft must be in 0..7, got {self.max_draft}")
        if self.corpus and self.strategy not in ("retrieval", "adaptive"):
            raise BadFlagError("--retrieval-corpus needs --decode-strategy retrieval or adaptive")
        if self.strict_plan and self.gexec is None:
            raise BadFlagError("--strict-plan needs --gexec PLAN")
        from .device import DEVICES

        if self.device not in DEVICES:
            raise BadFlagError(f"--device must be one of {', '.join(DEVICES)}, got '{self.device}'")
        for f in self.corpus:
            if not Path(f).is_file():
                raise BadFlagError(f"--retrieval-corpus: no such file: {f}")


@dataclass
class RunResult:
    turns: list[Turn]
    model: str
    threads: int
    load_s: float
    options: DecodeOptions = field(default_factory=DecodeOptions)
    device: str = "cpu"
    mtp_head: str | None = None  # the MTP head file drafting used (mtp, adaptive)

    @property
    def text(self) -> str:
        return self.turns[-1].text

    @property
    def tokens(self) -> list[int]:
        return self.turns[-1].tokens

    @property
    def stats(self):
        return self.turns[-1].stats

    def as_dict(self) -> dict:
        head = {"model": self.model, "threads": self.threads, "load_s": round(self.load_s, 3),
                "strategy": self.options.strategy, "seed": self.options.sampling.seed, "device": self.device,
                "mtp_head": self.mtp_head}
        turns = [{"text": t.text, "tokens": t.tokens, **t.stats.as_dict()} for t in self.turns]
        return {**head, **turns[0]} if len(turns) == 1 else {**head, "turns": turns}


def use_plan(lm: Loaded, opts: DecodeOptions, threads: int | None):
    """`--gexec`: the plan checked against this machine and model (regenerated next to it on a mismatch,
    unless --strict-plan); its tuned thread count applies when -t is not given. None without --gexec."""
    if opts.gexec is None:
        return None
    import numba

    from .calib.optimize import plan_for

    plan = plan_for(opts.gexec, lm, strict=opts.strict_plan)
    if threads is None:
        set_threads(min(plan.cpu.threads, numba.config.NUMBA_NUM_THREADS))
    return plan


def _slot(lm: Loaded, opts: DecodeOptions, costs=None):
    """A session with its own drafter (corpus ingested) and conversation."""
    drafter = make_drafter(opts.strategy, min_match=opts.min_match, lookup_window=opts.lookup_window, costs=costs,
                           mtp_head=mtp_head_for(lm, opts.strategy, opts.mtp), n_ctx=opts.context, mtp=opts.mtp)
    for f in opts.corpus:
        drafter.ingest(lm.tokenizer.encode(read_text_file(f, "--retrieval-corpus", MAX_CORPUS_BYTES, "replace")))
    check_context(lm.model, opts.context)  # the KV cache fits in memory (guild/models/validate.py)
    s = GuildSession(lm.model, n_ctx=opts.context, prefill_batch=opts.prefill_batch, eos_ids=lm.tokenizer.eos_ids)
    return Conversation(s, lm.tokenizer), drafter


class Runner:
    """A loaded model with one session and its drafter: one-shot prompts or a multi-turn conversation."""

    def __init__(self, model: str | None, opts: DecodeOptions, threads: int | None = None):
        self.opts = opts
        self.threads = set_threads(threads)
        _check_device(opts.device)
        self.lm = load(model)
        self.plan = use_plan(self.lm, opts, threads)
        self.threads = set_threads(None)  # the count in use (the plan's, when it set one)
        use_device(self.lm, opts.device, opts.context, self.plan)
        self.conversation, self.drafter = _slot(self.lm, opts, self.plan.spec_costs() if self.plan else None)
        self.session = self.conversation.session

    def _kw(self) -> dict:
        o = self.opts
        return dict(sampling=o.sampling, drafter=self.drafter, max_draft=o.max_draft)

    def say(self, text: str, on_text: Callable[[str], None] | None = None) -> Turn:
        """One chat turn (the chat template, history kept)."""
        return self.conversation.say(text, self.opts.max_tokens, on_text, **self._kw())

    def complete(self, text: str, on_text: Callable[[str], None] | None = None) -> Turn:
        """Raw completion of `text` (no template), continuing whatever the session holds."""
        tok = self.lm.tokenizer
        ids = tok.encode(text, add_special=not self.session.tokens)
        on_token, finish = stream_text(tok, on_text)
        out, stats = self.session.generate(ids, self.opts.max_tokens, on_token, **self._kw())
        return Turn(finish(), out, stats)

    def result(self, turns: list[Turn]) -> RunResult:
        head = mtp_head_for(self.lm, self.opts.strategy, self.opts.mtp)
        return RunResult(turns, self.lm.path, self.threads, self.lm.load_s, self.opts, self.lm.device,
                         head.info.source if head is not None else None)


def run(model: str | None, prompts: Sequence[str], *, chat: bool = False, opts: DecodeOptions = DecodeOptions(),
        threads: int | None = None, on_text: Callable[[str], None] | None = None,
        on_turn: Callable[[int, str], None] | None = None) -> RunResult:
    """Decode each prompt in turn on one session (several prompts = a conversation when chat is set)."""
    if not prompts:
        raise BadFlagError("no prompt: give -p/--prompt or --conversation")
    r = Runner(model, opts, threads)
    turns = []
    for i, p in enumerate(prompts):
        if on_turn is not None:
            on_turn(i, p)
        turns.append(r.say(p, on_text) if chat else r.complete(p, on_text))
    return r.result(turns)


def run_sessions(model: str | None, prompts: Sequence[str], n: int, *, chat: bool = False,
                 opts: DecodeOptions = DecodeOptions(), threads: int | None = None) -> dict:
    """`--sessions N`: N sessions run the same turns concurrently, each with its own cache, drafter and
    sampling seed (seed + i), batched into one forward per round. Returns texts per session and the rounds."""
    from dataclasses import replace

    from .session import generate_concurrent

    if not 1 <= n <= 8:
        raise BadFlagError(f"--sessions must be in 1..8, got {n}")
    if not prompts:
        raise BadFlagError("no prompt: give -p/--prompt or --conversation")
    n_threads = set_threads(threads)
    _check_device(opts.device)
    lm = load(model)
    plan = use_plan(lm, opts, threads)
    n_threads = set_threads(None)  # the count in use (the plan's, when it set one)
    use_device(lm, opts.device, opts.context, plan)
    costs = plan.spec_costs() if plan else None
    slots = [(*_slot(lm, opts, costs), replace(opts.sampling, seed=(opts.sampling.seed + i) % 2**64)) for i in range(n)]
    tok = lm.tokenizer
    texts: list[list[str]] = [[] for _ in range(n)]
    turns = []
    for p in prompts:
        reqs = []
        for c, d, samp in slots:
            ids = c.prepare(p) if chat else tok.encode(p, add_special=not c.session.tokens)
            reqs.append((c.session, dict(prompt=ids, max_tokens=opts.max_tokens, sampling=samp, drafter=d,
                                         max_draft=opts.max_draft)))
        results, cs = generate_concurrent(reqs)
        for i, ((c, _, _), (out, _)) in enumerate(zip(slots, results, strict=True)):
            text = tok.decode([t for t in out if t not in tok.eos_ids])
            texts[i].append(text)
            if chat:
                c.record(text)
        turns.append({"sessions": [{"tokens": out, **st.as_dict()} for out, st in results], **cs.as_dict()})
    return {"model": lm.path, "threads": n_threads, "strategy": opts.strategy, "sessions": n,
            "device": lm.device, "texts": texts, "turns": turns}


def write_trace(path: str | Path, turns: Sequence, session: int | None = None) -> None:
    """`--trace FILE`: one JSON line per window (strategy, k, measured ms, kept, emitted, distinct experts, and
    the adaptive scheduler's candidates with predicted ms/token and its choice)."""
    import json
    from dataclasses import asdict

    with open(path, "a") as f:
        for i, t in enumerate(turns):
            stats = t.stats if hasattr(t, "stats") else t
            for j, w in enumerate(stats.windows):
                rec = {"turn": i + 1, "window": j, **({"session": session} if session is not None else {}),
                       **asdict(w), "decision": w.decision.as_dict() if w.decision else None}
                rec["draft_ms"], rec["verify_ms"] = round(w.draft_ms, 4), round(w.verify_ms, 4)
                f.write(json.dumps(rec) + "\n")
