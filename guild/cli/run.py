"""`guild run`: decode one prompt or a whole conversation on a loaded model (guild.load), stream text, return
stats; `--sessions N` runs N copies concurrently. `--json` objects follow the schema in README ("--json")."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import __version__
from ..engine.options import DecodeOptions
from ..errors import BadFlagError
from ..load import LoadedModel, load_for, slots
from ..text.chat import Turn, drop_note, run_turn, use_chat_template
from ..text.options import TextOptions
from ..warmup import COMPILE_ESTIMATE_S, kernels_cold

__all__ = ["RunResult", "Runner", "run", "run_sessions", "write_trace"]

JSON_SCHEMA = "guild.run/1"  # the --json objects' layout (README, "--json"); bumped on any incompatible change


def sampling_dict(sp) -> dict:
    """The sampling settings as --json reports them (llama.cpp's names)."""
    return {"temperature": sp.temperature, "top_k": sp.top_k, "top_p": sp.top_p, "min_p": sp.min_p,
            "repeat_penalty": sp.repeat_penalty, "repeat_last_n": sp.penalty_last_n,
            "frequency_penalty": sp.frequency_penalty, "presence_penalty": sp.presence_penalty, "seed": sp.seed,
            "greedy": sp.greedy}


@dataclass
class RunResult:
    turns: list[Turn]
    model: str
    threads: int
    load_s: float
    options: DecodeOptions = field(default_factory=DecodeOptions)
    device: str = "cpu"
    mtp_head: str | None = None  # the MTP head file drafting used (mtp, adaptive)
    device_reason: str = ""  # why the CPU runs it when --device auto did not take the GPU
    text_options: TextOptions = field(default_factory=TextOptions)
    rope: dict = field(default_factory=dict)  # ModelArgs.rope_settings: base and scaling the run used

    @property
    def text(self) -> str:
        return self.turns[-1].text

    @property
    def tokens(self) -> list[int]:
        return self.turns[-1].tokens

    @property
    def stats(self):
        return self.turns[-1].stats

    def head(self) -> dict:
        """What every --json object of this run starts with (README, "--json")."""
        t = self.text_options
        return {"schema": JSON_SCHEMA, "guild": __version__, "model": self.model, "threads": self.threads,
                "device": "cpu" if self.device == "cpu" else "cuda", "device_detail": self.device,
                "device_reason": self.device_reason, "strategy": self.options.strategy,
                "mtp_head": self.mtp_head, "max_tokens": self.options.max_tokens, "context": self.options.context,
                "rope": self.rope,
                "cache_type_k": self.options.kv.k, "cache_type_v": self.options.kv.v,
                "sampling": sampling_dict(self.options.sampling), "seed": self.options.sampling.seed,
                "stop": list(t.stop), "ignore_eos": t.ignore_eos,
                "load_ms": round(self.load_s * 1e3, 1)}

    def turn_dict(self, i: int) -> dict:
        t = self.turns[i]
        st = t.stats
        return {**self.head(), "turn": i + 1, "system": t.system, "prompt_ids": t.prompt_ids, "text": t.text,
                "tokens": t.tokens,
                **st.as_dict(), "ttft_ms": round(t.ttft_s * 1e3, 1), "prefill_ms": round(st.prefill_s * 1e3, 1),
                "decode_ms": round(st.decode_s * 1e3, 1), "dropped_turns": t.dropped}

    def as_dict(self) -> dict:
        """The last turn's object (one prompt: the whole run)."""
        return self.turn_dict(len(self.turns) - 1)

    def json_lines(self) -> list[str]:
        """One JSON object per turn (a conversation prints one line per turn)."""
        return [json.dumps(self.turn_dict(i), ensure_ascii=False) for i in range(len(self.turns))]


def _say(notify: Callable[[str], None] | None, msg: str) -> None:
    if notify is not None:
        notify(msg)


def load_with_notes(model: str | None, opts: DecodeOptions, threads: int | None = None,
                    text: TextOptions = TextOptions(), notify: Callable[[str], None] | None = None) -> LoadedModel:
    """load_for, saying on `notify` what happens before the first token: loading, then compiling the kernels when
    Numba's cache is cold (with an estimate); a --chat-template file replaces the model's."""
    text.compile(None)  # a bad --json-schema / --grammar file fails now, not after the load and warm-up
    _say(notify, f"loading {model or 'smollm2-135m-moe'} …")
    if notify is not None and kernels_cold():
        _say(notify, f"compiling kernels for this CPU (first run: about {COMPILE_ESTIMATE_S:.0f} s more, cached "
                     "afterwards) …")
    lm = load_for(model, opts, threads)
    if text.chat_template is not None:
        lm.tokenizer = copy.copy(lm.tokenizer)  # this run's own renderer; the loaded tokenizer stays as it was
        use_chat_template(lm.tokenizer, text.chat_template)
    lm.warm_up(opts.strategy, opts.mtp)  # the first prompt's time to first token is then its own
    where = lm.device if lm.device == "cpu" else lm.device.split(" · ")[0]
    _say(notify, f"loaded {Path(lm.path).name} in {lm.load_s:.1f} s · {lm.threads} threads · {where}")
    return lm


class Runner:
    """A loaded model with one session and its drafter: one-shot prompts or a multi-turn conversation."""

    def __init__(self, model: str | None, opts: DecodeOptions, threads: int | None = None,
                 text: TextOptions = TextOptions(), notify: Callable[[str], None] | None = None):
        self.opts, self.text = opts, text
        self.lm = load_with_notes(model, opts, threads, text, notify)
        self.plan, self.threads = self.lm.plan, self.lm.threads
        self.slot = slots(self.lm, opts, text=text)[0]
        self.conversation, self.drafter, self.session = self.slot.conversation, self.slot.drafter, \
            self.slot.conversation.session
        if notify is not None:
            self.conversation.on_drop = lambda n, kept, n_ctx: notify(drop_note(n, kept, n_ctx))

    def turn(self, text: str, chat: bool, on_text: Callable[[str], None] | None = None,
             cancel: Callable[[], bool] | None = None) -> Turn:
        """One turn: a chat turn (the chat template, history kept) or a raw completion of `text`."""
        o = self.opts
        return run_turn([self.slot], text, chat=chat, max_tokens=o.max_tokens, max_draft=o.max_draft,
                        on_text=on_text, stop=self.text.stop, cancel=cancel)[0][0]

    def say(self, text: str, on_text: Callable[[str], None] | None = None,
            cancel: Callable[[], bool] | None = None) -> Turn:
        return self.turn(text, True, on_text, cancel)

    def complete(self, text: str, on_text: Callable[[str], None] | None = None) -> Turn:
        return self.turn(text, False, on_text)

    def result(self, turns: list[Turn]) -> RunResult:
        head = self.lm.mtp_head(self.opts.strategy)
        return RunResult(turns, self.lm.path, self.threads, self.lm.load_s, self.opts, self.lm.device,
                         head.info.source if head is not None else None, self.lm.device_reason, self.text,
                         self.lm.model.args.rope_settings())


def run(model: str | None, prompts: Sequence[str], *, chat: bool = False, opts: DecodeOptions = DecodeOptions(),
        threads: int | None = None, on_text: Callable[[str], None] | None = None,
        on_turn: Callable[[int, str], None] | None = None, text: TextOptions = TextOptions(),
        notify: Callable[[str], None] | None = None) -> RunResult:
    """Decode each prompt in turn on one session (several prompts = a conversation when chat is set)."""
    if not prompts:
        raise BadFlagError("no prompt: give -p/--prompt, -f/--file or --conversation")
    if text.system is not None and not chat:
        raise BadFlagError("--system needs --chat (a raw completion has no system prompt)")
    r = Runner(model, opts, threads, text, notify)
    turns = []
    for i, p in enumerate(prompts):
        if on_turn is not None:
            on_turn(i, p)
        turns.append(r.turn(p, chat, on_text))
    return r.result(turns)


def run_sessions(model: str | None, prompts: Sequence[str], *, chat: bool = False,
                 opts: DecodeOptions = DecodeOptions(), threads: int | None = None, text: TextOptions = TextOptions(),
                 notify: Callable[[str], None] | None = None) -> dict:
    """`--sessions N`: N sessions run the same turns concurrently, each with its own cache, drafter and
    sampling seed (seed + i), batched into one forward per round. Returns texts per session and the rounds."""
    if not prompts:
        raise BadFlagError("no prompt: give -p/--prompt, -f/--file or --conversation")
    lm = load_with_notes(model, opts, threads, text, notify)
    ss = slots(lm, opts, opts.sessions, text=text)
    texts: list[list[str]] = [[] for _ in ss]
    turns = []
    for p in prompts:
        res, cs = run_turn(ss, p, chat=chat, max_tokens=opts.max_tokens, max_draft=opts.max_draft, stop=text.stop)
        for i, t in enumerate(res):
            texts[i].append(t.text)
        turns.append({"sessions": [{"prompt_ids": t.prompt_ids, "tokens": t.tokens, **t.stats.as_dict(),
                                    "ttft_ms": round(t.ttft_s * 1e3, 1)} for t in res], **cs.as_dict()})
    return {"schema": JSON_SCHEMA, "guild": __version__, "model": lm.path, "threads": lm.threads,
            "strategy": opts.strategy, "sessions": len(ss), "device": "cpu" if lm.device == "cpu" else "cuda",
            "device_detail": lm.device, "device_reason": lm.device_reason,
            "sampling": sampling_dict(opts.sampling), "load_ms": round(lm.load_s * 1e3, 1), "texts": texts,
            "turns": turns}


def write_trace(path: str | Path, turns: Sequence[Turn], session: int | None = None) -> None:
    """`--trace FILE`: one JSON line per window (strategy, k, measured ms, kept, emitted, distinct experts, and
    the adaptive scheduler's candidates with predicted ms/token and its choice)."""
    with open(path, "a") as f:
        for i, t in enumerate(turns):
            for j, w in enumerate(t.stats.windows):
                rec = {"turn": i + 1, "window": j, **({"session": session} if session is not None else {}),
                       **asdict(w), "decision": w.decision.as_dict() if w.decision else None}
                rec["draft_ms"], rec["verify_ms"] = round(w.draft_ms, 4), round(w.verify_ms, 4)
                rec["measured_ms_per_token"] = round((w.draft_ms + w.verify_ms) / max(w.emitted, 1), 4)
                if w.propose_ms is not None:
                    rec["propose_ms"] = {k: round(v, 4) for k, v in w.propose_ms.items()}
                f.write(json.dumps(rec) + "\n")
