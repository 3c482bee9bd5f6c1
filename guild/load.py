"""One loader for every command (run, bench, optimize, and a server): a model (tag or GGUF path) with its plan,
CPU threads, device placement and MTP head → LoadedModel, which then hands out sessions and drafters."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numba

from . import warmup
from .calib.optimize import plan_for
from .engine import experts
from .engine.backends import PARALLEL_ROWS
from .engine.device import place_model, resolve_device
from .engine.gpu import describe as describe_placement
from .engine.memory import keep_freed_blocks
from .engine.options import DecodeOptions, RopeOptions
from .engine.session import GuildSession
from .errors import BadFlagError, GuildError
from .formats.gguf import GGUFFile
from .formats.repack_cache import cache_path, load_cached
from .kernels.cpu import quant
from .kvtypes import F32_KV, KVTypes
from .models import load_model
from .models.mtp import find_mtp_head, load_mtp_head
from .models.validate import check_context
from .plans.plan import Plan
from .speculative.base import Drafter
from .speculative.build import make_drafter
from .speculative.options import DraftOptions, MtpOptions
from .speculative.registry import needs
from .text.chat import Conversation, Slot
from .text.inputs import MAX_CORPUS_BYTES, read_text_file
from .text.options import TextOptions
from .text.tokenizer import Tokenizer
from .upcycle import resolve_model

log = logging.getLogger(__name__)


def set_threads(threads: int | None) -> int:
    """Numba worker threads for the kernels (None = leave as is); returns the count in use."""
    if threads is not None:
        if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
            raise BadFlagError(f"--threads must be in 1..{numba.config.NUMBA_NUM_THREADS}, got {threads}")
        numba.set_num_threads(threads)
    return numba.get_num_threads()


@dataclass
class LoadedModel:
    path: str
    gguf: GGUFFile
    model: object  # a models/ architecture, or the GPU engine built on it
    tokenizer: Tokenizer
    load_s: float
    threads: int = 1
    device: str = "cpu"  # what runs the model, in words
    device_reason: str = ""  # why the CPU runs it when --device auto did not take the GPU
    plan: Plan | None = None
    mtp: MtpOptions = field(default_factory=MtpOptions)
    numerics: str = "i8"  # the mode the model's matrices were packed under (kernels/cpu/quant.py NUMERICS)
    kv: KVTypes = F32_KV  # the stored types of every session's KV cache (--cache-type-k / --cache-type-v)
    # where the weights are: load_cached's "cache" / "built" (the repack cache) or "memory"; "streamed": experts
    # read from the cache through an expert cache (a model larger than memory)
    weights: str = "memory"
    compile_helper: bool | None = None  # warm_up's helper process: None none ran, else whether it finished cleanly
    _heads: dict = field(default_factory=dict, repr=False)  # (head file, draft vocab) -> MtpHead | None

    @property
    def costs(self):
        """The plan's calibrated costs for the adaptive scheduler (None without a plan)."""
        return self.plan.draft_costs() if self.plan is not None else None

    def mtp_head(self, strategy: str):
        """The MTP head a strategy drafts with: None for strategies that use none and, for `adaptive`, when the
        model has none; `mtp` without one is an error saying how to train one."""
        s = needs(strategy)
        if not s.uses_head:
            return None
        key = (self.mtp.head, self.mtp.vocab)
        if key not in self._heads:
            with quant.numerics(self.numerics):  # the head's matrices like the model's
                self._heads[key] = find_mtp_head(self.model, self.mtp.head, self.mtp.vocab or None)
        if self._heads[key] is None and s.needs_head:
            load_mtp_head(self.model, self.mtp.head)  # raises, saying how to make one
        return self._heads[key]

    def drafter(self, draft: DraftOptions, n_ctx: int, corpus_texts=()) -> Drafter:
        """A session's drafter, seeded with the plan's costs, its corpus (--retrieval-corpus files and
        `corpus_texts`) ingested."""
        d = make_drafter(draft, costs=self.costs, mtp_head=self.mtp_head(draft.strategy), n_ctx=n_ctx)
        for f in draft.corpus:
            d.ingest(self.tokenizer.encode(read_text_file(f, "--retrieval-corpus", MAX_CORPUS_BYTES, "replace")))
        for text in corpus_texts:
            d.ingest(self.tokenizer.encode(text))
        return d

    def session(self, n_ctx: int, prefill_batch: int = 512) -> GuildSession:
        check_context(self.model, n_ctx, self.kv)  # the KV cache fits in memory
        return GuildSession(self.model, n_ctx=n_ctx, prefill_batch=prefill_batch, eos_ids=self.tokenizer.eos_ids,
                            kv=self.kv)

    def _warm_ids(self) -> list[int]:
        """A chat prompt through the template (Jinja compiles it on first use), PARALLEL_ROWS + 2 tokens long: the
        row-parallel host ops a chat prompt's prefill takes (backends.PARALLEL_ROWS)."""
        text = "Hello, hello, hello, hello"
        try:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        except GuildError:  # a template that cannot render fails the chat turn that uses it, not the load
            pass
        ids = self.tokenizer.encode(text, add_special=True)
        return (ids + ids[-4:] * (PARALLEL_ROWS + 2))[: PARALLEL_ROWS + 2]

    def warm_up(self, strategy: str, mtp: MtpOptions) -> None:
        """Load (or compile) what a first chat turn would wait for: the chat template, then the kernels, by a short
        generation on a throwaway session with the strategy's drafter (as llama.cpp's warm-up run at load); its
        time counts as loading. With the kernels cold, a helper process compiles a prompt window's kernels while
        this one compiles a decode step's and the drafter's (guild.warmup)."""
        t0 = time.perf_counter()
        ids = self._warm_ids()
        draft = replace(DraftOptions(), mtp=mtp).with_strategy(strategy)
        helper = None
        if warmup.helper_wanted(self.device, self.weights):
            helper = warmup.CompileHelper.start(self.path, self.numerics, self.kv.k, self.kv.v, self.threads)
        try:
            d = self.drafter(draft, 64)  # its kernels first: a helper meanwhile compiles a prompt window's
            if helper is not None:
                self.session(64).generate(ids[:1], 2)  # the whole-step call (steps, draft windows) meanwhile
                self.compile_helper = helper.wait() == 0
            self.session(64).generate(ids, 6, drafter=d, max_draft=4)
        finally:
            if helper is not None:
                helper.close()
        self.load_s += time.perf_counter() - t0

    def warm_window(self) -> None:
        """A compile helper's share of warm_up: a prompt window's kernels (PARALLEL_ROWS + 2 rows, layer by layer;
        draft windows take the loader's whole-step call)."""
        self.session(64).generate(self._warm_ids(), 1)


