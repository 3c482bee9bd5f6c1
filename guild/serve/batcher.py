"""Continuous batching for `guild serve`: one thread owns the model; each round, every active request proposes
its window (its own strategy, drafter, scheduler state and sampling) and one batched forward within the
kernels' row-invariant size serves them all (`run_round`), so each request's tokens equal its solo run's.
Requests join between rounds and prefill one chunk per round, so a long prompt never stalls the others' tokens
for its whole prefill; they leave between rounds. Finished sessions stay in a bounded pool for prefix reuse.

No HTTP and no asyncio here: requests come in through `submit`, results go out through each job's `emit`."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.constraint import Constraint
from ..engine.sampling import SamplingParams, TokenLogprob
from ..engine.session import Generation, GenerationStats, GuildSession, run_round
from ..errors import GuildError
from ..kernels.cpu.quant import ROW_INVARIANT_ROWS
from ..speculative.base import Drafter
from ..speculative.options import DraftOptions
from ..text.chat import TextStream
from .metrics import Metrics

FINISH_REASONS = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}


class QueueFullError(Exception):
    pass


class DrainingError(Exception):
    pass


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str  # OpenAI's: stop | length
    prompt_tokens: int
    reused_tokens: int  # prompt tokens whose rows came from a pooled session
    ttft_s: float  # submission → first token
    stats: GenerationStats
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per emitted token, when the job asked


@dataclass
class Job:
    """One request as the engine sees it. `emit(kind, payload)` is called from the engine thread with
    ("text", str) as text becomes safe to send and, when `logprobs` is set, ("logprobs", [TokenLogprob]) for the
    tokens emitted since the last such call (after each round), then once ("done", Result) or ("error", message).
    `logprobs`: None, or how many alternatives each token's log-probability lists; `constraint`: the grammar the
    reply follows."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    strategy: str
    max_draft: int
    stop: tuple[str, ...]
    emit: Callable[[str, object], None]
    logprobs: int | None = None
    constraint: Constraint | None = None
    t_submit: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set by the HTTP side when the client goes away
    entry: Entry | None = None
    gen: Generation | None = None
    stream: TextStream | None = None
    reused: int = 0
    prefill_start: int = 0  # the cache row its prefill began at
    ttft_s: float = 0.0
    lp_sent: int = 0  # log-probabilities already handed to emit


@dataclass
class Entry:
    session: GuildSession
    drafter: Drafter
    strategy: str
    exact: int = 0  # leading cache rows that a fresh prefill of the same tokens would compute bit for bit
    used: int = 0  # LRU tick
    busy: bool = False


class SessionPool:
    """Sessions (KV cache + drafter) kept after their request, so a request that extends an earlier conversation
    feeds only its new tokens. Bounded: at most `max_bytes` of caches, least recently used evicted first.

    Reuse never changes a token: where the model's prefill is row-invariant at any chunk size (the int8 kernels
    on the CPU, `row_invariant`) or `prefill_batch` <= ROW_INVARIANT_ROWS, every row is computed as a fresh
    prefill computes it, so any common prefix is reusable; otherwise (chunks through BLAS) only rows from whole
    aligned chunks are, and the reused prefix is cut to a chunk boundary so the rest of the prompt is chunked
    exactly as a fresh prefill chunks it."""

    def __init__(self, make_session: Callable[[], GuildSession], make_drafter: Callable[[str], Drafter],
                 prefill_batch: int, max_bytes: int, row_invariant: bool = False):
        self.make_session, self.make_drafter = make_session, make_drafter
        self.batch, self.max_bytes = prefill_batch, max_bytes
        self.row_invariant = row_invariant or prefill_batch <= ROW_INVARIANT_ROWS
        self.entries: list[Entry] = []
        self._tick = 0

    @property
    def nbytes(self) -> int:
        return sum(e.session.state.nbytes for e in self.entries)

    def reusable(self, e: Entry, prompt: list[int]) -> int:
        """Prompt tokens whose rows `e` holds exactly as a fresh prefill would (at least one is left to feed) and
        its state can be cut back to (a recurrent state only to its position or a prefill checkpoint)."""
        held = e.session.tokens
        n = 0
        limit = min(len(held), len(prompt) - 1, e.exact)
        while n < limit and held[n] == prompt[n]:
            n += 1
        while True:
            m = e.session.state.reachable(n)
            m = m if self.row_invariant else m // self.batch * self.batch
            if m == n:
                return n
            n = m

    def acquire(self, prompt: list[int], strategy: str, session_bytes: int) -> tuple[Entry, int]:
        idle = [e for e in self.entries if not e.busy and e.strategy == strategy]
        best = max(idle, key=lambda e: (self.reusable(e, prompt), e.used), default=None)
        n = self.reusable(best, prompt) if best is not None else 0
        if best is None or (n == 0 and self.nbytes + session_bytes <= self.max_bytes):
            self._evict(session_bytes)
            best, n = Entry(self.make_session(), self.make_drafter(strategy), strategy), 0
            self.entries.append(best)
        best.busy = True
        best.session.rewind(n)
        best.exact = min(best.exact, best.session.state.pos)
        return best, n

    def prefilled(self, e: Entry, start: int) -> None:
        """After a prefill that began at cache row `start`: which rows are now exact."""
        pos = e.session.state.pos
        if self.row_invariant:
            e.exact = pos
        elif start == e.exact and start % self.batch == 0:
            e.exact = start + (pos - start) // self.batch * self.batch

    def release(self, e: Entry) -> None:
        e.busy = False
        st = e.session.state
        e.exact = st.pos if self.row_invariant else min(e.exact, st.pos)
        self._tick += 1
        e.used = self._tick

    def discard(self, e: Entry) -> None:
        self.entries.remove(e)

    def _evict(self, need: int) -> None:
        for e in sorted((e for e in self.entries if not e.busy), key=lambda e: e.used):
            if self.nbytes + need <= self.max_bytes:
                break
            self.entries.remove(e)


