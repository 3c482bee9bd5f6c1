"""`guild serve`: flags → DecodeOptions and ServeOptions for the OpenAI-compatible HTTP server (guild.serve)."""

from __future__ import annotations

from pathlib import Path

import typer

from ...engine.options import MAX_SESSIONS, DecodeOptions, RopeOptions
from ...engine.sampling import SamplingParams
from ...errors import GuildError
from ...kvtypes import KVTypes
from ..options import MODEL, ROPE, SERVE_SAMPLING, SPEC, flag, model_arg, set_process_flags, takes
from ..output import fail

SERVE = "Serving"


@takes(sampling=SERVE_SAMPLING, rope=ROPE)
def command(
    model: str | None = MODEL,
    model_opt: str | None = flag("model_opt"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (only this one).",
                             rich_help_panel=SERVE),
    port: int = typer.Option(8080, "--port", help="TCP port (0 = any free port).", rich_help_panel=SERVE),
    parallel: int = typer.Option(4, "--parallel", "-np", help=f"Requests decoding at once (1..{MAX_SESSIONS}); "
                                 "their windows share each forward.", rich_help_panel=SERVE),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests that may wait for a slot; more get HTTP 429 "
                                  "with Retry-After.", rich_help_panel=SERVE),
    cache_mem: int = typer.Option(4096, "--cache-mem", help="MiB of KV cache for active sessions and those kept "
                                  "for prefix reuse (least recently used evicted first).", rich_help_panel=SERVE),
    drain_timeout: float = typer.Option(300.0, "--drain-timeout", help="Seconds in-flight requests may take to "
                                        "finish after SIGTERM or Ctrl-C.", rich_help_panel=SERVE),
    threads: int | None = flag("threads"),
    numerics: str = flag("numerics"),
    expert_cache: str = flag("expert_cache"),
    cache_max: str | None = flag("cache_max"),
    mmap: bool = flag("mmap"),
    context: int = flag("context", help="Context of each session, in tokens."),
    cache_type_k: str = flag("cache_type_k"),
    cache_type_v: str = flag("cache_type_v"),
    prefill_batch: int = flag("prefill_batch", help="Prompt rows per prefill forward (<= 64: every cached row is "
                              "reusable by a later request)."),
    device: str = flag("device"),
    strategy: str = flag("strategy", help="Default strategy (a request may name its own as \"decode_strategy\").",
                         panel=SPEC),
    max_draft: int = flag("max_draft", help="Default draft tokens per window (0..7).", panel=SPEC),
    gexec: Path | None = flag("gexec", panel=SPEC),
    chat_template: Path | None = flag("chat_template", help="Jinja chat template file replacing the model's (its "
                                      "`tools` variable offers tools; checked and sandboxed alike)."),
    *,
    sampling: dict,
    rope: tuple,
):
    """Serve the model over HTTP: OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus /health and
    /metrics (Prometheus). Requests are batched into one forward per round; each decodes exactly as `guild run`.
    Sampling flags are the defaults for requests that leave a field out."""
    from ...serve import ServeOptions  # deferred: the server pulls in numba
    from ...serve import serve as serve_model

    try:
        set_process_flags(numerics, expert_cache, cache_max, mmap)
        opts = DecodeOptions(strategy=strategy, max_draft=max_draft, sampling=SamplingParams(**sampling),
                             context=context, prefill_batch=prefill_batch, gexec=None if gexec is None else str(gexec),
                             device=device, kv=KVTypes(cache_type_k, cache_type_v), rope=RopeOptions(*rope))
        serve_model(model_arg(model, model_opt), opts,
                    ServeOptions(host, port, parallel, max_queue, cache_mem, drain_timeout,
                                 None if chat_template is None else str(chat_template)), threads)
    except GuildError as e:
        fail(e)
