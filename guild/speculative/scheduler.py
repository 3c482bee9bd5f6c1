"""Cost-aware adaptive decoding: per window, pick the strategy s and draft length k that minimise expected
milliseconds per committed token (docs/adaptive.md):

    C(s, k) = (D(s) + V(1+k) + [follows rows] M_catchup(s)) / E[keep],   E[keep] = sum_{i=0..k} prod_{j<=i} a_j

blended with the strategy's decayed empirical ms per emitted token when that is worse than the model.

Plain classes, no clock and no I/O: the session measures every time and passes it in (`observe`), so the
scheduler runs on synthetic traces in tests. Acceptance comes from Beta-Binomial posteriors per strategy,
signal bucket and draft position. They learn from every proposal, executed or not: decoding is exact, so a
draft token is accepted iff it equals the token later emitted at its position ("shadow" verification, free).
A strategy's priors, buckets and traits (lazy, follows rows, uses the MTP head) are its drafter class's
(guild.speculative.registry); a strategy no drafter declares is an UnknownStrategyError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..window import MAX_WINDOW as MAX_T
from .costs import DraftCosts
from .registry import drafter


def bucket(strategy: str, signals: dict) -> str:
    """The acceptance bucket of a proposal from its drafter's signals (match length, frequency, confidence)."""
    return drafter(strategy).bucket(signals)


def keys(strategy: str, signals: dict, refine: Sequence[str]) -> tuple[str, ...]:
    """The proposal's acceptance keys, coarse to fine: its bucket, then the bucket split by each refining
    signal in turn (REFINE: how each is banded)."""
    out = [bucket(strategy, signals)]
    for r in refine:
        band = REFINE[r](signals)
        if band is None:
            break
        out.append(f"{out[-1]}|{r}={band}")
    return tuple(out)


def _band(edges: Sequence[float], name: str):
    def f(signals: dict):
        v = signals.get(name)
        return None if v is None else sum(v >= e for e in edges)
    return f


# signals the scheduler refines buckets by, banded: the target's top-1 probability at the root, whether this
# drafter's previous proposal had its first draft accepted, how far back lookup's match is
REFINE = {"root": _band((0.5, 0.9), "root"), "prev": lambda s: s.get("prev"), "dist": _band((64, 512), "dist")}


@dataclass(frozen=True)
class SchedulerConfig:
    max_draft: int = 4  # k at most of the drafters that do not use the MTP head
    mtp_cap_k: int = 3  # k at most of those that do
    hysteresis: float = 0.05  # switch only for >= 5% expected improvement
    min_dwell: int = 3  # windows in a mode before switching away (backing off to normal is always allowed)
    backoff_after: int = 2  # consecutive zero-acceptance windows that send the mode back to normal
    prior_strength: float = 2.0  # pseudo-trials behind each prior
    refine_strength: float = 4.0  # pseudo-trials of its coarser key behind each refined key
    refine: tuple[str, ...] = ("prev", "root")  # signals that split the buckets (REFINE), coarse to fine
    depth_penalty: float = 0.55  # pseudo-failures 0.55 i(i-1), fading with trials (docs/adaptive.md "Acceptance")
    decay: float = 0.98  # per-update decay of acceptance counts: tracks a changing text
    cost_decay: float = 0.9  # decay of the empirical cost sums and window-time averages
    default_slope: float = 0.25  # V(T)/V(1) = 1 + slope (T-1) until measured (without a plan; int8 kernels: 0.15-0.23)
    probe_every: int = 16  # a lazy drafter (MTP) not asked for this many windows is asked anyway; a probe that
    probe_max: int = 64  # finds nothing worth drafting doubles that gap, up to probe_max windows

    def __post_init__(self):
        if not 0 <= self.max_draft <= MAX_T - 1 or not 0 <= self.mtp_cap_k <= MAX_T - 1:
            raise ValueError(f"draft lengths must be in 0..{MAX_T - 1}")
        if not 0 <= self.hysteresis < 1 or self.min_dwell < 0 or self.backoff_after < 1:
            raise ValueError("hysteresis in [0, 1), min_dwell >= 0, backoff_after >= 1")
        if not (0 < self.decay <= 1 and 0 < self.cost_decay <= 1 and self.prior_strength > 0):
            raise ValueError("decays in (0, 1], prior_strength > 0")
        if not 1 <= self.probe_every <= self.probe_max:
            raise ValueError("1 <= probe_every <= probe_max")


