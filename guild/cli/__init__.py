"""guild command line: thin Typer commands, each calling one library function.

Each command imports what it runs inside its body: the engine pulls in Numba and compiles kernels, and
`guild --help` (or a typo) should answer at once."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from .. import __version__
from ..errors import BadFlagError, ContextOverflowError, DeviceUnavailableError, GpuPathError, GuildError, PlanError
from ..formats.files import check_writable
from ..kvtypes import KVTypes
from ..speculative.options import MTP_K, MTP_VOCAB, MtpOptions
from ..text.inputs import conversation_turns, prompt_source
from .last_resort import run_cli
from .options import (
    BENCH_SAMPLING,
    CACHE_TYPE_K,
    CACHE_TYPE_V,
    DEVICE_HELP,
    EXPERT_CACHE_HELP,
    GEXEC_HELP,
    MODEL_HELP,
    NUMERICS_HELP,
    PARALLEL_HELP,
    ROPE_FLAGS,
    RUN_SAMPLING,
    SESSIONS_RANGE,
    SPEC,
    STRICT_HELP,
    TEXT,
    rope_options,
    sampling_kw,
)


def _plain_flag_metavar() -> None:
    """Help shows no `<bool>` for flags (they take no value); other options keep their `<int>`, `<path>`..."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self, ctx):
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_plain_flag_metavar()


class GuildApp(typer.Typer):
    """The CLI; calling it (the `guild` script) turns whatever escapes a command into one line (last_resort)."""

    def __call__(self, *args, **kwargs):
        return run_cli(super().__call__, *args, **kwargs)


app = GuildApp(
    help="guild: run Mixture-of-Experts GGUF models on the CPU (and GPU), with exact speculative decoding. "
         "Errors print one line; --debug (anywhere) or GUILD_DEBUG=1 adds the traceback.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False)


def _version(value: bool) -> None:
    if value:
        print(f"guild {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print guild's version and exit.")):
    pass

def _set_numerics(mode: str) -> None:
    """--numerics: the mode every matrix of this process is packed under (kernels/cpu/quant.py NUMERICS)."""
    from ..kernels.cpu import quant  # deferred: see the module docstring

    if mode not in quant.NUMERICS:
        raise BadFlagError(f"--numerics must be {' or '.join(quant.NUMERICS)}, not {mode!r}")
    quant.set_default_numerics(mode)


def _set_expert_cache(text: str) -> None:
    """--expert-cache-mem: the setting every load of this process uses (guild.engine.experts)."""
    from ..engine import experts  # deferred: see the module docstring

    experts.set_default(experts.expert_cache_mem(text))


def _model_arg(model: str | None, model_opt: str | None) -> str | None:
    if model is not None and model_opt is not None and model != model_opt:
        raise BadFlagError(f"two models: {model} and -m/--model {model_opt}; give one")
    return model if model is not None else model_opt


def _notes(verbose: bool):
    """Start-up notes (loading, compiling kernels, a full context) on stderr when it is a terminal or --verbose."""
    if not (verbose or sys.stderr.isatty()):
        return None
    return lambda m: err.print(f"[dim]{escape(m)}[/]", soft_wrap=True)


# engine errors speak in engine terms; here they get the flag that changes the outcome
_HINTS = (
    (ContextOverflowError, lambda e: f"--context {e.n_ctx}; raise it" if e.n_ctx else "raise --context"),
    (DeviceUnavailableError, lambda e: "--device cpu runs without a GPU"),
    (GpuPathError, lambda e: "--device cpu runs everything on the CPU"),
)


def _fail(e: GuildError) -> None:
    hint = next((h(e) for cls, h in _HINTS if isinstance(e, cls)), None)
    msg = str(e) + (f" ({hint})" if hint else "")
    err.print(f"[bold red]error:[/] {escape(msg)}", markup=True, soft_wrap=True)
    raise typer.Exit(1)


def _writable(path: Path | None, what: str, error=GuildError) -> None:
    """An output path checked before the work that ends by writing it (guild.formats.files.check_writable)."""
    if path is not None:
        check_writable(path, what, error)


