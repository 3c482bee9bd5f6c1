"""The command line's shared flags and help texts, built from the library's option tables (guild.engine.options,
guild.engine.sampling): the CLI reads them, the library never reads this. Light on purpose (no numba): `guild
--help` imports it."""

from __future__ import annotations

import typer

from ..engine.options import DEVICES, MAX_SESSIONS
from ..kvtypes import KV_TYPES

SAMPLING = "Sampling (llama.cpp names; chain: penalties → top-k → top-p → min-p → temperature)"
MODEL_HELP = "GGUF path or tag: smollm2-135m-moe (default, built once from the embedded model) or smollm2-135m."
TEXT = "Prompt and text"
SPEC = "Speculative decoding (exact: the same tokens as --decode-strategy normal)"
NUMERICS_HELP = ("i8 (activations quantised to 8 bits, one scale per 32 or per 256 elements, integer dot products "
                 "for every quantised type, as llama.cpp) or f32 (fp32 dequant-dot for every type).")
DEVICE_HELP = (f"{', '.join(DEVICES)}: where attention and dense layers run (auto: a CUDA GPU when CuPy sees one, "
               "else the CPU); routed experts always run on the CPU.")
GEXEC_HELP = ("Plan from `guild optimize`: calibrated costs for the scheduler, tuned threads. A plan for another "
              "machine or model is regenerated next to it (PLAN.local.gexec); a tampered one is an error.")
STRICT_HELP = "Fail on a --gexec plan for another machine or model instead of regenerating it."
PARALLEL_HELP = f"Requests decoding at once (1..{MAX_SESSIONS}); their windows share each forward."
SESSIONS_RANGE = f"1..{MAX_SESSIONS}"

_SAMPLING_FLAGS = (  # (SamplingParams-ish name, flags, help)
    ("temperature", ("--temperature", "--temp"), "0 = greedy."),
    ("top_k", ("--top-k",), "Keep the k most likely tokens (0 = off)."),
    ("top_p", ("--top-p",), "Nucleus: smallest set with this mass (1 = off)."),
    ("min_p", ("--min-p",), "Drop tokens below min_p x the top probability (0 = off)."),
    ("repeat_penalty", ("--repeat-penalty",), "1 = off."),
    ("repeat_last_n", ("--repeat-last-n",), "History the penalties see (-1 = all)."),
    ("frequency_penalty", ("--frequency-penalty",), "0 = off."),
    ("presence_penalty", ("--presence-penalty",), "0 = off."),
    ("seed", ("-s", "--seed"), "Seed of the position-keyed draws (run default: random; bench: the workload's)."),
)
_SAMPLING_FIELDS = {"repeat_last_n": "penalty_last_n"}  # flag name → SamplingParams field where they differ

EXPERT_CACHE_HELP = ("Memory for a MoE's routed experts, read from disk as the router asks for them (for models "
                     "larger than memory): a size (3G, 512MiB), off, or auto (on only when the model does not fit "
                     "in the available memory with a quarter to spare).")
def _sampling_options(d: dict | None) -> dict:
    """The sampling flags, shared by run and bench: `d` the defaults (None: bench, each flag None = the
    workload's own setting; the seed defaults to None on both)."""
    return {k: typer.Option(None if d is None else d.get(k), *flags, help=h, rich_help_panel=SAMPLING)
            for k, flags, h in _SAMPLING_FLAGS}

_KV_HELP = (f"{', '.join(KV_TYPES)} (llama.cpp's names and bytes per value; q8_0: 32 int8 and an f16 scale per 34 "
            "bytes). f32 keeps today's numbers; every type runs on the CPU and on the GPU.")
# the KV cache flags of run, chat, serve, bench and optimize (KVTypes checks their values)
CACHE_TYPE_K = typer.Option("f32", "-ctk", "--cache-type-k", help="Stored type of the KV cache's keys: " + _KV_HELP)
CACHE_TYPE_V = typer.Option("f32", "-ctv", "--cache-type-v", help="Stored type of the KV cache's values: " + _KV_HELP)


# run and serve default to llama.cpp's sampling chain
RUN_SAMPLING = _sampling_options(dict(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                                      repeat_last_n=64, frequency_penalty=0.0, presence_penalty=0.0))
BENCH_SAMPLING = _sampling_options(None)


def sampling_kw(**flags) -> dict:
    """SamplingParams keyword arguments from the sampling flags that were given (None = not given)."""
    return {_SAMPLING_FIELDS.get(k, k): v for k, v in flags.items() if v is not None}


ROPE = "Rope and long context (llama.cpp names; unset: the model's GGUF metadata)"
ROPE_FLAGS = {  # parameter -> option, in RopeOptions' field order
    "rope_scaling": typer.Option(None, "--rope-scaling", help="none, linear or yarn: how the rope stretches past "
                                 "the trained context.", rich_help_panel=ROPE),
    "rope_scale": typer.Option(None, "--rope-scale", help="Context factor N: the rope covers N times the trained "
                               "context (a factor alone scales linearly).", rich_help_panel=ROPE),
    "rope_freq_base": typer.Option(None, "--rope-freq-base", help="Rope base frequency.", rich_help_panel=ROPE),
    "rope_freq_scale": typer.Option(None, "--rope-freq-scale", help="Rope frequency scale: 1/N of --rope-scale N.",
                                    rich_help_panel=ROPE),
    "yarn_orig_ctx": typer.Option(None, "--yarn-orig-ctx", help="YaRN's original context (default: the model's "
                                  "rope.scaling.original_context_length, else its context_length).",
                                  rich_help_panel=ROPE),
}


def rope_options(*flags):
    """RopeOptions from the rope flags in ROPE_FLAGS' order (checked there, with each flag's name)."""
    from ..engine.options import RopeOptions

    return RopeOptions(*flags)
