"""The flags several commands take, each declared once (names, default, help), and what they mean to the library
(guild.engine.options, guild.engine.sampling): the CLI reads them, the library never reads this. Light on purpose
(no numba): `guild --help` imports it.

A command names a shared flag in one line: `threads: int | None = flag("threads")`, with its own default or help
where its meaning differs (`flag("context", 8192, "...")`); the sampling and rope flags come as groups
(`@takes(sampling=RUN_SAMPLING, rope=ROPE)`), each handed to the command as one value."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import typer

from ..engine.options import DEVICES, MAX_SESSIONS
from ..errors import BadFlagError
from ..kvtypes import KV_TYPES
from ..speculative.options import MTP_K, MTP_VOCAB

MODEL_HELP = "GGUF path or tag: smollm2-135m-moe (default, built once from the embedded model) or smollm2-135m."
TEXT = "Prompt and text"
SPEC = "Speculative decoding (exact: the same tokens as --decode-strategy normal)"
DEVICE_HELP = (f"{', '.join(DEVICES)}: where attention and dense layers run (auto: a CUDA GPU when CuPy sees one, "
               "else the CPU); routed experts always run on the CPU.")
SESSIONS_RANGE = f"1..{MAX_SESSIONS}"

_NUMERICS_HELP = ("i8 (activations quantised to 8 bits, one scale per 32 or per 256 elements, integer dot products "
                  "for every quantised type, as llama.cpp) or f32 (fp32 dequant-dot for every type).")
_GEXEC_HELP = ("Plan from `guild optimize`: calibrated costs for the scheduler, tuned threads. A plan for another "
               "machine or model is regenerated next to it (PLAN.local.gexec); a tampered one is an error.")
_EXPERT_CACHE_HELP = ("Memory for a MoE's routed experts, read from disk as the router asks for them (for models "
                      "larger than memory): a size (3G, 512MiB), off, or auto (on only when the model does not fit "
                      "in the available memory with a quarter to spare).")
_KV_HELP = (f"{', '.join(KV_TYPES)} (llama.cpp's names and bytes per value; q8_0: 32 int8 and an f16 scale per 34 "
            "bytes). f32 keeps today's numbers; every type runs on the CPU and on the GPU.")

_CACHE_MAX_HELP = ("Size limit of the repack cache (the repacked copies of models, $GUILD_CACHE_DIR/repack): 40G, "
                   "512M or none; least recently used copies go first; a model larger than it is repacked into "
                   "memory. Overrides GUILD_CACHE_MAX; default half of the disk's room.")

_MMAP_HELP = ("Map the repacked weights from the repack cache instead of reading them into memory: less resident "
              "memory, pages the OS may drop, slower decode. Default: read into memory (on huge pages where the "
              "OS has them) when the model fits the available memory with a quarter to spare; GUILD_MMAP=1 "
              "likewise.")


def _cache_max(value: str | None) -> str | None:
    """--cache-max checked as it is read: a bad size is a usage error (one line, exit status 2)."""
    if value is not None:
        from ..formats.cache_store import FLAG_MAX, parse_size  # light: no numba

        try:
            parse_size(value, FLAG_MAX)
        except BadFlagError as e:
            raise typer.BadParameter(str(e).removeprefix(f"{FLAG_MAX}: ")) from None
    return value


MODEL = typer.Argument(None, help=MODEL_HELP)  # the model argument of run, serve, bench, optimize, train-mtp

_FLAGS = {  # parameter → (flags, default, help[, check]); help None: each command says what the flag means to it
    "model_opt": (("-m", "--model"), None, "The model, as a flag (llama.cpp's -m)."),
    "threads": (("-t", "--threads"), None, "CPU threads (default: all cores)."),
    "numerics": (("--numerics",), "i8", _NUMERICS_HELP),
    "expert_cache": (("--expert-cache-mem",), "auto", _EXPERT_CACHE_HELP),
    "cache_max": (("--cache-max",), None, _CACHE_MAX_HELP, _cache_max),
    "mmap": (("--mmap",), False, _MMAP_HELP),
    "device": (("--device",), "auto", DEVICE_HELP),
    # KVTypes checks these two
    "cache_type_k": (("-ctk", "--cache-type-k"), "f32", "Stored type of the KV cache's keys: " + _KV_HELP),
    "cache_type_v": (("-ctv", "--cache-type-v"), "f32", "Stored type of the KV cache's values: " + _KV_HELP),
    "gexec": (("--gexec",), None, _GEXEC_HELP),
    "strict_plan": (("--strict-plan",), False, "Fail on a --gexec plan for another machine or model instead of "
                                               "regenerating it."),
    "context": (("-c", "--context", "--ctx-size"), 4096, None),
    "prefill_batch": (("-b", "--prefill-batch", "--batch-size"), 512, None),
    "max_tokens": (("-n", "--max-tokens", "--n-predict"), None, None),
    "strategy": (("--decode-strategy",), "adaptive", None),
    "max_draft": (("--spec-max-draft", "--draft-max", "--draft"), 4, None),
    "mtp_head": (("--mtp-head",), None, None),
    "mtp_k": (("--spec-mtp-k",), MTP_K, "MTP drafts per window at most (1..7; 0: as deep as the head was "
                                        "trained to chain, train-mtp --depth)."),
    "mtp_vocab": (("--spec-mtp-vocab",), MTP_VOCAB, None),
    "sessions": (("--sessions",), 1, None),
    "as_json": (("--json",), False, None),
    "chat_template": (("--chat-template", "--chat-template-file"), None, None),
}
_SHARED = object()  # flag(): the default in _FLAGS


def flag(param: str, default=_SHARED, help: str | None = None, panel: str | None = None):
    """The shared flag of parameter `param` (_FLAGS), with this command's default, help and help panel if given."""
    names, shared_default, shared_help, *check = _FLAGS[param]
    return typer.Option(shared_default if default is _SHARED else default, *names, help=help or shared_help,
                        rich_help_panel=panel, callback=check[0] if check else None)