class Acceptance:
    """Beta-Binomial posteriors of the conditional acceptance a_i (draft i accepted given 1..i-1 were), per
    strategy and a chain of keys from coarse to fine: the drafter's bucket, then that bucket split by the
    signals `refine` names. Each level's estimate is the prior of the next (hierarchical shrinkage), so a fine
    key speaks only once it has trials of its own. Counts decay so that the estimate follows the text."""

    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.succ: dict[tuple[str, str], list[float]] = {}
        self.trials: dict[tuple[str, str], list[float]] = {}

    def _counts(self, strategy: str, key: str) -> tuple[list[float], list[float]]:
        z = [0.0] * (MAX_T - 1)
        return self.succ.get((strategy, key), z), self.trials.get((strategy, key), z)

    def probs(self, strategy: str, keys: Sequence[str], k: int) -> list[float]:
        c = self.cfg
        q = drafter(strategy).priors[keys[0]]
        s, n = self._counts(strategy, keys[0])
        # the first draft has its own rate; deeper ones (accepted given the previous were, typically higher)
        # share a pooled rate that each shrinks toward, so their few trials do not make k jump around
        out = [(s[0] + c.prior_strength * q) / (n[0] + c.prior_strength)]
        pooled = (sum(s[1:]) + c.prior_strength * q) / (sum(n[1:]) + c.prior_strength)
        m = 2 * c.prior_strength
        for i in range(2, k + 1):
            ni = n[i - 1]
            pen = c.depth_penalty * i * (i - 1) / (1.0 + ni)  # deep positions: few trials, stay cautious
            out.append((s[i - 1] + m * pooled) / (ni + m + pen))
        for key in keys[1:]:
            s, n = self._counts(strategy, key)
            out = [(s[i] + c.refine_strength * out[i]) / (n[i] + c.refine_strength) for i in range(len(out))]
        return out[:k]

    def update(self, strategy: str, keys: Sequence[str], drafted: int, accepted: int) -> None:
        """A proposal of `drafted` tokens whose first `accepted` matched (positions 1..accepted succeeded,
        position accepted+1 failed if it exists)."""
        g = self.cfg.decay
        for key in keys:
            s = self.succ.setdefault((strategy, key), [0.0] * (MAX_T - 1))
            n = self.trials.setdefault((strategy, key), [0.0] * (MAX_T - 1))
            for i in range(min(drafted, MAX_T - 1)):
                s[i] *= g
                n[i] *= g
            for i in range(min(accepted + 1, drafted, MAX_T - 1)):
                n[i] += 1.0
                if i < accepted:
                    s[i] += 1.0

    def forget(self, strategy: str, keep: float = 0.1) -> None:
        """A back-off says the text changed: shrink the strategy's evidence so new outcomes dominate."""
        for key in self.trials:
            if key[0] == strategy:
                self.succ[key] = [x * keep for x in self.succ[key]]
                self.trials[key] = [x * keep for x in self.trials[key]]


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
        else:
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
        if not self.v1_n:
            if t == 1:  # the first plain step seeds V(1) directly
                self.v1, self.v1_n = ms, 1
            return
        pred = self.warm(t)
        ms = min(max(ms, pred / 3), pred * 3)  # a one-off stall (JIT, page faults) moves the estimate little
        if t == 1:
            self.v1 = g * self.v1 + (1 - g) * ms if self.v1_n >= 3 else (self.v1 * self.v1_n + ms) / (self.v1_n + 1)
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


