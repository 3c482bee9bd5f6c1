"""Hostile model files, plans, chat templates, prompts and output paths, one case per test: each either works or
fails with one line naming what is wrong, within bounded time and memory."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from guild.errors import ChatTemplateError, GgufFormatError, GuildError, PlanError, PlanSealError
from guild.formats.gguf import GGUFFile
from guild.models import load_model
from guild.models.validate import ModelValidationError, NumericsError, check_finite
from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.fuzz import gguf_io as gi


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    return {
        "llama": write_tiny_model(d / "llama.gguf", n_layers=1, qtype="Q8_0", context=64),
        "moe": write_tiny_model(d / "moe.gguf", n_layers=1, n_experts=4, top_k=2, qtype="Q4_0", context=64),
        "qwen3": write_tiny_model(d / "qwen3.gguf", "qwen3", n_layers=1, context=64),
        "hybrid": write_tiny_hybrid(d / "hybrid.gguf", n_layers=2, full_attention_interval=2, n_experts=4, context=64),
    }


def _mutated(src: Path, dst: Path, edit) -> Path:
    g = gi.parse(src.read_bytes())
    edit(g)
    dst.write_bytes(gi.serialize(g))
    return dst


def _load_error(path: Path) -> GuildError:
    with pytest.raises(GuildError) as ei:
        load_model(str(path))
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg, msg
    return ei.value


def _ti(g, name):
    t = g.tensor(name)
    assert t is not None, name
    return t


@pytest.mark.parametrize("seed, edit, needle", [
    ("llama", lambda g: g.set("llama.context_length", gi.U64, 2**63), "context_length"),
    ("llama", lambda g: g.set("llama.context_length", gi.U32, 2**31), "context_length"),
    ("llama", lambda g: g.set("llama.attention.head_count", gi.U32, 0), "head_count"),
    ("llama", lambda g: g.set("llama.attention.layer_norm_rms_epsilon", gi.F32, -1e-5), "epsilon"),
    ("llama", lambda g: g.set("llama.rope.freq_base", gi.F32, math.inf), "freq_base"),
    ("llama", lambda g: g.set("llama.rope.freq_base", gi.F32, math.nan), "freq_base"),
    ("llama", lambda g: g.set("llama.rope.scaling.type", gi.STR, b"longrope"), "rope.scaling.type"),
    ("llama", lambda g: g.set("llama.rope.scaling.factor", gi.F32, math.nan), "rope.scaling.factor"),
    ("llama", lambda g: g.set("llama.rope.scaling.factor", gi.F32, -4.0), "rope.scaling.factor"),
    ("llama", lambda g: g.set("llama.rope.scaling.original_context_length", gi.I32, -8), "original_context_length"),
    ("qwen3", lambda g: g.set("qwen3.rope.scaling.attn_factor", gi.F32, math.inf), "rope.scaling.attn_factor"),
    ("qwen3", lambda g: g.set("qwen3.rope.scaling.yarn_beta_fast", gi.F32, 0.0), "yarn_beta_fast"),
    ("hybrid", lambda g: g.set("qwen35moe.rope.scaling.yarn_ext_factor", gi.F32, 3.0), "yarn_ext_factor"),
    ("qwen3", lambda g: setattr(_ti(g, "blk.0.attn_q_norm.weight"), "dims", [8]), "attn_q_norm"),
    ("llama", lambda g: setattr(_ti(g, "blk.0.attn_norm.weight"), "dims", [32]), "attn_norm"),
    ("llama", lambda g: setattr(_ti(g, "blk.0.attn_norm.weight"), "dims", [16, 2, 2]), "attn_norm"),
    ("moe", lambda g: g.set("llama.expert_count", gi.U32, 8), "ffn_gate_inp"),
    ("moe", lambda g: g.set("llama.expert_count", gi.U32, 0), "expert_count"),
    ("hybrid", lambda g: g.set("qwen35moe.ssm.group_count", gi.U32, 4), "blk.0."),
    ("hybrid", lambda g: g.set("qwen35moe.block_count", gi.U64, 2**62), "block_count"),
])
def test_metadata_and_shapes_are_checked_against_each_other(seeds, tmp_path, seed, edit, needle):
    e = _load_error(_mutated(seeds[seed], tmp_path / "m.gguf", edit))
    assert needle in str(e), str(e)


def test_swapped_q_and_v_are_refused(seeds, tmp_path):
    def swap(g):
        q, v = _ti(g, "blk.0.attn_q.weight"), _ti(g, "blk.0.attn_v.weight")
        q.name, v.name = v.name, q.name
    e = _load_error(_mutated(seeds["llama"], tmp_path / "m.gguf", swap))
    assert isinstance(e, ModelValidationError) and "attn_" in str(e) and "expected" in str(e)


@pytest.mark.parametrize("edit, needle", [
    (lambda g: setattr(g.tensors[3], "offset", 2**64 - 32), "runs past the end"),
    (lambda g: setattr(g.tensors[3], "offset", g.tensors[3].offset + 1), "alignment"),
    (lambda g: setattr(g.tensors[3], "offset", g.tensors[2].offset), "overlap"),
    (lambda g: g.set("general.x", gi.ARR, (gi.ARR, [(gi.U8, [1])])), "arrays of arrays"),
    (lambda g: setattr(g, "n_kv", 2**40), "do not fit"),
    (lambda g: setattr(g.tensors[0], "dims", [1] * 5), "dimensions"),
    (lambda g: setattr(g.tensors[0], "qtype", 1000), "unknown type"),
])
def test_the_index_is_checked_against_the_file(seeds, tmp_path, edit, needle):
    p = _mutated(seeds["llama"], tmp_path / "m.gguf", edit)
    with pytest.raises(GgufFormatError, match=needle):
        GGUFFile(p)


@pytest.mark.parametrize("tensor, bad", [("output_norm.weight", math.nan), ("blk.0.ffn_down.weight", math.inf),
                                         ("token_embd.weight", -math.inf)])
def test_non_finite_weights_and_scales_are_found_at_load(seeds, tmp_path, tensor, bad):
    src = seeds["llama"]
    g = gi.parse(src.read_bytes())
    t = _ti(g, tensor)
    data = bytearray(g.data)
    if t.qtype == 0:  # F32 element
        data[t.offset + 8 : t.offset + 12] = np.float32(bad).tobytes()
    else:  # Q8_0: the f16 scale of block 1 (34-byte blocks, d first)
        data[t.offset + 34 : t.offset + 36] = np.float16(bad).tobytes()
    g.data = bytes(data)
    p = tmp_path / "nan.gguf"
    p.write_bytes(gi.serialize(g))
    e = _load_error(p)
    assert isinstance(e, NumericsError) and tensor in str(e)


def test_nan_never_raises_inside_a_kernel():
    from guild.kernels.cpu import ops

    gu = np.array([[np.nan, -np.inf, np.inf, 1.0, 1.0, 1.0]], np.float32)
    out = np.empty((1, 3), np.float32)
    ops.swiglu(gu, out)  # fastmath, error_model="numpy": no ZeroDivisionError
    logits = np.full((2, 4), np.nan, np.float32)
    ids, w = np.empty((2, 2), np.int64), np.empty((2, 2), np.float32)
    ops.softmax_topk(logits, 2, True, ids, w)
    assert ids.tolist() == [[0, 1], [0, 1]]  # never -1 (which would wrap to the last expert)
    with pytest.raises(NumericsError, match="non-finite"):
        check_finite(out, "model.gguf")


def test_mtp_head_draft_ids_out_of_range_are_refused(seeds, tmp_path):
    base = load_model(str(seeds["llama"]))
    head = write_tiny_mtp_head(seeds["llama"], tmp_path / "h.mtp.gguf", draft_vocab=16)
    g = gi.parse(head.read_bytes())
    t = _ti(g, "mtp.draft_vocab")
    data = bytearray(g.data)
    data[t.offset : t.offset + 4] = np.int32(10**6).tobytes()
    g.data = bytes(data)
    (tmp_path / "bad.mtp.gguf").write_bytes(gi.serialize(g))
    from guild.models.mtp import find_mtp_head

    with pytest.raises(GuildError, match="draft_vocab"):
        find_mtp_head(base, tmp_path / "bad.mtp.gguf", draft_vocab=16)


# -- chat templates ------------------------------------------------------------------------------------
def _render(seeds, template):
    from guild.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFFile(seeds["llama"]).metadata)
    tok.chat_template, tok._template_cache = template, None
    return tok.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("template, needle", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "took over"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}", " over "),
    ("{{ 'x' * 3000000000 }}", "'*'"),
    ("{% set s = namespace(v='ab') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v }}", ""),
    ("{% macro f(n) %}{{ n }}\n{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ""),
    ("{{ 10 ** 100000000 }}", "'**'"),
    ("{{ 'x'|center(3000000000) }}", "center"),
    ("{{ '%0999999999d' % 1 }}", "width"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
])
def test_chat_templates_are_bounded(seeds, template, needle):
    from guild.text.template_guard import TIME_LIMIT_S

    # CPU time, not the wall clock: the guard's limit counts the rendering thread's CPU, and a loaded machine
    # stretches the wall time without any more work done
    c0 = time.process_time()
    with pytest.raises(ChatTemplateError) as ei:
        _render(seeds, template)
    assert time.process_time() - c0 < TIME_LIMIT_S + 4
    assert "\n" not in str(ei.value) and needle in str(ei.value), str(ei.value)


def test_the_template_limit_counts_the_rendering_threads_cpu_not_waiting():
    """The time limit bounds what a template computes: 2.5 s spent off the CPU (here a sleep, in a run a GIL held by
    another thread or a busy machine) during a render is not the template's; the same time spent looping is."""
    import gc

    from guild.text.template_guard import TIME_LIMIT_S, GuardedEnvironment, render

    env = GuardedEnvironment()
    t = env.from_string("{{ wait() }}done")
    assert render(t, {"wait": lambda: time.sleep(TIME_LIMIT_S + 0.5) or ""}) == "done"
    assert gc.isenabled()  # collections, off during a render (not its time), are back on