class Group:
    """Flags several commands take together (`flags`: parameter → (type, option)), handed to a command as one
    value: `collect` of their values by parameter."""

    def __init__(self, flags: dict[str, tuple[type, typer.models.OptionInfo]], collect: Callable[[dict], object]):
        self.flags, self.collect = flags, collect


def takes(**groups: Group):
    """Decorator: the command's keyword-only parameter `name` receives `groups[name]`. The groups' flags follow the
    command's own in its signature (Typer reads that), in this order."""
    def decorate(command):
        sig = inspect.signature(command, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name not in groups]
        flags = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=t)
                 for g in groups.values() for n, (t, opt) in g.flags.items()]

        @functools.wraps(command)
        def with_groups(**kw):
            for name, g in groups.items():
                kw[name] = g.collect({n: kw.pop(n) for n in g.flags})
            return command(**kw)

        with_groups.__signature__ = sig.replace(parameters=own + flags)
        return with_groups
    return decorate


_SAMPLING_PANEL = "Sampling (llama.cpp names; chain: penalties → top-k → top-p → min-p → temperature)"
_SAMPLING_FLAGS = (  # (parameter, type, flags, help)
    ("temperature", float, ("--temperature", "--temp"), "0 = greedy."),
    ("top_k", int, ("--top-k",), "Keep the k most likely tokens (0 = off)."),
    ("top_p", float, ("--top-p",), "Nucleus: smallest set with this mass (1 = off)."),
    ("min_p", float, ("--min-p",), "Drop tokens below min_p x the top probability (0 = off)."),
    ("repeat_penalty", float, ("--repeat-penalty",), "1 = off."),
    ("repeat_last_n", int, ("--repeat-last-n",), "History the penalties see (-1 = all)."),
    ("frequency_penalty", float, ("--frequency-penalty",), "0 = off."),
    ("presence_penalty", float, ("--presence-penalty",), "0 = off."),
    ("seed", int, ("-s", "--seed"), "Seed of the position-keyed draws (run default: random; bench: the workload's)."),
)
_SAMPLING_FIELDS = {"repeat_last_n": "penalty_last_n"}  # flag name → SamplingParams field where they differ