@dataclass(frozen=True)
class Decision:
    strategy: str  # "normal" or the drafting strategy whose tokens feed this window
    k: int
    mode: str  # the scheduler's mode after this decision
    predicted: float  # ms per committed token of the choice
    costs: dict  # {"normal": ms/token, strategy: [ms/token for k = 1..], ...}
    reason: str  # why: "best", "hysteresis", "dwell", "backoff", "empty", "unseeded", ...

    def as_dict(self) -> dict:
        cands = {s: round(v, 4) if isinstance(v, float) else [round(x, 4) for x in v] for s, v in self.costs.items()}
        return {"choice": self.strategy, "k": self.k, "mode": self.mode, "predicted_ms_per_token":
                round(self.predicted, 4), "candidates": cands, "reason": self.reason}


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
        self.unasked: dict[str, int] = {}  # windows since each lazy drafter was last asked
        self.probe_gap: dict[str, int] = {}  # windows between probes of each lazy drafter

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

    def _curve(self, strategy: str, ks: Sequence[str], kmax: int) -> list[tuple[float, float]]:
        """(V(1+k), E[keep]) for k = 1..kmax drafts of `strategy` with acceptance keys ks."""
        a = self.acc.probs(strategy, ks, kmax)
        out, q, e = [], 1.0, 1.0
        for k in range(1, kmax + 1):
            q *= a[k - 1]
            e += q
            out.append((self.costs.verify(k + 1), e))
        return out

    def _kmax(self, strategy: str, n_tokens: int, room: int) -> int:
        cap = self.cfg.mtp_cap_k if drafter(strategy).uses_head else self.cfg.max_draft
        return min(n_tokens, cap, room, MAX_T - 1)

    def acceptance(self, p: Proposal, k: int) -> list[float]:
        """The predicted a_1..a_k of a proposal's drafts (each given its predecessors were accepted)."""
        return self.acc.probs(p.strategy, keys(p.strategy, p.signals, self.cfg.refine), min(k, MAX_T - 1))

    def candidate_costs(self, p: Proposal, room: int) -> list[float]:
        """C(s, k) for k = 1..min(len(tokens), cap, room), in ms per committed token."""
        kmax = self._kmax(p.strategy, len(p.tokens), room)
        if kmax <= 0:
            return []
        extra = self.costs.draft(p.strategy) + self.costs.catchup(p.strategy)
        curve = self._curve(p.strategy, keys(p.strategy, p.signals, self.cfg.refine), kmax)
        return [self._blend(p.strategy, (extra + v) / e) for v, e in curve]

    # ---------------------------------------------------------------- decisions
    def ask_value(self, strategy: str, best: float, room: int) -> float:
        """Expected ms saved by running the lazy drafter this window, against `best` ms per token without it: its
        forward is paid whatever it says; then it drafts only in the confidence buckets where that pays
        (docs/adaptive.md "MTP confidence"). Buckets are weighted by their recent shares of its proposals."""
        kmax = self._kmax(strategy, MAX_T, room)
        shares = self._shares(strategy)
        total = sum(shares.values())
        gain = 0.0
        for b, w in shares.items():
            gain += w / total * max([0.0] + [best * e - v for v, e in self._curve(strategy, (b,), kmax)])
        return gain - self.costs.draft(strategy) - self.costs.catchup(strategy)

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

    def decide(self, proposals: Sequence[Proposal], room: int) -> Decision:
        """The window to run: (strategy, k) from this window's proposals (empty ones mean Normal)."""
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
                if p.strategy not in self.muted:
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
        self.last = Decision(s, k, self.mode, cost, table, reason)
        return self.last

    # ---------------------------------------------------------------- feedback (times measured by the caller)
    def observe_window(self, strategy: str, k: int, draft_ms: float, verify_ms: float, emitted: int) -> None:
        """A window ran: `k` drafts of `strategy` ("normal" when k == 0), emitting `emitted` tokens."""
        g = self.cfg.cost_decay
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
            self.acc.update(p.strategy, keys(p.strategy, p.signals, self.cfg.refine), len(p.tokens), accepted)

    def observe_draft_ms(self, strategy: str, ms: float) -> None:
        self.costs.observe_draft(strategy, ms)

    def observe_residency(self, cold_ms: Sequence[float] | None) -> None:
        """The next window's expected cold-expert ms per T (Costs.observe_residency): a draft whose rows would
        fault experts in costs that much more, so k shrinks when the cache is cold."""
        self.costs.observe_residency(cold_ms)

    def observe_lazy(self, strategy: str, signals: dict) -> None:
        """The signals of the draft a lazy drafter just proposed (MTP: the head's top-1 probability,
        docs/adaptive.md "MTP confidence"): the bucket shares `ask_value` weighs."""
        shares = self._shares(strategy)
        for b in shares:
            shares[b] *= self.cfg.decay
        shares[bucket(strategy, signals)] += 1.0