def _conversation(path: Path) -> list[str]:
    """User turns from a JSON or YAML file (size-capped, UTF-8, no YAML aliases): guild.text.inputs."""
    return conversation_turns(path)[1]


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


@app.command()
def run(
    model: str | None = typer.Argument(None, help=MODEL_HELP),
    model_opt: str | None = typer.Option(None, "-m", "--model", help="The model, as a flag (llama.cpp's -m)."),
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
    chat_template: Path | None = typer.Option(None, "--chat-template", "--chat-template-file", help="Jinja chat "
                                              "template file replacing the model's (checked and sandboxed alike).",
                                              rich_help_panel=TEXT),
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
    sessions: int = typer.Option(1, "--sessions", help=f"Run N sessions ({SESSIONS_RANGE}) concurrently (seeds "
                                 "seed+i), batched."),
    max_tokens: int = typer.Option(128, "-n", "--max-tokens", "--n-predict", help="Tokens to generate at most "
                                   "(per turn)."),
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads (default: all cores)."),
    numerics: str = typer.Option("i8", "--numerics", help=NUMERICS_HELP),
    expert_cache: str = typer.Option("auto", "--expert-cache-mem", help=EXPERT_CACHE_HELP),
    context: int = typer.Option(4096, "-c", "--context", "--ctx-size", help="Context length in tokens (KV cache "
                                "size); a full chat drops its oldest turns."),
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    prefill_batch: int = typer.Option(512, "-b", "--prefill-batch", "--batch-size",
                                      help="Prompt rows per prefill forward."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text and stats: one object per run, one "
                                 "line per turn with --conversation or -i (schema: README, \"--json\")."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Start-up notes on stderr even when it is not a "
                                 "terminal."),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    strategy: str = typer.Option("adaptive", "--decode-strategy", help="adaptive (picks normal, lookup, "
                                 "retrieval or mtp per window by expected ms/token), normal, lookup, retrieval or "
                                 "mtp (needs an MTP head: the model's own, a sidecar, or --mtp-head).",
                                 rich_help_panel=SPEC),
    mtp_head: Path | None = typer.Option(None, "--mtp-head", help="MTP head GGUF from `guild train-mtp` (default: "
                                         "the model's nextn block, MODEL.mtp.gguf beside it, or the shipped head).",
                                         rich_help_panel=SPEC),
    mtp_k: int = typer.Option(MTP_K, "--spec-mtp-k", help="MTP drafts per window at most (1..7).",
                              rich_help_panel=SPEC),
    mtp_min_p: float = typer.Option(0.0, "--spec-min-p", help="mtp: plain step when the head's top-1 "
                                    "probability is below this (0 = always draft).", rich_help_panel=SPEC),
    mtp_vocab: int = typer.Option(MTP_VOCAB, "--spec-mtp-vocab", help="Draft LM head over the head's N most "
                                  "frequent tokens (0 = whole vocabulary).", rich_help_panel=SPEC),
    max_draft: int = typer.Option(4, "--spec-max-draft", "--draft-max", "--draft", help="Draft tokens per window at "
                                  "most (0..7).", rich_help_panel=SPEC),
    trace: Path | None = typer.Option(None, "--trace", help="Append one JSON line per window (candidates, "
                                      "predicted and measured ms, choice, kept) to this file.", rich_help_panel=SPEC),
    min_match: int = typer.Option(3, "--spec-min-match", help="Lookup anchor length (2 or 3).", rich_help_panel=SPEC),
    lookup_window: int = typer.Option(65536, "--spec-lookup-window", help="Tokens of history lookup indexes.",
                                      rich_help_panel=SPEC),
    corpus: list[Path] | None = typer.Option(None, "--retrieval-corpus", help="Text file the retrieval drafter "
                                             "ingests (repeatable).", rich_help_panel=SPEC),
    gexec: Path | None = typer.Option(None, "--gexec", help=GEXEC_HELP, rich_help_panel=SPEC),
    strict_plan: bool = typer.Option(False, "--strict-plan", help=STRICT_HELP, rich_help_panel=SPEC),
    temperature: float = RUN_SAMPLING["temperature"],
    top_k: int = RUN_SAMPLING["top_k"],
    top_p: float = RUN_SAMPLING["top_p"],
    min_p: float = RUN_SAMPLING["min_p"],
    repeat_penalty: float = RUN_SAMPLING["repeat_penalty"],
    repeat_last_n: int = RUN_SAMPLING["repeat_last_n"],
    frequency_penalty: float = RUN_SAMPLING["frequency_penalty"],
    presence_penalty: float = RUN_SAMPLING["presence_penalty"],
    seed: int | None = RUN_SAMPLING["seed"],
    rope_scaling: str | None = ROPE_FLAGS["rope_scaling"],
    rope_scale: float | None = ROPE_FLAGS["rope_scale"],
    rope_freq_base: float | None = ROPE_FLAGS["rope_freq_base"],
    rope_freq_scale: float | None = ROPE_FLAGS["rope_freq_scale"],
    yarn_orig_ctx: int | None = ROPE_FLAGS["yarn_orig_ctx"],
):
    """Generate text, streaming it, then print decode statistics (greedy unless --temperature)."""
    from ..engine.options import DecodeOptions
    from ..engine.sampling import SamplingParams  # deferred: see the module docstring
    from ..text.options import TextOptions
    from .run import Runner, write_trace
    from .run import run as run_prompts

    def stream(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    def turn_header(i: int, text: str) -> None:
        if len(prompts) > 1 and not as_json:
            sys.stdout.write(("\n" if i else "") + f">>> {text}\n")

    try:
        _writable(trace, "--trace")
        _set_numerics(numerics)
        _set_expert_cache(expert_cache)
        model = _model_arg(model, model_opt)
        if interactive and prompt == "-":
            raise BadFlagError("-p - reads the prompt from standard input, which -i reads the chat from")
        prompt = prompt_source(prompt, file)
        sampling = SamplingParams(**sampling_kw(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            seed=secrets.randbits(63) if seed is None else seed))
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
                             sessions=sessions, kv=KVTypes(cache_type_k, cache_type_v),
                             rope=rope_options(rope_scaling, rope_scale, rope_freq_base, rope_freq_scale,
                                               yarn_orig_ctx))
        notes = _notes(verbose)
        if interactive:
            if sessions != 1:
                raise BadFlagError("-i chats with one session; drop --sessions")
            from .repl import ChatRepl

            runner = Runner(model, opts, threads, text, notes)
            done = []

            def after_turn(turn) -> None:
                done.append(turn)
                if trace is not None:
                    _trace(write_trace, trace, [turn])
                if as_json:
                    print(json.dumps(runner.result(done).turn_dict(len(done) - 1), ensure_ascii=False), flush=True)
                else:
                    _print_stats(runner.result([turn]), sampling, len(done) - 1, footer=False)

            repl = ChatRepl(runner, note=lambda m: err.print(f"[dim]{escape(m)}[/]", soft_wrap=True),
                            after_turn=after_turn, error=lambda m: err.print(f"[bold red]error:[/] {escape(m)}"),
                            stream=not as_json)
            for p in prompts:
                if not as_json:
                    sys.stdout.write(f">>> {p}\n")
                repl.turn(p)
            raise typer.Exit(repl.loop())
        if sessions != 1:
            from .run import run_sessions

            if trace is not None:
                raise BadFlagError("--trace records one session's windows; drop --sessions or --trace")
            rep = run_sessions(model, prompts, chat=chat, opts=opts, threads=threads, text=text, notify=notes)
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
                          on_text=None if as_json else stream, on_turn=turn_header, text=text, notify=notes)
        if trace is not None:
            _trace(write_trace, trace, res.turns)
    except GuildError as e:
        _fail(e)
    if as_json:
        print("\n".join(res.json_lines()) if len(res.turns) > 1 else json.dumps(res.as_dict(), ensure_ascii=False))
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    _print_stats(res, sampling)