def _sampling(defaults: dict | None, seed: bool = True) -> Group:
    """The sampling flags (`seed`: with -s/--seed), handed over as the SamplingParams keyword arguments of those
    given. `defaults` None: bench's, each flag None = the workload's own setting; the seed defaults to None."""
    return Group({k: (t | None, typer.Option(None if defaults is None else defaults.get(k), *names, help=h,
                                             rich_help_panel=_SAMPLING_PANEL))
                  for k, t, names, h in _SAMPLING_FLAGS if seed or k != "seed"},
                 lambda v: {_SAMPLING_FIELDS.get(k, k): x for k, x in v.items() if x is not None})


# run and serve default to llama.cpp's sampling chain; serve takes a request's seed, not a flag
_LLAMA_CPP = dict(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64,
                  frequency_penalty=0.0, presence_penalty=0.0)
RUN_SAMPLING = _sampling(_LLAMA_CPP)
SERVE_SAMPLING = _sampling(_LLAMA_CPP, seed=False)
BENCH_SAMPLING = _sampling(None)

_ROPE_PANEL = "Rope and long context (llama.cpp names; unset: the model's GGUF metadata)"
# handed over as a tuple in RopeOptions' field order: RopeOptions(*rope) checks them, with each flag's name
ROPE = Group({
    "rope_scaling": (str | None, typer.Option(None, "--rope-scaling", help="none, linear or yarn: how the rope "
                                              "stretches past the trained context.", rich_help_panel=_ROPE_PANEL)),
    "rope_scale": (float | None, typer.Option(None, "--rope-scale", help="Context factor N: the rope covers N times "
                                              "the trained context (a factor alone scales linearly).",
                                              rich_help_panel=_ROPE_PANEL)),
    "rope_freq_base": (float | None, typer.Option(None, "--rope-freq-base", help="Rope base frequency.",
                                                  rich_help_panel=_ROPE_PANEL)),
    "rope_freq_scale": (float | None, typer.Option(None, "--rope-freq-scale", help="Rope frequency scale: 1/N of "
                                                   "--rope-scale N.", rich_help_panel=_ROPE_PANEL)),
    "yarn_orig_ctx": (int | None, typer.Option(None, "--yarn-orig-ctx", help="YaRN's original context (default: the "
                                               "model's rope.scaling.original_context_length, else its "
                                               "context_length).", rich_help_panel=_ROPE_PANEL)),
}, lambda v: tuple(v.values()))


def model_arg(model: str | None, model_opt: str | None) -> str | None:
    """The model from the argument or -m/--model (the same one if both)."""
    if model is not None and model_opt is not None and model != model_opt:
        raise BadFlagError(f"two models: {model} and -m/--model {model_opt}; give one")
    return model if model is not None else model_opt


def set_process_flags(numerics: str, expert_cache: str | None = None, cache_max: str | None = None,
                      mmap: bool = False) -> None:
    """The flags every load of this process follows: --numerics, the mode every matrix is packed under
    (kernels/cpu/quant.py NUMERICS), --expert-cache-mem if the command takes it (guild.engine.experts),
    --cache-max if given (guild.formats.cache_store) and --mmap (guild.formats.resident)."""
    from ..engine import experts  # deferred: numba
    from ..formats import cache_store, resident
    from ..kernels.cpu import quant

    if numerics not in quant.NUMERICS:
        raise BadFlagError(f"--numerics must be {' or '.join(quant.NUMERICS)}, not {numerics!r}")
    quant.set_default_numerics(numerics)
    cache_store.set_limit(cache_max)
    resident.set_mmap(True if mmap else None)
    if expert_cache is not None:
        experts.set_default(experts.expert_cache_mem(expert_cache))
