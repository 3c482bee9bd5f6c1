"""Cost-aware adaptive decoding: per window, pick the strategy s and draft length k that minimise expected
milliseconds per committed token (docs/adaptive.md):

    C(s, k) = (D(s) + V(1+k) + [follows rows] M_catchup(s)) / E[keep],   E[keep] = sum_{i=0..k} prod_{j<=i} a_j

blended with the strategy's decayed empirical ms per emitted token when that is worse than the model.

Plain classes, no clock and no I/O: the session measures every time and passes it in (`observe`), so the
scheduler runs on synthetic traces in tests. Acceptance comes from an online logistic model per strategy over
the proposal's signals and the draft position. It learns from every proposal, executed or not: decoding is
exact, so a draft token is accepted iff it equals the token later emitted at its position ("shadow"
verification, free).
A strategy's priors, buckets and traits (lazy, follows rows, uses the MTP head) are its drafter class's
(guild.speculative.registry); a strategy no drafter declares is an UnknownStrategyError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..window import MAX_WINDOW as MAX_T
from .costs import DraftCosts
from .guard import Guard
from .registry import drafter


def bucket(strategy: str, signals: dict) -> str:
    """The acceptance bucket of a proposal from its drafter's signals (match length, frequency, confidence)."""
    return drafter(strategy).bucket(signals)


