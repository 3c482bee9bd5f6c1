"""`guild run`: flags → DecodeOptions and TextOptions, then one prompt, a conversation, N sessions
(guild.cli.run) or the interactive chat (guild.cli.repl); text on stdout, stats on stderr or --json."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import typer
from rich.markup import escape

from ...engine.options import DecodeOptions, RopeOptions
from ...engine.sampling import SamplingParams
from ...errors import BadFlagError, GuildError
from ...kvtypes import KVTypes
from ...speculative.options import MtpOptions
from ...text.inputs import conversation_turns, prompt_source
from ...text.options import TextOptions
from ..options import MODEL, ROPE, RUN_SAMPLING, SESSIONS_RANGE, SPEC, TEXT, flag, model_arg, set_process_flags, takes
from ..output import err, fail, note, notes, writable


def _trace(write_trace, path: Path, turns) -> None:
    try:
        write_trace(path, turns)
    except OSError as e:  # checked writable before the run; the disk may still fill up
        raise GuildError(f"--trace {path}: cannot write ({e.strerror or e})") from None


def _print_stats(res, sampling, first: int = 0, footer: bool = True) -> None:
    """Each turn's stats on stderr, then (footer) the model, threads, load time, strategy and device."""
    for i, turn in enumerate(res.turns):
        s = turn.stats
        summ = s.summary()
        spec = ""
        if summ["drafted"]:
            per = " · ".join(f"{k} {v['windows']} windows/{v['tokens']} tok"
                             for k, v in sorted(summ["strategies"].items()))
            spec = (f"\nwindows {summ['windows']} · drafted {summ['drafted']} · accepted {summ['accepted']} "
                    f"({summ['acceptance'] * 100:.0f}%) · {summ['tokens_per_window']:.2f} tokens/window · "
                    f"T histogram {summ['t_histogram']}\nper strategy: {per}")
        turn_label = f"turn {first + i + 1}: " if len(res.turns) > 1 or first else ""
        err.print(
            f"[dim]{turn_label}prompt {s.prompt_tokens} tok · prefill {s.prefill_tok_s:.1f} tok/s "
            f"({s.prefill_s * 1e3:.0f} ms) · first token {turn.ttft_s * 1e3:.0f} ms · "
            f"generated {s.generated_tokens} tok · decode {s.decode_tok_s:.1f} tok/s · "
            f"{s.ms_per_token:.2f} ms/token · stop: {s.stop_reason}{escape(spec)}[/]", soft_wrap=True
        )
    if not footer:
        return
    err.print(
        f"[dim]{escape(Path(res.model).name)} · {res.threads} threads · load {res.load_s * 1e3:.0f} ms · "
        f"strategy {res.options.strategy}" + ("" if sampling.greedy else f" · seed {sampling.seed}")
        + (f" · MTP head {escape(Path(res.mtp_head).name)}" if res.mtp_head else "")
        + f" · device {escape(res.device)}" + (f" ({escape(res.device_reason)})" if res.device_reason else "")
        + ("" if res.options.kv.is_f32 else f" · KV cache {res.options.kv.describe()}")
        + "[/]", soft_wrap=True
    )