SERVE = "Serving"


@app.command()
def serve(
    model: str | None = typer.Argument(None, help=MODEL_HELP),
    model_opt: str | None = typer.Option(None, "-m", "--model", help="The model, as a flag (llama.cpp's -m)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (only this one).",
                             rich_help_panel=SERVE),
    port: int = typer.Option(8080, "--port", help="TCP port (0 = any free port).", rich_help_panel=SERVE),
    parallel: int = typer.Option(4, "--parallel", "-np", help=PARALLEL_HELP, rich_help_panel=SERVE),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests that may wait for a slot; more get HTTP 429 "
                                  "with Retry-After.", rich_help_panel=SERVE),
    cache_mem: int = typer.Option(4096, "--cache-mem", help="MiB of KV cache for active sessions and those kept "
                                  "for prefix reuse (least recently used evicted first).", rich_help_panel=SERVE),
    drain_timeout: float = typer.Option(300.0, "--drain-timeout", help="Seconds in-flight requests may take to "
                                        "finish after SIGTERM or Ctrl-C.", rich_help_panel=SERVE),
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads (default: all cores)."),
    numerics: str = typer.Option("i8", "--numerics", help=NUMERICS_HELP),
    expert_cache: str = typer.Option("auto", "--expert-cache-mem", help=EXPERT_CACHE_HELP),
    context: int = typer.Option(4096, "-c", "--context", "--ctx-size", help="Context of each session, in tokens."),
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    prefill_batch: int = typer.Option(512, "-b", "--prefill-batch", "--batch-size", help="Prompt rows per prefill "
                                      "forward (<= 64: every cached row is reusable by a later request)."),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    strategy: str = typer.Option("adaptive", "--decode-strategy", help="Default strategy (a request may name its "
                                 "own as \"decode_strategy\").", rich_help_panel=SPEC),
    max_draft: int = typer.Option(4, "--spec-max-draft", "--draft-max", "--draft",
                                  help="Default draft tokens per window (0..7).", rich_help_panel=SPEC),
    gexec: Path | None = typer.Option(None, "--gexec", help=GEXEC_HELP, rich_help_panel=SPEC),
    chat_template: Path | None = typer.Option(None, "--chat-template", "--chat-template-file", help="Jinja chat "
                                              "template file replacing the model's (its `tools` variable offers "
                                              "tools; checked and sandboxed alike)."),
    temperature: float = RUN_SAMPLING["temperature"],
    top_k: int = RUN_SAMPLING["top_k"],
    top_p: float = RUN_SAMPLING["top_p"],
    min_p: float = RUN_SAMPLING["min_p"],
    repeat_penalty: float = RUN_SAMPLING["repeat_penalty"],
    repeat_last_n: int = RUN_SAMPLING["repeat_last_n"],
    frequency_penalty: float = RUN_SAMPLING["frequency_penalty"],
    presence_penalty: float = RUN_SAMPLING["presence_penalty"],
    rope_scaling: str | None = ROPE_FLAGS["rope_scaling"],
    rope_scale: float | None = ROPE_FLAGS["rope_scale"],
    rope_freq_base: float | None = ROPE_FLAGS["rope_freq_base"],
    rope_freq_scale: float | None = ROPE_FLAGS["rope_freq_scale"],
    yarn_orig_ctx: int | None = ROPE_FLAGS["yarn_orig_ctx"],
):
    """Serve the model over HTTP: OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus /health and
    /metrics (Prometheus). Requests are batched into one forward per round; each decodes exactly as `guild run`.
    Sampling flags are the defaults for requests that leave a field out."""
    from ..engine.options import DecodeOptions
    from ..engine.sampling import SamplingParams  # deferred: see the module docstring
    from ..serve import ServeOptions
    from ..serve import serve as serve_model

    try:
        _set_numerics(numerics)
        _set_expert_cache(expert_cache)
        sampling = SamplingParams(**sampling_kw(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty))
        opts = DecodeOptions(strategy=strategy, max_draft=max_draft, sampling=sampling, context=context,
                             prefill_batch=prefill_batch, gexec=None if gexec is None else str(gexec), device=device,
                             kv=KVTypes(cache_type_k, cache_type_v),
                             rope=rope_options(rope_scaling, rope_scale, rope_freq_base, rope_freq_scale,
                                               yarn_orig_ctx))
        serve_model(_model_arg(model, model_opt), opts,
                    ServeOptions(host, port, parallel, max_queue, cache_mem, drain_timeout,
                                 None if chat_template is None else str(chat_template)), threads)
    except GuildError as e:
        _fail(e)