def _logit(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def features(strategy: str, signals: dict) -> dict[str, float]:
    """The inputs of a proposal's acceptance model: a bias, the drafter's bucket (an intercept each), the
    drafter's own features (Drafter.features, 0 where typical) and whether the other drafters' proposals
    start with the same token (`agree`, set by the adaptive drafter; absent: 0). Drafts past the first add
    the input `deep`."""
    cls = drafter(strategy)
    f = {"bias": 1.0, "b:" + cls.bucket(signals): 1.0, **cls.features(signals)}
    if signals.get("agree") is not None:
        f["agree"] = float(signals["agree"])
    return f


TEXT = ("bias", "deep")  # the weights that say how this text differs from the priors: they learn fastest


@dataclass(frozen=True)
class SchedulerConfig:
    mtp_cap_k: int = 3  # k at most of the drafters that use the MTP head (every window's cap is its `room`)
    hysteresis: float = 0.05  # switch only for >= 5% expected improvement
    min_dwell: int = 0  # windows in a mode before switching away (backing off to normal is always allowed)
    backoff_after: int = 2  # consecutive zero-acceptance windows that send the mode back to normal
    prior_precision: float = 16.0  # of the Gaussian prior of the bucket and feature weights (docs/adaptive.md)
    text_precision: float = 4.0  # of the bias's and `deep`'s: what this text does beside the priors
    deep_prior: float = 0.2  # prior logit offset of drafts 2.. (kept given their predecessors were)
    decay: float = 0.98  # per-update relaxation of the weights' precision toward the prior: tracks the text
    cost_decay: float = 0.9  # decay of the empirical cost sums and window-time averages
    default_slope: float = 0.25  # V(T)/V(1) = 1 + slope (T-1) until measured (without a plan; int8 kernels: 0.15-0.23)
    probe_every: int = 16  # a lazy drafter (MTP) not asked for this many windows is asked anyway; a probe that
    probe_max: int = 64  # finds nothing worth drafting doubles that gap, up to probe_max windows
    guard_windows: int = 16  # asking windows the guard judges together (docs/adaptive.md "Guard")
    guard_margin: float = 0.03  # realised ms/token above plain's by more than this share rests the drafters
    guard_budget: float = 4.0  # ... as does an excess over plain of this many plain steps, at once
    rest_min: int = 16  # plain windows that ask no drafter after a loss; doubles per loss in a row up to rest_max
    rest_max: int = 256
    peek_every: int = 8  # a resting window asks the drafters that cost no forward this often
    probe_windows: int = 8  # after a rest, asking windows judged together (a shorter run: it lost before)

    def __post_init__(self):
        if not 0 <= self.mtp_cap_k <= MAX_T - 1:
            raise ValueError(f"draft lengths must be in 0..{MAX_T - 1}")
        if not 0 <= self.hysteresis < 1 or self.min_dwell < 0 or self.backoff_after < 1:
            raise ValueError("hysteresis in [0, 1), min_dwell >= 0, backoff_after >= 1")
        if not (0 < self.decay <= 1 and 0 < self.cost_decay <= 1 and self.prior_precision > 0
                and self.text_precision > 0):
            raise ValueError("decays in (0, 1], precisions > 0")
        if not 1 <= self.probe_every <= self.probe_max:
            raise ValueError("1 <= probe_every <= probe_max")
        if min(self.guard_windows, self.probe_windows) < 1 or not 0 <= self.guard_margin < 1 or self.guard_budget <= 0:
            raise ValueError("guard_windows, probe_windows >= 1, guard_margin in [0, 1), guard_budget > 0")
        if not 1 <= self.rest_min <= self.rest_max or self.peek_every < 1:
            raise ValueError("1 <= rest_min <= rest_max, peek_every >= 1")


class Acceptance:
    """Online Bayesian logistic regression of the conditional acceptance a_i (draft i kept given 1..i-1 were),
    one weight vector per strategy over `features`: a Gaussian posterior with diagonal precision, updated by a
    Laplace step per outcome (Chapelle & Li 2011, "An Empirical Evaluation of Thompson Sampling", Algorithm 3,
    one outcome at a time).
    Prior means: the logit of each bucket's prior (Drafter.priors), the drafter's feature weights
    (Drafter.weights), `deep_prior`; every other weight 0. Each update relaxes the precisions it touches toward
    the prior's, so the estimate follows the text."""

    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.mean: dict[str, dict[str, float]] = {}
        self.prec: dict[str, dict[str, float]] = {}
        self.version: dict[str, int] = {}  # per strategy: bumped whenever its weights change

    def _prior(self, strategy: str, name: str) -> float:
        cls = drafter(strategy)
        if name.startswith("b:"):
            return _logit(cls.priors[name[2:]])
        if name == "deep":
            return self.cfg.deep_prior
        return cls.weights.get(name, 0.0)

    def _q0(self, name: str) -> float:
        return self.cfg.text_precision if name in TEXT else self.cfg.prior_precision

    def _weights(self, strategy: str, x: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        m = self.mean.setdefault(strategy, {})
        q = self.prec.setdefault(strategy, {})
        for name in x:
            if name not in m:
                m[name], q[name] = self._prior(strategy, name), self._q0(name)
        return m, q

    def _w(self, strategy: str, name: str) -> float:
        m = self.mean.get(strategy)
        return m[name] if m and name in m else self._prior(strategy, name)

    def probs(self, strategy: str, signals: dict, k: int) -> list[float]:
        """a_1..a_k: the first draft's, then the deeper ones' (one rate: they differ only by `deep`)."""
        if k <= 0:
            return []
        z = sum(v * self._w(strategy, n) for n, v in features(strategy, signals).items())
        return [_sigmoid(z)] + [_sigmoid(z + self._w(strategy, "deep"))] * (k - 1)

    def learn(self, strategy: str, x: dict[str, float], y: int) -> None:
        """One outcome: the posterior's mode along x (Newton in the one dimension z = w.x), then its precision."""
        m, q = self._weights(strategy, x)
        self.version[strategy] = self.version.get(strategy, 0) + 1
        g = self.cfg.decay
        for n in x:
            q[n] = g * q[n] + (1 - g) * self._q0(n)
        z0 = sum(m[n] * v for n, v in x.items())
        var = sum(v * v / q[n] for n, v in x.items())
        z = z0
        for _ in range(4):
            p = _sigmoid(z)
            z -= (z - z0 - var * (y - p)) / (1 + var * p * (1 - p))
        p = _sigmoid(z)
        for n, v in x.items():
            m[n] += v / q[n] * (y - p)
            q[n] += p * (1 - p) * v * v

    def update(self, strategy: str, signals: dict, drafted: int, accepted: int) -> None:
        """A proposal of `drafted` tokens whose first `accepted` matched (positions 1..accepted succeeded,
        position accepted+1 failed if it exists)."""
        x = features(strategy, signals)
        for i in range(1, min(accepted + 1, drafted, MAX_T - 1) + 1):
            self.learn(strategy, x if i == 1 else {**x, "deep": 1.0}, int(i <= accepted))

    def forget(self, strategy: str, keep: float = 0.1) -> None:
        """A back-off says the text changed: the precision of the strategy's text weights drops to `keep` of
        their prior's, so the next outcomes move them most."""
        q = self.prec.get(strategy, {})
        self.version[strategy] = self.version.get(strategy, 0) + 1
        for n in TEXT:
            if n in q:
                q[n] = keep * self._q0(n)


class Costs:
    """Window time V(T) = V(1) * rho(T): V(1) tracked live from plain steps, the shape rho(T) from the plan (or
    a default slope) and refined per T from measured windows. Drafter propose ms and catch-up likewise."""

    def __init__(self, cfg: SchedulerConfig, plan: DraftCosts | None = None):
        self.cfg = cfg
        if plan is not None:
            v = list(plan.verify_ms) + [None] * MAX_T
            base = plan.verify_ms[0]
            last = len(plan.verify_ms)
            slope = (plan.verify_ms[-1] / base - 1) / (last - 1) if last > 1 else cfg.default_slope
            self.prior_rho = [1.0] + [v[t - 1] / base if v[t - 1] else 1 + slope * (t - 1) for t in range(2, MAX_T + 1)]
            self.v1 = base
            self.draft_ms = dict(plan.draft_ms)
            self.catchup_ms = dict(plan.catchup_ms)
            self.context = plan.context  # the KV length V(T) was last measured at
        else:
            self.context = 0
            self.prior_rho = [1.0 + cfg.default_slope * (t - 1) for t in range(1, MAX_T + 1)]
            self.v1 = None  # seeded by the first plain step
            self.draft_ms = {}
            self.catchup_ms = {}
        self.rho_sum = [0.0] * MAX_T  # decayed sums of measured V(T)/V(1), per T
        self.rho_n = [0.0] * MAX_T
        self.kappa_sum = 0.0  # decayed sums of measured / prior growth (rho - 1) over every T >= 2 window
        self.kappa_n = 0.0
        self.v1_n = 0
        self.cold_ms = [0.0] * MAX_T  # expected ms of reading cold experts, per T (observe_residency)

    @property
    def seeded(self) -> bool:
        """V(1) measured live at this context (a plan's V(1) was measured at another context length)."""
        return self.v1_n > 0

    def rho(self, t: int) -> float:
        """V(T)/V(1): measured windows of this T, else the prior shape with its growth rescaled by kappa."""
        w0 = 2.0  # prior weight, in windows
        kappa = (self.kappa_sum + w0) / (self.kappa_n + w0)
        prior = 1.0 + kappa * (self.prior_rho[t - 1] - 1.0)
        return (self.rho_sum[t - 1] + w0 * prior) / (self.rho_n[t - 1] + w0)

    def verify(self, t: int) -> float:
        """V(T): the window's compute, plus the reads of the experts its rows would fault in."""
        return self.warm(t) + self.cold_ms[t - 1]

    def warm(self, t: int) -> float:
        return (self.v1 or 0.0) * (1.0 if t == 1 else self.rho(t))

    def draft(self, strategy: str) -> float:
        return self.draft_ms.get(strategy, 0.0)

    def catchup(self, strategy: str) -> float:
        return self.catchup_ms.get(strategy, 0.0)

    def observe_verify(self, t: int, ms: float) -> None:
        g = self.cfg.cost_decay
        ms = max(ms - self.cold_ms[t - 1], 0.1 * ms)  # the compute part: reads are priced apart
        if not self.v1_n or (t == 1 and self.v1_n < 3):
            if t == 1:  # the first 3 plain steps seed V(1) at this context, the least of them: a first step's
                self.v1 = min(self.v1, ms) if self.v1_n else ms  # one-off stall (page faults) is no V(1)
                self.v1_n += 1
            return
        pred = self.warm(t)
        ms = min(max(ms, pred / 3), pred * 3)  # a one-off stall (JIT, page faults) moves the estimate little
        if t == 1:
            self.v1 = g * self.v1 + (1 - g) * ms
            self.v1_n += 1
            return
        r = ms / self.v1
        self.rho_sum[t - 1] = g * self.rho_sum[t - 1] + r
        self.rho_n[t - 1] = g * self.rho_n[t - 1] + 1
        self.kappa_sum = g * self.kappa_sum + (r - 1.0) / max(self.prior_rho[t - 1] - 1.0, 1e-3)
        self.kappa_n = g * self.kappa_n + 1

    def observe_residency(self, cold_ms: Sequence[float] | None) -> None:
        """Expected ms of the expert reads a window of T = 1..MAX_T rows would wait for (an expert cache's cold
        experts of the window's union, priced at its measured read time; None: every expert resident)."""
        self.cold_ms = [0.0] * MAX_T if cold_ms is None else [float(c) for c in cold_ms][:MAX_T]

    def observe_draft(self, strategy: str, ms: float) -> None:
        if drafter(strategy).follows_rows:  # a measured propose includes its catch-up: the plan's term retires
            self.catchup_ms.pop(strategy, None)
        old = self.draft_ms.get(strategy)
        self.draft_ms[strategy] = ms if old is None else 0.9 * old + 0.1 * ms


@dataclass(frozen=True)
class Proposal:
    strategy: str
    tokens: tuple[int, ...]
    signals: dict = field(default_factory=dict)
    # per token, whether a grammar forces it (accepted with probability 1 once its predecessors are); () = none
    certain: tuple[bool, ...] = ()

    def acceptance(self, model: Sequence[float]) -> list[float]:
        """a_1..a_k: the model's rate of each position (the first draft's, then the deeper ones'), 1 where the
        grammar forces the token."""
        c = self.certain
        return [1.0 if i < len(c) and c[i] else a for i, a in enumerate(model)]

    @property
    def uncertain(self) -> int:
        return len(self.tokens) - sum(self.certain)


@dataclass(frozen=True)
class Decision:
    strategy: str  # "normal" or the drafting strategy whose tokens feed this window
    k: int
    mode: str  # the scheduler's mode after this decision
    predicted: float  # ms per committed token of the choice
    costs: dict  # {"normal": ms/token, strategy: [ms/token for k = 1..], ...}
    reason: str  # why: "best", "hysteresis", "dwell", "backoff", "empty", "unseeded", "rest", ...
    vt_context: int = 0  # the KV length the window costs V(T) were last measured at (a plan's, then live)

    def as_dict(self) -> dict:
        cands = {s: round(v, 4) if isinstance(v, float) else [round(x, 4) for x in v] for s, v in self.costs.items()}
        return {"choice": self.strategy, "k": self.k, "mode": self.mode, "predicted_ms_per_token":
                round(self.predicted, 4), "candidates": cands, "reason": self.reason, "vt_context": self.vt_context}


class AdaptiveScheduler:
    """Chooses (strategy, k) per window; learns acceptance from shadow verification and costs from measured
    windows. Stability: a mode changes only for >= `hysteresis` expected gain after `min_dwell` windows;
    two zero-acceptance windows send the mode back to normal and mute that strategy for clamp(2r, 2, 6)
    windows (r = its consecutive back-offs); nothing is latched off for good."""

    def __init__(self, cfg: SchedulerConfig | None = None, costs: DraftCosts | None = None):
        self.cfg = cfg or SchedulerConfig()
        self.acc = Acceptance(self.cfg)
        self.costs = Costs(self.cfg, costs)
        self.mode = "normal"
        self.dwell = self.cfg.min_dwell  # windows since the last mode change
        self.zero_run: dict[str, int] = {}
        self.backoffs: dict[str, int] = {}
        self.muted: dict[str, int] = {}  # strategy -> windows left muted
        self.emp_t: dict[str, float] = {}  # decayed sums of window ms and emitted tokens, per strategy
        self.emp_n: dict[str, float] = {}
        self.emp_w: dict[str, float] = {}  # decayed window counts
        self.last: Decision | None = None
        self.lazy_buckets: dict[str, dict[str, float]] = {}  # decayed counts of each lazy drafter's buckets
        self.lazy_latest: dict[str, dict[str, dict]] = {}  # the signals of its latest proposal in each bucket
        self.lazy_version: dict[str, int] = {}  # bumped on each of its proposals
        self.lazy_keeps: dict[str, tuple] = {}  # _bucket_keeps' cache
        self.unasked: dict[str, int] = {}  # windows since each lazy drafter was last asked
        self.probe_gap: dict[str, int] = {}  # windows between probes of each lazy drafter
        self.guard = Guard(self.cfg)
        self.asked: bool | None = None  # whether the window decided last asked the drafters (None: not judged)

    # ---------------------------------------------------------------- cost model
    def _blend(self, s: str, c_model: float) -> float:
        n = self.emp_n.get(s, 0.0)
        if not n:
            return c_model
        c_emp = self.emp_t[s] / n
        if c_emp <= c_model:
            return c_model
        w = self.emp_w[s] / (self.emp_w[s] + 2.0)  # trust grows with the windows behind it
        return w * c_emp + (1 - w) * c_model

    def _curve(self, a: Sequence[float]) -> list[tuple[float, float]]:
        """(V(1+k), E[keep]) for k = 1..len(a) drafts of conditional acceptances a."""
        out, q, e = [], 1.0, 1.0
        for k, ak in enumerate(a, 1):
            q *= ak
            e += q
            out.append((self.costs.verify(k + 1), e))
        return out

    def _kmax(self, strategy: str, n_tokens: int, room: int) -> int:
        """The most drafts of `strategy` a window may take: `room` is the one draft cap (the session's: tokens
        and context left, --spec-max-draft); a drafter on the MTP head also stops at mtp_cap_k."""
        k = min(n_tokens, room, MAX_T - 1)
        return min(k, self.cfg.mtp_cap_k) if drafter(strategy).uses_head else k

    def acceptance(self, p: Proposal, k: int) -> list[float]:
        """The predicted a_1..a_k of a proposal's drafts (each given its predecessors were accepted)."""
        return p.acceptance(self.acc.probs(p.strategy, p.signals, min(k, MAX_T - 1)))

    def candidate_costs(self, p: Proposal, room: int) -> list[float]:
        """C(s, k) for k = 1..min(len(tokens), cap, room), in ms per committed token."""
        kmax = self._kmax(p.strategy, len(p.tokens), room)
        if kmax <= 0:
            return []
        extra = self.costs.draft(p.strategy) + self.costs.catchup(p.strategy)
        curve = self._curve(self.acceptance(p, kmax))
        return [self._blend(p.strategy, (extra + v) / e) for v, e in curve]

    # ---------------------------------------------------------------- decisions
    def ask_value(self, strategy: str, best: float, room: int) -> float:
        """Expected ms saved by running the lazy drafter this window, against `best` ms per token without it: its
        forward is paid whatever it says; then it drafts only in the confidence buckets where that pays
        (docs/adaptive.md "MTP confidence"). Buckets are weighted by their recent shares of its proposals, each
        priced at the signals of its latest proposal (at the bucket's prior until it has one)."""
        kmax = self._kmax(strategy, MAX_T, room)
        shares = self._shares(strategy)
        total = sum(shares.values())
        keeps = self._bucket_keeps(strategy, kmax)
        v = [self.costs.verify(k + 1) for k in range(1, kmax + 1)]
        gain = sum(w / total * max([0.0] + [best * e - vk for e, vk in zip(keeps[b], v, strict=True)])
                   for b, w in shares.items())
        return gain - self.costs.draft(strategy) - self.costs.catchup(strategy)

    def _bucket_keeps(self, strategy: str, kmax: int) -> dict[str, list[float]]:
        """E[keep | k] for k = 1..kmax per bucket of a lazy drafter, recomputed only when its weights or its
        latest proposals changed (asking is weighed every window)."""
        key = (self.acc.version.get(strategy, 0), self.lazy_version.get(strategy, 0), kmax)
        hit = self.lazy_keeps.get(strategy)
        if hit is None or hit[0] != key:
            latest = self.lazy_latest.get(strategy, {})
            keeps = {}
            for b in self._shares(strategy):
                a = self.acc.probs(strategy, latest[b], kmax) if b in latest else [drafter(strategy).priors[b]] * kmax
                keeps[b] = [e for _, e in self._curve(a)]
            hit = self.lazy_keeps[strategy] = (key, keeps)
        return hit[1]

    def _shares(self, strategy: str) -> dict[str, float]:
        if strategy not in self.lazy_buckets:
            self.lazy_buckets[strategy] = dict.fromkeys(drafter(strategy).priors, 1.0)
        return self.lazy_buckets[strategy]

    def ask(self, strategy: str, proposals: Sequence[Proposal], room: int) -> bool:
        """Whether to run a lazy drafter (MTP: a head forward) this window: when its expected saving (ask_value)
        beats the hysteresis margin, else as a probe after `probe_gap` windows (16, doubling to 64 while probes
        find nothing worth drafting) to keep its estimates fresh. Never while muted."""
        if room <= 0 or strategy in self.muted or not self.costs.seeded:
            return False
        n = self.unasked[strategy] = self.unasked.get(strategy, 0) + 1
        best = self._blend("normal", self.costs.verify(1))
        for p in proposals:
            if p.tokens and p.strategy not in self.muted:
                best = min(best, *self.candidate_costs(p, room))
        if self.ask_value(strategy, best, room) > self.cfg.hysteresis * best:  # the margin a draft must beat by
            self.unasked[strategy] = 0
            return True
        gap = self.probe_gap.get(strategy, self.cfg.probe_every)
        if n >= gap:
            self.unasked[strategy] = 0
            self.probe_gap[strategy] = min(2 * gap, self.cfg.probe_max)
            return True
        return False

    def rest(self) -> Decision | None:
        """A plain step asking no drafter while the guard rests them (else None: ask them, then `decide`; on a
        peek, only those that cost no forward)."""
        if not self.guard.resting or self.guard.peek:
            return None
        self.asked = False
        v1 = self.costs.verify(1)
        return self._take("normal", 0, v1, {"normal": v1}, "rest")

    def decide(self, proposals: Sequence[Proposal], room: int) -> Decision:
        """The window to run: (strategy, k) from this window's proposals (empty ones mean Normal)."""
        dec = self._decide(proposals, room)
        if self.guard.resting:  # a peek: a draft that pays wakes the drafters, else the window still rests
            if dec.k:
                self.guard.wake()
            else:
                dec = self.last = replace(dec, reason="rest")
            self.asked = bool(dec.k)
        else:
            self.asked = self.costs.seeded  # the unseeded first step is plain's own measure, not the drafters'
        return dec

    def _decide(self, proposals: Sequence[Proposal], room: int) -> Decision:
        c = self.cfg
        if self.muted:
            for s in list(self.muted):
                self.muted[s] -= 1
                if self.muted[s] <= 0:
                    del self.muted[s]
        if not self.costs.seeded:  # the first plain step measures V(1) at this context
            return self._take("normal", 0, 0.0, {}, "unseeded")
        c_normal = self._blend("normal", self.costs.verify(1))
        table: dict = {"normal": c_normal}
        best: dict[str, tuple[float, int]] = {}
        for p in proposals:
            if not p.tokens:
                continue
            cs = self.candidate_costs(p, room)
            if cs:
                table[p.strategy] = cs
                if p.strategy not in self.muted or not p.uncertain:  # grammar-forced tokens risk nothing
                    m = min(cs)
                    best[p.strategy] = (m, cs.index(m) + 1)
        # a draft must beat a plain step by the margin: acceptance estimates are noisy and we draft exactly when
        # they look high, so a marginal predicted gain is more likely a loss
        bar = (1 - c.hysteresis) * c_normal
        paying = {s: v for s, v in best.items() if v[0] < bar}
        if not paying:
            return self._take("normal", 0, c_normal, table, "normal" if best else "no-proposal")
        ch = min(paying, key=lambda s: paying[s][0])
        if ch == self.mode:
            return self._take(ch, paying[ch][1], paying[ch][0], table, "best")
        if self.mode in paying:  # another drafter: switch only for the margin, after the dwell
            stay = paying[self.mode]
            if paying[ch][0] >= (1 - c.hysteresis) * stay[0] or self.dwell < c.min_dwell:
                return self._take(self.mode, stay[1], stay[0], table, "hysteresis")
        elif self.mode == "normal" and self.dwell < c.min_dwell:  # just backed off: dwell before drafting again
            return self._take("normal", 0, c_normal, table, "dwell")
        self.mode, self.dwell = ch, 0
        return self._take(ch, paying[ch][1], paying[ch][0], table, "switch")

    def _take(self, s: str, k: int, cost: float, table: dict, reason: str) -> Decision:
        self.dwell += 1
        self.last = Decision(s, k, self.mode, cost, table, reason, self.costs.context)
        return self.last

    # ---------------------------------------------------------------- feedback (times measured by the caller)
    def observe_window(self, strategy: str, k: int, draft_ms: float, verify_ms: float, emitted: int,
                       context: int | None = None) -> None:
        """A window ran: `k` drafts of `strategy` ("normal" when k == 0), emitting `emitted` tokens, its rows
        after `context` KV positions (None: unknown)."""
        g = self.cfg.cost_decay
        if context is not None:
            self.costs.context = context
        if self.asked is not None:  # judged at the V(1) before this window; a one-off stall counts as 3 windows
            ms = min(draft_ms + verify_ms, 3 * self.costs.verify(k + 1))
            self.guard.observe(self.asked, ms, emitted, self.costs.verify(1))
            self.asked = None
        self.costs.observe_verify(k + 1, verify_ms)
        s = strategy if k else "normal"
        for d in (self.emp_t, self.emp_n, self.emp_w):  # every window ages every strategy's record
            d.setdefault(s, 0.0)
            for key in d:
                d[key] *= g
        self.emp_t[s] += draft_ms + verify_ms
        self.emp_n[s] += max(emitted, 1)
        self.emp_w[s] += 1
        if not k:
            return
        if emitted > 1:
            self.zero_run[s] = 0
            self.backoffs[s] = 0
            self.probe_gap.pop(s, None)  # its drafts pay again: probe at the base rate
            return
        self.zero_run[s] = self.zero_run.get(s, 0) + 1
        if self.zero_run[s] >= self.cfg.backoff_after:
            self.zero_run[s] = 0
            r = self.backoffs[s] = self.backoffs.get(s, 0) + 1
            self.muted[s] = min(max(2 * r, 2), 6)
            self.acc.forget(s)
            if self.mode == s:
                self.mode, self.dwell = "normal", 0

    def observe_proposal(self, p: Proposal, accepted: int) -> None:
        """Shadow verification of a proposal (executed or not): its first `accepted` tokens were emitted."""
        if p.tokens:
            self.acc.update(p.strategy, p.signals, len(p.tokens), accepted)

    def observe_draft_ms(self, strategy: str, ms: float) -> None:
        self.costs.observe_draft(strategy, ms)

    def observe_residency(self, cold_ms: Sequence[float] | None) -> None:
        """The next window's expected cold-expert ms per T (Costs.observe_residency): a draft whose rows would
        fault experts in costs that much more, so k shrinks when the cache is cold."""
        self.costs.observe_residency(cold_ms)

    def observe_lazy(self, strategy: str, signals: dict) -> None:
        """The signals of the draft a lazy drafter just proposed (MTP: the head's top-1 probability,
        docs/adaptive.md "MTP confidence"): the bucket shares `ask_value` weighs, and its bucket's latest."""
        shares = self._shares(strategy)
        for b in shares:
            shares[b] *= self.cfg.decay
        b = bucket(strategy, signals)
        shares[b] += 1.0
        self.lazy_latest.setdefault(strategy, {})[b] = dict(signals)
        self.lazy_version[strategy] = self.lazy_version.get(strategy, 0) + 1