def apply_rope(model, rope: RopeOptions, context: int) -> None:
    """The --rope-* flags over the model's metadata, tables for `context` positions; a context past what the
    rope covers (trained, or stretched by its scaling) runs, with a one-line warning on stderr."""
    a = model.args
    base, scaling = rope.resolve(a.rope_base, a.rope_scaling)
    if (base, scaling) != (a.rope_base, a.rope_scaling) or context > model.cos.shape[0]:
        model.set_rope(base, scaling, context)
    a = model.args
    if context > a.trained_context:
        log.warning("warning: --context %d is past the %d tokens %s was trained for (rope scaling %s); past them "
                    "its output may degrade (--rope-scaling yarn --rope-scale %d stretches the rope to cover it)",
                    context, a.trained_context, a.arch, scaling.describe(), -(-context // a.context_length))


def move_to_device(lm: LoadedModel, device: str | None, context: int, placement=None) -> None:
    """Put lm's model on `device` (see engine.device.place_model) and say where it runs."""
    t0 = time.perf_counter()
    lm.model, dev, lm.device_reason = place_model(lm.model, device, context, placement, lm.kv)
    lm.load_s += time.perf_counter() - t0
    lm.device = f"{dev.describe()} · {describe_placement(lm.model)}" if dev.is_cuda else "cpu"


def load(model: str | None, plan: str | Path | None = None, threads: int | None = None, device: str | None = "cpu",
         mtp: MtpOptions = MtpOptions(), *, context: int = 4096, strict_plan: bool = False,
         progress: bool = True, numerics: str | None = None, rope: RopeOptions = RopeOptions(),
         kv: KVTypes = F32_KV, expert_cache: str | int | None = None) -> LoadedModel:
    """Open `model` (a tag or a GGUF path), check `plan` (a `guild optimize` file: regenerated next to it when
    it is for another machine or model, unless strict_plan) and apply its thread count unless `threads` is
    given, then place the model on `device` (the plan's placement when it has one) with rope tables for
    `context` positions under `rope` (the --rope-* flags). `numerics`: "i8" (int8 activations where the quant
    type has such kernels) or "f32"; default: the process's (quant.set_default_numerics). `kv`: the KV cache's
    stored types. `expert_cache`: "auto", "off" or bytes for a
    MoE's experts read from disk (guild.engine.experts); default: the process's (experts.set_default)."""
    if strict_plan and plan is None:
        raise BadFlagError("--strict-plan needs --gexec PLAN")
    if (device or "").lower() == "cuda":
        resolve_device(device)  # a missing GPU fails before the model loads
    t0 = time.perf_counter()
    path = str(resolve_model(model, progress=progress))
    g = GGUFFile(path)
    setting = experts.default() if expert_cache is None else expert_cache
    stream = g.get(f"{g.architecture}.expert_count", int, 0) > 0 and experts.wanted(setting, Path(path).stat().st_size)
    if stream:  # before the kernels' threads start (set_threads starts them)
        experts.wait_passively()
    set_threads(threads)
    with quant.numerics(numerics):
        # repacked weights mapped from guild's cache
        model, how = load_cached(g, load_model, progress=progress, read_ahead=not stream)
        mode = quant.current_numerics()
    if stream and how == "memory" and setting != "auto":
        raise GuildError("--expert-cache-mem: the experts are read from guild's repack cache, which is off or not "
                         "writable here (GUILD_REPACK_CACHE, the cache directory)")
    if stream and how != "memory":
        experts.attach(model, cache_path(g.identity_digest(), mode), setting)
    apply_rope(model, rope, context)
    kv.check_head_dim(model.args.head_dim)
    lm = LoadedModel(path, g, model, Tokenizer.from_metadata(g.metadata), 0.0, mtp=mtp, numerics=numerics or mode,
                     kv=kv, weights="streamed" if stream and how != "memory" else how)
    lm.load_s = time.perf_counter() - t0
    if plan is not None:
        lm.plan = plan_for(plan, lm, strict=strict_plan, progress=progress)
        if threads is None:
            set_threads(min(lm.plan.cpu.threads, numba.config.NUMBA_NUM_THREADS))
    lm.threads = set_threads(None)
    move_to_device(lm, device, context, lm.plan.placement if lm.plan is not None else None)
    keep_freed_blocks()  # after loading: the forward's scratch, not the load's one-off buffers
    return lm


def load_for(model: str | None, opts: DecodeOptions, threads: int | None = None) -> LoadedModel:
    """The model as `opts` wants it: its plan (--gexec), threads, device and MTP head options."""
    return load(model, opts.gexec, threads, opts.device, opts.mtp, context=opts.context, strict_plan=opts.strict_plan,
                rope=opts.rope, kv=opts.kv)


def slots(lm: LoadedModel, opts: DecodeOptions, n: int = 1, corpus_texts=(),
          text: TextOptions = TextOptions()) -> list[Slot]:
    """n sessions, each with its own cache, drafter (corpus ingested) and sampling seed (seed + i)."""
    out = []
    grammar = text.compile(lm.tokenizer)
    for i in range(n):
        session = lm.session(opts.context, opts.prefill_batch)
        if text.ignore_eos:
            session.eos_ids = frozenset()
        conv = Conversation(session, lm.tokenizer, text.system)
        out.append(Slot(conv, lm.drafter(opts, opts.context, corpus_texts),
                        replace(opts.sampling, seed=(opts.sampling.seed + i) % 2**64), grammar))
    return out