@app.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False,
             help="Chat in the terminal: the same as `guild run -i` (every run flag applies, e.g. guild chat MODEL "
                  "--system TEXT; -h shows them); /help inside lists the commands.")
def chat(ctx: typer.Context):
    typer.main.get_command(app).main(["run", "-i", *ctx.args], prog_name="guild", standalone_mode=False)


@app.command()
def bench(
    model: str | None = typer.Argument(None, help=MODEL_HELP),
    model_opt: str | None = typer.Option(None, "-m", "--model", help="The model, as a flag (llama.cpp's -m)."),
    workloads: str = typer.Option("W1,W2,W3,W4,W5,W6,W7,W8,W9", "--workloads", help="Comma-separated ids (W1..W11)."),
    strategies: str = typer.Option("normal,lookup,retrieval,adaptive", "--strategies",
                                   help="Comma-separated strategies."),
    repeats: int = typer.Option(1, "--repeats", help="Repeats (strategies interleaved within each)."),
    noise_check: bool = typer.Option(True, "--noise-check/--no-noise-check", help="With one repeat, run normal once "
                                     "more per workload: its tok/s CV is the noise a ratio must beat."),
    oracle: bool = typer.Option(True, "--oracle/--no-oracle", help="With adaptive, record each workload once more "
                                "and print the share of the oracle's gain adaptive won beside its speedup."),
    max_draft: int = typer.Option(4, "--spec-max-draft", "--draft-max", "--draft",
                                  help="Draft tokens per window at most."),
    max_tokens: int | None = typer.Option(None, "-n", "--max-tokens", "--n-predict",
                                          help="Override each workload's length."),
    context: int = typer.Option(8192, "-c", "--context", "--ctx-size",
                                help="Context length (W10 sizes above it are skipped)."),
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads (default: all cores)."),
    numerics: str = typer.Option("i8", "--numerics", help=NUMERICS_HELP),
    expert_cache: str = typer.Option("auto", "--expert-cache-mem", help=EXPERT_CACHE_HELP),
    sessions: int = typer.Option(1, "--sessions", help=f"Concurrent sessions per run ({SESSIONS_RANGE}), "
                                 "batched into one forward."),
    out: Path = typer.Option(Path("results"), "--out", help="Folder for bench.md and bench.jsonl."),
    as_json: bool = typer.Option(False, "--json", help="Print the records (JSON Lines) instead of the table."),
    gexec: Path | None = typer.Option(None, "--gexec", help=GEXEC_HELP),
    strict_plan: bool = typer.Option(False, "--strict-plan", help=STRICT_HELP),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    mtp_head: Path | None = typer.Option(None, "--mtp-head", help="MTP head GGUF for mtp/adaptive."),
    mtp_k: int = typer.Option(MTP_K, "--spec-mtp-k", help="MTP drafts per window at most (1..7)."),
    mtp_vocab: int = typer.Option(MTP_VOCAB, "--spec-mtp-vocab", help="Draft LM head rows (0 = whole vocabulary)."),
    temperature: float | None = BENCH_SAMPLING["temperature"],
    top_k: int | None = BENCH_SAMPLING["top_k"],
    top_p: float | None = BENCH_SAMPLING["top_p"],
    min_p: float | None = BENCH_SAMPLING["min_p"],
    repeat_penalty: float | None = BENCH_SAMPLING["repeat_penalty"],
    repeat_last_n: int | None = BENCH_SAMPLING["repeat_last_n"],
    frequency_penalty: float | None = BENCH_SAMPLING["frequency_penalty"],
    presence_penalty: float | None = BENCH_SAMPLING["presence_penalty"],
    seed: int | None = BENCH_SAMPLING["seed"],
    rope_scaling: str | None = ROPE_FLAGS["rope_scaling"],
    rope_scale: float | None = ROPE_FLAGS["rope_scale"],
    rope_freq_base: float | None = ROPE_FLAGS["rope_freq_base"],
    rope_freq_scale: float | None = ROPE_FLAGS["rope_freq_scale"],
    yarn_orig_ctx: int | None = ROPE_FLAGS["yarn_orig_ctx"],
):
    """Run workloads x strategies in one process, check token parity with normal, write a table. Sampling flags
    change those settings of every workload (the rest stay each workload's own)."""
    from ..bench.command import bench as run_bench
    from ..engine.sampling import SamplingParams  # deferred: see the module docstring
    from ..load import set_threads

    try:
        _writable(out / "bench.jsonl", "--out")
        model = _model_arg(model, model_opt)
        _set_numerics(numerics)
        _set_expert_cache(expert_cache)
        set_threads(threads)
        overrides = sampling_kw(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            seed=seed)
        SamplingParams(**overrides)  # each value checked now, with its flag's name
        kv = KVTypes(cache_type_k, cache_type_v)
        rep = run_bench(model, [w for w in workloads.split(",") if w], [s for s in strategies.split(",") if s],
                        repeats=repeats, max_draft=max_draft, context=context, sampling_overrides=overrides,
                        max_tokens=max_tokens, out=out, sessions=sessions, noise_check=noise_check, oracle=oracle,
                        gexec=None if gexec is None else str(gexec), strict_plan=strict_plan, device=device,
                        mtp=MtpOptions(None if mtp_head is None else str(mtp_head), mtp_k, vocab=mtp_vocab), kv=kv,
                        rope=rope_options(rope_scaling, rope_scale, rope_freq_base, rope_freq_scale, yarn_orig_ctx))
    except OSError as e:  # writing bench.md / bench.jsonl after the runs
        _fail(GuildError(f"--out {out}: cannot write ({e.strerror or e})"))
    except GuildError as e:
        _fail(e)
    if as_json:
        print(rep["jsonl"], end="")
    else:
        print(rep["markdown"])
        warning = rep["warning"]
        if warning:
            err.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
        err.print(f"[dim]written to {escape(str(out / 'bench.md'))} and {escape(str(out / 'bench.jsonl'))}[/]")