def test_ordinary_templates_still_render(seeds):
    assert _render(seeds, None).endswith("<|im_start|>assistant\n")


# -- plans ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_bytes():
    from tests.fuzz.gen import seed_plan

    return seed_plan()


def _resealed(plan_bytes, edit) -> bytes:
    import yaml

    from guild.plans.plan import SECTIONS, section_digest
    from tests.fuzz.gen import _reseal

    d = yaml.safe_load(plan_bytes)
    d.pop("seal")
    edit(d)
    for s in SECTIONS:
        d[s]["sha256"] = section_digest(d[s])
    return _reseal(("# x\n" + yaml.safe_dump(d, sort_keys=False)).encode())


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["drafting"].update(kv_commit_ms=2**63), "drafting.kv_commit_ms"),
    (lambda d: d["drafting"].update(verify_window_ms=[1e30] * 8), "drafting.verify_window_ms"),
    (lambda d: d["drafting"]["draft_ms"].update(lookup=-1.0), "drafting.draft_ms.lookup"),
    (lambda d: d["drafting"]["draft_ms"].update(nosuch=1.0), "drafting.draft_ms.nosuch: unknown field"),
    (lambda d: d["drafting"]["catchup_ms"].update(lookup=1.0), "drafting.catchup_ms.lookup: unknown field"),
    (lambda d: d["cpu"].update(threads="blk.0.attn_q.weight"), "cpu.threads"),
    (lambda d: d["header"].update(context=True), "header.context"),
    (lambda d: d["placement"]["groups"][0].update(bytes=-1), "placement.groups[0].bytes"),
])
def test_resealed_nonsense_values_are_refused(plan_bytes, tmp_path, edit, needle):
    from guild.plans.plan import read_plan

    p = tmp_path / "x.gexec"
    p.write_bytes(_resealed(plan_bytes, edit))
    with pytest.raises(PlanError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        read_plan(p)


def test_yaml_alias_bomb_in_a_sealed_plan_is_refused_at_once(plan_bytes, tmp_path):
    from guild.plans.plan import read_plan
    from tests.fuzz.gen import HOSTILE_YAML, _reseal

    body = plan_bytes[: plan_bytes.rfind(b"seal: ")] + HOSTILE_YAML[0].encode()
    p = tmp_path / "bomb.gexec"
    p.write_bytes(_reseal(body))
    c0 = time.process_time()  # CPU time: an expanded bomb costs minutes of it, a refusal milliseconds
    with pytest.raises(PlanSealError, match="aliases"):
        read_plan(p)
    assert time.process_time() - c0 < 2


def test_plan_from_dev_zero_is_refused(tmp_path):
    from guild.plans.plan import read_plan

    with pytest.raises(PlanError, match="MiB"):
        read_plan("/dev/zero")


# -- prompts, conversation files -----------------------------------------------------------------------
def test_invalid_utf8_prompts():
    from guild.errors import BadFlagError
    from guild.text.inputs import prompt_text

    argv = os.fsdecode(b"caf\xc3\xa9 \xff\xfe")  # what sys.argv holds for these bytes
    with pytest.raises(BadFlagError, match=r"-p/--prompt: invalid UTF-8 at byte 6"):
        prompt_text(argv, "-p/--prompt")
    assert prompt_text(argv, "stdin", replace=True) == "café \ufffd\ufffd"
    assert prompt_text("café", "-p") == "café"


@pytest.mark.parametrize("content, needle", [
    (None, "MiB"),  # /dev/zero
    (b"a: &a [x, x]\nb: [*a, *a]\n", "aliases"),
    (b"- \xff\xfe\n", "invalid UTF-8"),
    (b"- 2026-01-01\n", "date"),
])
def test_conversation_files_are_bounded(tmp_path, content, needle):
    from guild.text.inputs import conversation_turns

    p = Path("/dev/zero") if content is None else tmp_path / "c.yaml"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(GuildError, match=needle):
        conversation_turns(p)


# -- the CLI -------------------------------------------------------------------------------------------
def _guild(*args, env=None):
    return subprocess.run([sys.executable, "-m", "guild", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_output_paths_are_checked_before_the_work(tmp_path, monkeypatch):
    """In-process (the commands' own checks are under test; test_usage_errors runs the whole program)."""
    from typer.testing import CliRunner

    from guild.cli import app
    from guild.formats import gguf

    # counted work, not time: refused before any model file is opened (every load goes through GGUFFile)
    opened = []
    monkeypatch.setattr(gguf.GGUFFile, "__init__", lambda self, *a, **k: opened.append(a) or 1 / 0)
    for args, needle in ((["run", "smollm2-135m", "-p", "hi", "--trace", str(tmp_path)], "--trace"),
                         (["bench", "smollm2-135m", "--out", "/proc/guild-no/x"], "--out"),
                         (["optimize", "smollm2-135m", "-o", "/proc/x.gexec"], "-o/--out")):
        r = CliRunner().invoke(app, args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 1 and type(r.exception) is SystemExit, (r.output, r.exception)  # no traceback
        assert len(lines) == 1 and needle in lines[0], r.stderr
        assert opened == [], args


def test_usage_errors_are_one_line():
    r = _guild("run", "--bogus")
    lines = r.stderr.strip().splitlines()  # click may add "(Possible options: --verbose)"
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: No such option: --bogus")
    assert lines[0].endswith("(see guild --help)")


def test_last_resort_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    from guild.cli.last_resort import run_cli

    def boom(**kw):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(sys, "argv", ["guild", "run"])
    monkeypatch.delenv("GUILD_DEBUG", raising=False)
    with pytest.raises(SystemExit) as ei:
        run_cli(boom)
    err = capsys.readouterr().err
    assert ei.value.code == 1 and err.count("\n") == 1 and err.startswith("error: RuntimeError: kaboom")
    monkeypatch.setattr(sys, "argv", ["guild", "run", "--debug"])
    with pytest.raises(SystemExit):
        run_cli(boom)
    assert "Traceback" in capsys.readouterr().err


# -- files ---------------------------------------------------------------------------------------------
def test_atomic_path_cleans_up_and_removes_stale_temporaries(tmp_path):
    from guild.formats.files import atomic_path, write_bytes

    target = tmp_path / "m.gguf"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".m.gguf.{dead}.0badc0de.part"
    live = tmp_path / f".m.gguf.{os.getppid()}.0badc0de.part"
    legacy = tmp_path / ".m.gguf.abc123.tmp"
    other = tmp_path / f".other.gguf.{dead}.0badc0de.part"
    for p in (stale, live, legacy, other):
        p.write_bytes(b"x")
    with pytest.raises(ValueError), atomic_path(target, "the model") as tmp:
        tmp.write_bytes(b"half")
        raise ValueError("interrupted")
    assert not target.exists() and not stale.exists() and not legacy.exists()
    assert live.exists() and other.exists()  # a running writer's and another target's are left alone
    write_bytes(target, b"whole", "the model")
    assert target.read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name, other.name])


def test_sigterm_during_an_atomic_write_leaves_nothing(tmp_path):
    code = ("import os, signal, sys\nfrom guild.formats.files import atomic_path\n"
            f"with atomic_path({str(tmp_path / 'out.bin')!r}, 'x') as t:\n"
            "    t.write_bytes(b'partial')\n    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    import time; time.sleep(30)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_cleanup_failure_does_not_hide_the_error(tmp_path, monkeypatch):
    from guild.formats import files

    def erofs(p):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(files.os, "replace", lambda a, b: erofs(a))
    monkeypatch.setattr(files.Path, "unlink", lambda self, missing_ok=False: erofs(self))
    with pytest.raises(GuildError, match="cannot write the plan .Read-only file system"):
        files.write_bytes(tmp_path / "p.gexec", b"x", "the plan")


def test_cached_builds_are_verified_before_reuse(tmp_path):
    from guild.formats import cache_check

    p = tmp_path / "m.gguf"
    p.write_bytes(b"A" * 1000)
    cache_check.record(p)
    assert cache_check.verified(p)
    with open(p, "r+b") as f:  # truncated, keeps its header
        f.truncate(500)
    assert not cache_check.verified(p)
    p.write_bytes(b"B" * 1000)  # same size, other bytes, new mtime
    os.utime(p, ns=(1, 1))
    assert not cache_check.verified(p)
    cache_check.record(p)
    assert cache_check.verified(p)