class BatchEngine:
    def __init__(self, lm, *, context: int, prefill_batch: int, parallel: int, max_queue: int, cache_bytes: int,
                 draft: DraftOptions = DraftOptions(), metrics: Metrics | None = None):
        self.lm, self.model, self.tok, self.draft = lm, lm.model, lm.tokenizer, draft
        self.parallel, self.max_queue, self.context = parallel, max_queue, context
        self.metrics = metrics or Metrics()
        probe = lm.session(context, prefill_batch)
        self.session_bytes = probe.state.nbytes
        if parallel * self.session_bytes > cache_bytes:
            raise GuildError(f"--parallel {parallel} sessions of --context {context} need "
                             f"{parallel * self.session_bytes / 2**20:.0f} MiB of cache, more than --cache-mem "
                             f"{cache_bytes / 2**20:.0f} MiB")
        self._spares = [probe]
        self.pool = SessionPool(lambda: self._spares.pop() if self._spares else lm.session(context, prefill_batch),
                                self._drafter, prefill_batch, cache_bytes, self.model.prefill_row_invariant())
        self._waiting: deque[Job] = deque()
        self._active: list[Job] = []
        self._cv = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="guild-engine", daemon=True)

    def _drafter(self, strategy: str) -> Drafter:
        return self.lm.drafter(self.draft.with_strategy(strategy), self.context)

    # -- the HTTP side ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._closing:
                raise DrainingError("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"{len(self._waiting)} requests are waiting (--max-queue {self.max_queue})")
            self._waiting.append(job)
            self.metrics.set("guild_queue_depth", len(self._waiting))
            self._cv.notify()

    def run(self) -> None:
        """The engine loop on the calling thread, until `close()` and everything in flight is done."""
        self._run()

    def close(self, timeout: float | None = None, wait: bool = True) -> None:
        """Finish what is queued and running, then stop (the thread `start` began, when `wait`)."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if wait and self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- the engine thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                if not self._step():
                    return
            except Exception as e:  # noqa: BLE001 - a bug fails the requests in flight, never the server
                for job in list(self._active):
                    self._fail(job, e)

    def _step(self) -> bool:
        """Admit waiting requests, run one round, retire finished ones. False when closed and drained."""
        with self._cv:
            while not self._waiting and not self._active and not self._closing:
                self._cv.wait()
            if self._closing and not self._waiting and not self._active:
                return False
            admit = []
            while self._waiting and len(self._active) + len(admit) < self.parallel:
                admit.append(self._waiting.popleft())
            self.metrics.set("guild_queue_depth", len(self._waiting))
        for job in admit:
            if not job.cancelled and self._start(job):
                self._active.append(job)
        for job in [j for j in self._active if j.cancelled]:
            self.metrics.inc("guild_cancelled_total")
            self._leave(job)
        gens = [j.gen for j in self._active if not j.gen.done and not j.gen.prefilling]
        if gens:
            t = time.perf_counter()
            n0 = sum(len(g.out) for g in gens)
            try:
                run_round(self.model, gens)
            except Exception as e:  # noqa: BLE001 - a failed forward fails its requests, not the server
                for j in [j for j in self._active if j.gen in gens]:
                    self._fail(j, e)
                return True
            dt = time.perf_counter() - t
            self.metrics.inc("guild_rounds_total")
            self.metrics.inc("guild_round_requests_total", len(gens))
            self.metrics.set("guild_batch_size", len(gens))
            self.metrics.set("guild_decode_tokens_per_second", (sum(len(g.out) for g in gens) - n0) / dt)
        self._prefill_chunk()
        for job in self._active:
            self._send_logprobs(job)
        for job in [j for j in self._active if j.gen.done]:
            self._done(job)
        self.metrics.set("guild_pool_sessions", len(self.pool.entries))
        self.metrics.set("guild_pool_bytes", self.pool.nbytes)
        return True

    def _start(self, job: Job) -> bool:
        try:
            e, n = self.pool.acquire(job.prompt, job.strategy, self.session_bytes)
        except Exception as exc:  # noqa: BLE001
            job.emit("error", str(exc))
            return False
        job.entry, job.reused = e, n
        job.prefill_start = e.session.state.pos
        job.stream = TextStream(self.tok, lambda s: job.emit("text", s), job.stop)
        try:
            job.gen = Generation(e.session, job.prompt[n:], job.max_tokens, job.stream.push, job.sampling,
                                 e.drafter, job.max_draft, job.strategy, job.constraint, job.logprobs,
                                 chunked=True)
        except Exception as exc:  # noqa: BLE001
            self._fail(job, exc)
            return False
        return True

    def _prefill_chunk(self) -> None:
        """One prefill chunk of the oldest request still prefilling: a long prompt delays the others' rounds by
        one chunk at a time, never by its whole prefill."""
        job = next((j for j in self._active if j.gen.prefilling), None)
        if job is None:
            return
        try:
            if not job.gen.prefill_chunk():
                return
        except Exception as exc:  # noqa: BLE001 - a failed prefill fails its request, not the server
            self._fail(job, exc)
            return
        job.ttft_s = time.perf_counter() - job.t_submit
        self.pool.prefilled(job.entry, job.prefill_start)

    def _done(self, job: Job) -> None:
        out, st = job.gen.result()
        text = job.stream.finish()
        res = Result(text, out, FINISH_REASONS.get(st.stop_reason, "stop"), len(job.prompt), job.reused,
                     job.ttft_s, st, job.gen.logprobs[: len(out)])
        m = self.metrics
        m.inc("guild_prompt_tokens_total", len(job.prompt))
        m.inc("guild_prefix_reused_tokens_total", job.reused)
        m.inc("guild_completion_tokens_total", len(out))
        m.inc("guild_decode_seconds_total", st.decode_s)
        m.inc("guild_time_to_first_token_seconds_sum", job.ttft_s)
        m.inc("guild_time_to_first_token_seconds_count")
        for w in st.windows:
            m.inc("guild_windows_total", strategy=w.strategy)
            m.inc("guild_drafted_tokens_total", w.k, strategy=w.strategy)
            m.inc("guild_accepted_tokens_total", w.emitted - 1, strategy=w.strategy)
        self._leave(job)
        job.emit("done", res)

    def _send_logprobs(self, job: Job) -> None:
        """The log-probabilities of the tokens emitted since the last call (a stop string may end the text before
        the window's last token: those after it are not sent)."""
        if job.logprobs is None:
            return
        n = len(job.gen.out)
        if n > job.lp_sent:
            job.emit("logprobs", job.gen.logprobs[job.lp_sent : n])
            job.lp_sent = n

    def _leave(self, job: Job) -> None:
        self._active.remove(job)
        self.pool.release(job.entry)

    def _fail(self, job: Job, exc: Exception) -> None:
        if job in self._active:
            self._active.remove(job)
        if job.entry is not None:
            self.pool.discard(job.entry)  # its cache may hold an open window
        msg = str(exc) if isinstance(exc, GuildError) else f"internal error: {type(exc).__name__}: {exc}"
        job.emit("error", msg)