@app.command()
def optimize(
    model: str | None = typer.Argument(None, help=MODEL_HELP),
    out: Path = typer.Option(..., "-o", "--out", help="The plan to write (.gexec, YAML, sealed)."),
    mode: str = typer.Option("auto", "--mode", help="auto (full calibration) or quick (fewer repeats)."),
    context: int = typer.Option(4096, "--context", help="Context length the costs are measured at."),
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    prefill_batch: int = typer.Option(512, "--prefill-batch", help="Prompt rows per prefill forward."),
    spec: int = typer.Option(0, "--spec", help="MTP draft depth to calibrate (0: none; needs an MTP head). The head's "
                      "step and catch-up costs are measured whenever the model has one."),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP + " Costs are measured on it."),
    numerics: str = typer.Option("i8", "--numerics", help=NUMERICS_HELP),
):
    """Calibrate this machine for a model (probe, placement, CPU kernels, speculative costs) → a .gexec plan."""
    from ..calib.optimize import optimize as run_optimize  # deferred: see the module docstring
    from ..load import load

    try:
        _writable(out, "-o/--out", PlanError)
        _set_numerics(numerics)
        kv = KVTypes(cache_type_k, cache_type_v)
        with err.status("loading the model …", spinner="dots"):
            lm = load(model, kv=kv)
        plan = run_optimize(lm, out, mode=mode, context=context, prefill_batch=prefill_batch, spec=spec,
                            device=device)
    except GuildError as e:
        _fail(e)
    print(plan.path)