@takes(sampling=RUN_SAMPLING, rope=ROPE)
def command(
    model: str | None = MODEL,
    model_opt: str | None = flag("model_opt"),
    prompt: str | None = typer.Option(None, "-p", "--prompt", help="Prompt text (UTF-8; invalid bytes are an error; "
                                      "-i lines take U+FFFD for them instead); - reads standard input.",
                                      rich_help_panel=TEXT),
    file: Path | None = typer.Option(None, "-f", "--file", help="Read the prompt from this UTF-8 file.",
                                     rich_help_panel=TEXT),
    chat: bool = typer.Option(False, "--chat", help="Wrap prompts in the model's chat template.",
                              rich_help_panel=TEXT),
    system: str | None = typer.Option(None, "-sys", "--system", "--system-prompt", help="System prompt of the chat "
                                      "(with --chat, -i or --conversation).", rich_help_panel=TEXT),
    stop: list[str] | None = typer.Option(None, "--stop", "-r", "--reverse-prompt", metavar="<str>",
                                          help="End the text just before this string (repeatable; never shown).",
                                          rich_help_panel=TEXT),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Go on past end-of-generation tokens (not shown) "
                                    "until -n tokens.", rich_help_panel=TEXT),
    chat_template: Path | None = flag("chat_template", help="Jinja chat template file replacing the model's "
                                      "(checked and sandboxed alike).", panel=TEXT),
    json_schema: Path | None = typer.Option(None, "--json-schema", "--json-schema-file", help="JSON schema file the "
                                            "reply must follow (constrained decoding, exact under every strategy).",
                                            rich_help_panel=TEXT),
    grammar: Path | None = typer.Option(None, "--grammar", "--grammar-file", help="Grammar file the reply must "
                                        "follow: llguidance's Lark (regexes, %json{...} schemas inline).",
                                        rich_help_panel=TEXT),
    conversation: Path | None = typer.Option(
        None, "--conversation", help="JSON/YAML list of messages (strings = user turns; role/content with a system "
        "message first if any), run as one chat (implies --chat); UTF-8, at most 16 MiB, no YAML aliases.",
        rich_help_panel=TEXT),
    interactive: bool = typer.Option(False, "-i", "--interactive", help="Chat in the terminal (implies --chat): "
                                     "line editing, history, /help; Ctrl-C stops a reply.", rich_help_panel=TEXT),
    sessions: int = flag("sessions", help=f"Run N sessions ({SESSIONS_RANGE}) concurrently (seeds seed+i), batched."),
    max_tokens: int = flag("max_tokens", 128, "Tokens to generate at most (per turn)."),
    threads: int | None = flag("threads"),
    numerics: str = flag("numerics"),
    expert_cache: str = flag("expert_cache"),
    cache_max: str | None = flag("cache_max"),
    mmap: bool = flag("mmap"),
    context: int = flag("context", help="Context length in tokens (KV cache size); a full chat drops its oldest "
                        "turns."),
    cache_type_k: str = flag("cache_type_k"),
    cache_type_v: str = flag("cache_type_v"),
    prefill_batch: int = flag("prefill_batch", help="Prompt rows per prefill forward."),
    as_json: bool = flag("as_json", help="Print JSON instead of text and stats: one object per run, one line per "
                         "turn with --conversation or -i (schema: README, \"--json\")."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Start-up notes on stderr even when it is not a "
                                 "terminal."),
    device: str = flag("device"),
    strategy: str = flag("strategy", help="adaptive (picks normal, lookup, retrieval or mtp per window by expected "
                         "ms/token), normal, lookup, retrieval or mtp (needs an MTP head: the model's own, a sidecar, "
                         "or --mtp-head).", panel=SPEC),
    mtp_head: Path | None = flag("mtp_head", help="MTP head GGUF from `guild train-mtp` (default: the model's nextn "
                                 "block, MODEL.mtp.gguf beside it, or the shipped head).", panel=SPEC),
    mtp_k: int = flag("mtp_k", panel=SPEC),
    mtp_min_p: float = typer.Option(0.0, "--spec-min-p", help="mtp: plain step when the head's top-1 "
                                    "probability is below this (0 = always draft).", rich_help_panel=SPEC),
    mtp_vocab: int = flag("mtp_vocab", help="Draft LM head over the head's N most frequent tokens (0 = whole "
                          "vocabulary).", panel=SPEC),
    max_draft: int = flag("max_draft", help="Draft tokens per window at most (0..7).", panel=SPEC),
    trace: Path | None = typer.Option(None, "--trace", help="Append one JSON line per window (candidates, "
                                      "predicted and measured ms, choice, kept) to this file.", rich_help_panel=SPEC),
    min_match: int = typer.Option(3, "--spec-min-match", help="Lookup anchor length (2 or 3).", rich_help_panel=SPEC),
    lookup_window: int = typer.Option(65536, "--spec-lookup-window", help="Tokens of history lookup indexes.",
                                      rich_help_panel=SPEC),
    corpus: list[Path] | None = typer.Option(None, "--retrieval-corpus", help="Text file the retrieval drafter "
                                             "ingests (repeatable).", rich_help_panel=SPEC),
    gexec: Path | None = flag("gexec", panel=SPEC),
    strict_plan: bool = flag("strict_plan", panel=SPEC),
    *,
    sampling: dict,
    rope: tuple,
):
    """Generate text, streaming it, then print decode statistics (greedy unless --temperature)."""
    from ..run import Runner, write_trace  # deferred: the loader pulls in numba
    from ..run import run as run_prompts

    def stream(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    def turn_header(i: int, text: str) -> None:
        if len(prompts) > 1 and not as_json:
            sys.stdout.write(("\n" if i else "") + f">>> {text}\n")

    try:
        writable(trace, "--trace")
        set_process_flags(numerics, expert_cache, cache_max, mmap)
        model = model_arg(model, model_opt)
        if interactive and prompt == "-":
            raise BadFlagError("-p - reads the prompt from standard input, which -i reads the chat from")
        prompt = prompt_source(prompt, file)
        sampling = SamplingParams(**{"seed": secrets.randbits(63), **sampling})
        prompts = [prompt] if prompt is not None else []
        if conversation is not None:
            conv_system, turns = conversation_turns(conversation)
            prompts += turns
            system = system if system is not None else conv_system
            chat = True
        chat = chat or interactive
        text = TextOptions(system=system, stop=tuple(stop or ()), ignore_eos=ignore_eos,
                           chat_template=None if chat_template is None else str(chat_template),
                           json_schema=None if json_schema is None else str(json_schema),
                           grammar=None if grammar is None else str(grammar))
        opts = DecodeOptions(strategy=strategy, max_draft=max_draft, min_match=min_match,
                             lookup_window=lookup_window, corpus=tuple(str(c) for c in corpus or ()),
                             sampling=sampling, max_tokens=max_tokens, context=context, prefill_batch=prefill_batch,
                             gexec=None if gexec is None else str(gexec), strict_plan=strict_plan, device=device,
                             mtp=MtpOptions(None if mtp_head is None else str(mtp_head), mtp_k, mtp_min_p, mtp_vocab),
                             sessions=sessions, kv=KVTypes(cache_type_k, cache_type_v), rope=RopeOptions(*rope))
        notify = notes(verbose)
        if interactive:
            if sessions != 1:
                raise BadFlagError("-i chats with one session; drop --sessions")
            from ..repl import ChatRepl

            runner = Runner(model, opts, threads, text, notify)
            done = []

            def after_turn(turn) -> None:
                done.append(turn)
                if trace is not None:
                    _trace(write_trace, trace, [turn])
                if as_json:
                    print(json.dumps(runner.result(done).turn_dict(len(done) - 1), ensure_ascii=False), flush=True)
                else:
                    _print_stats(runner.result([turn]), sampling, len(done) - 1, footer=False)

            repl = ChatRepl(runner, note=note, after_turn=after_turn,
                            error=lambda m: err.print(f"[bold red]error:[/] {escape(m)}"), stream=not as_json)
            for p in prompts:
                if not as_json:
                    sys.stdout.write(f">>> {p}\n")
                repl.turn(p)
            raise typer.Exit(repl.loop())
        if sessions != 1:
            from ..run import run_sessions

            if trace is not None:
                raise BadFlagError("--trace records one session's windows; drop --sessions or --trace")
            rep = run_sessions(model, prompts, chat=chat, opts=opts, threads=threads, text=text, notify=notify)
            if as_json:
                print(json.dumps(rep, ensure_ascii=False))
                return
            for i, texts in enumerate(rep["texts"]):
                sys.stdout.write(f"--- session {i + 1}\n" + "\n".join(texts) + "\n")
            for j, t in enumerate(rep["turns"]):
                err.print(f"[dim]turn {j + 1}: {t['rounds']} rounds · median round {t['round_ms_median']:.1f} ms · "
                          f"aggregate decode {t['aggregate_tok_s']:.1f} tok/s over {sessions} sessions[/]")
            return
        res = run_prompts(model, prompts, chat=chat, opts=opts, threads=threads,
                          on_text=None if as_json else stream, on_turn=turn_header, text=text, notify=notify)
        if trace is not None:
            _trace(write_trace, trace, res.turns)
    except GuildError as e:
        fail(e)
    if as_json:
        print("\n".join(res.json_lines()) if len(res.turns) > 1 else json.dumps(res.as_dict(), ensure_ascii=False))
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    _print_stats(res, sampling)