@app.command()
def inspect(
    path: Path = typer.Argument(..., help="A .gexec plan, or a GGUF model (path or tag)."),
    plan: bool = typer.Option(False, "--plan", help="Every table of a plan: placement, CPU tuning, speculative "
                              "costs and the verify curve."),
    as_json: bool = typer.Option(False, "--json", help="Print every field as JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the cost curves as a PNG (needs matplotlib: "
                                     "pip install 'guild\\[plot]')."),
):
    """Show a plan (identity, placement, CPU tuning, speculative costs) or a GGUF model."""
    from .inspect import inspect as run_inspect  # deferred: see the module docstring

    try:
        _writable(plot, "--plot")
        d = run_inspect(path, full=plan, as_json=as_json, plot_to=None if plot is None else str(plot))
    except GuildError as e:
        _fail(e)
    if as_json:
        print(json.dumps(d))
    elif plot is not None:
        err.print(f"[dim]plot written to {escape(str(plot))}[/]")


@app.command()
def upcycle(
    dense: str | None = typer.Argument(None, help="Dense llama GGUF (default: the embedded SmolLM2-135M)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Output GGUF (default: the user cache)."),
    experts: int = typer.Option(8, "--experts", help="Number of experts."),
    top_k: int = typer.Option(2, "--top-k", help="Experts used per token."),
    seed: int = typer.Option(0, "--seed", help="Seed of the perturbations and the router."),
):
    """Build a Mixtral-style MoE GGUF from a dense llama GGUF by sparse upcycling."""
    from .. import upcycle as up  # deferred: see the module docstring

    try:
        if dense is None and out is None and (experts, top_k, seed) == (8, 2, 0):
            path = up.ensure_embedded_moe()
        else:
            src = up.resolve_model(dense) if dense else up.embedded_dense_path()
            if out is None:
                raise GuildError("upcycle: --out is required unless building the default embedded MoE")
            _writable(out, "-o/--out")
            path = up.upcycle(src, out, n_experts=experts, top_k=top_k, seed=seed)
    except GuildError as e:
        _fail(e)
    print(path)


@app.command("train-mtp", help=(
    "Train a multi-token-prediction (MTP) draft head for a base model, the base frozen → a GGUF head file. "
    "Training data: Python standard library sources and Python's documentation (pydoc_data.topics), both under the "
    "PSF License, and the base's own greedy generations on guild's training prompts (kept disjoint from the "
    "benchmark workloads); targets are the base's greedy tokens (self-distillation), ~5% of the documents are held "
    "out for the acceptance figure. The defaults take about 35 minutes on the embedded smollm2-135m-moe with 2 "
    "threads. Needs torch: pip install 'guild\\[train]'."))
def train_mtp(
    model: str | None = typer.Argument(None, help=MODEL_HELP),
    output: Path = typer.Option(..., "-o", "--output", help="The MTP head to write (GGUF). Checkpoints and the "
                                "teacher data go to OUTPUT.ckpt/."),
    steps: int = typer.Option(250, "--steps", help="Optimizer steps."),
    text_tokens: int = typer.Option(120000, "--text-tokens", help="Tokens of Python standard library sources and "
                                    "Python documentation, teacher-forced through the base."),
    gen_tokens: int = typer.Option(20000, "--gen-tokens", help="Tokens the base generates (greedy, chat template) "
                                   "on guild's training prompts, then teacher-forced."),
    seq_len: int = typer.Option(512, "--seq-len", help="Tokens per teacher-forced chunk (state reset per chunk)."),
    batch: int = typer.Option(8, "--batch", help="Chunks per optimizer step."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak AdamW learning rate (warmup, cosine decay to 10%)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data selection, the held-out split and the init."),
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads (default: all cores)."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from OUTPUT.ckpt/ when it holds the "
                                "same configuration (--no-resume: start over, teacher data included)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
):
    """Train an MTP head (see the help above)."""
    from ..tools.train_mtp import train_mtp as run_train  # deferred: see the module docstring

    try:
        _writable(output, "-o/--output")
        s = run_train(model, output, steps=steps, text_tokens=text_tokens, gen_tokens=gen_tokens, seq_len=seq_len,
                      batch=batch, lr=lr, seed=seed, threads=threads, resume=resume)
    except GuildError as e:
        _fail(e)
    if as_json:
        print(json.dumps({k: v for k, v in s.items() if k != "history"}))
        return
    print(s["output"])
    err.print(f"[dim]held-out acceptance {s['heldout_acceptance']:.3f} (step 0: {s['heldout_acceptance_step0']:.3f})"
              f" over {s['heldout_rows']} rows · {s['rows']} training rows · {s['steps']} steps · "
              f"{s['bytes'] / 1e6:.1f} MB · {s['seconds'] / 60:.1f} min[/]")
    err.print("[dim]phases: " + " · ".join(f"{k} {v:.0f} s" for k, v in s["phases"].items()) + "[/]")


def main() -> None:  # pragma: no cover
    app()
