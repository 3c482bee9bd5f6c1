"""Rope tables and scaling (guild.kernels.rope), the --rope-* flags over a model's metadata, and contexts past the
trained one: run, never capped, with the tables grown on every backend (the fake GPU's bitwise the CPU's).
llama.cpp's logits under the same settings: tests/oracles/test_rope_llama_cpp.py."""

import logging
import math

import numpy as np
import pytest

from guild.engine.backends import HostBackend
from guild.engine.gpu import split_onto_device
from guild.engine.options import RopeOptions
from guild.engine.placement import GpuSplit
from guild.engine.session import GuildSession
from guild.errors import BadFlagError, GuildError
from guild.kernels.rope import NO_SCALING, RopeScaling, rope_tables, yarn_corr_dims
from guild.load import apply_rope
from guild.models import load_model
from guild.tools.tiny import write_tiny_model

N_ROT, BASE = 64, 100000.0


def _angles(n_ctx, n_rot=N_ROT, base=BASE):
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    return np.arange(n_ctx, dtype=np.float64)[:, None] * inv[None, :]


def test_unscaled_tables_are_the_plain_rope():
    cos, sin = rope_tables(128, N_ROT, BASE)
    ang = _angles(128)
    assert cos.dtype == np.float32 and cos.shape == (128, N_ROT // 2)
    assert np.array_equal(cos, np.cos(ang).astype(np.float32)) and np.array_equal(sin, np.sin(ang).astype(np.float32))
    # a longer table is the same rows extended: what growing the tables past the trained context relies on
    assert np.array_equal(rope_tables(300, N_ROT, BASE)[0][:128], cos)


def test_linear_divides_every_angle_and_attn_factor_scales_cos_sin():
    cos, sin = rope_tables(64, N_ROT, BASE, RopeScaling("linear", 4.0, attn_factor=0.5))
    ang = _angles(64) / 4.0
    assert np.allclose(cos, 0.5 * np.cos(ang), atol=1e-7) and np.allclose(sin, 0.5 * np.sin(ang), atol=1e-7)
    # position 8 under x4 is position 2 unscaled
    x4 = rope_tables(64, N_ROT, BASE, RopeScaling("linear", 4.0))
    assert np.allclose(x4[0][8], rope_tables(8, N_ROT, BASE)[0][2])


def test_yarn_keeps_high_frequencies_interpolates_low_ones_and_scales_by_mscale():
    s = RopeScaling("yarn", 4.0, orig_ctx=8192)
    low, high = yarn_corr_dims(N_ROT, 8192, BASE, 32.0, 1.0)
    assert (low, high) == (10.0, 20.0)  # SmolLM2's rope: pairs 0..9 keep their angles, 20.. are interpolated
    cos, sin = rope_tables(4096, N_ROT, BASE, s)
    m = 1 + 0.1 * math.log(4.0)
    ang = _angles(4096)
    assert np.allclose(cos[:, :10], m * np.cos(ang[:, :10]), atol=1e-6)
    assert np.allclose(cos[:, 20:], m * np.cos(ang[:, 20:] / 4), atol=1e-6)
    mid = 15  # halfway along the ramp: half each
    assert np.allclose(sin[:, mid], m * np.sin(0.5 * ang[:, mid] + 0.5 * ang[:, mid] / 4), atol=1e-6)
    # ext_factor 0 turns the ramp off: plain linear interpolation, and no magnitude scaling
    lin = rope_tables(64, N_ROT, BASE, RopeScaling("yarn", 4.0, orig_ctx=8192, ext_factor=0.0))
    assert np.array_equal(lin[0], rope_tables(64, N_ROT, BASE, RopeScaling("linear", 4.0))[0])


@pytest.mark.parametrize("kw, needle", [
    (dict(type="longrope"), "rope.scaling.type"),
    (dict(factor=0.0), "rope.scaling.factor"),
    (dict(factor=-2.0), "rope.scaling.factor"),
    (dict(factor=math.nan), "rope.scaling.factor"),
    (dict(factor=math.inf), "rope.scaling.factor"),
    (dict(attn_factor=math.nan), "rope.scaling.attn_factor"),
    (dict(beta_fast=0.0), "rope.scaling.yarn_beta_fast"),
    (dict(beta_slow=-1.0), "rope.scaling.yarn_beta_slow"),
    (dict(ext_factor=2.0), "rope.scaling.yarn_ext_factor"),
    (dict(orig_ctx=-5), "rope.scaling.original_context_length"),
])
def test_bad_scaling_is_one_line_naming_the_key(kw, needle):
    with pytest.raises(GuildError) as e:
        RopeScaling(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw, needle", [
    (dict(scaling="ntk"), "--rope-scaling"),
    (dict(scale=0.0), "--rope-scale"),
    (dict(scale=math.nan), "--rope-scale"),
    (dict(freq_scale=-1.0), "--rope-freq-scale"),
    (dict(freq_base=math.inf), "--rope-freq-base"),
    (dict(scale=2.0, freq_scale=0.5), "give one"),
    (dict(yarn_orig_ctx=0), "--yarn-orig-ctx"),
])
def test_bad_rope_flags_name_the_flag(kw, needle):
    with pytest.raises(BadFlagError, match=needle):
        RopeOptions(**kw)


def test_flags_resolve_over_the_metadata_as_llama_cpp_does():
    yarn = RopeScaling("yarn", 4.0, orig_ctx=32768, attn_factor=0.9)
    assert RopeOptions().resolve(1e6, yarn) == (1e6, yarn)
    # a factor alone scales linearly on a model without scaling (llama.cpp's default type), and keeps the type
    # of one that has it
    assert RopeOptions(scale=2.0).resolve(1e4, NO_SCALING)[1] == RopeScaling("linear", 2.0)
    assert RopeOptions(freq_scale=0.125).resolve(1e4, yarn)[1] == RopeScaling("yarn", 8.0, 32768, 0.9)
    # type none never scales; the attention factor of the file stays
    assert RopeOptions(scaling="none").resolve(1e4, yarn)[1] == RopeScaling("none", 1.0, 32768, 0.9)
    assert RopeOptions(scaling="yarn", scale=4.0, yarn_orig_ctx=8192, freq_base=5e5).resolve(1e4, NO_SCALING) == (
        5e5, RopeScaling("yarn", 4.0, 8192))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("rope") / "m.gguf", seed=3, context=32, qtype="Q8_0",
                                n_experts=4, top_k=2))


def test_context_past_the_trained_one_runs_uncapped_and_warns(tiny_path, caplog):
    model = load_model(tiny_path)
    assert model.args.trained_context == 32 and model.cos.shape[0] == 32
    with caplog.at_level(logging.WARNING, logger="guild.load"):
        apply_rope(model, RopeOptions(), 96)
    warned = [r.getMessage() for r in caplog.records if r.name == "guild.load"]
    assert len(warned) == 1 and "--context 96" in warned[0] and "32 tokens" in warned[0] and "\n" not in warned[0]
    assert model.cos.shape[0] == 96
    s = GuildSession(model, n_ctx=200)  # a session larger than the load's context grows the tables again
    assert s.n_ctx == 200 and model.cos.shape[0] == 200
    s.eos_ids = frozenset()
    out, _ = s.generate(list(range(5, 85)), 40)  # 80 prompt tokens and 40 more: far past 32
    assert len(out) == 40 and s.state.pos == 119
    # YaRN x4 covers 128 positions: no warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="guild.load"):
        apply_rope(load_model(tiny_path), RopeOptions(scaling="yarn", scale=4), 128)
    assert not [r for r in caplog.records if r.name == "guild.load"]


@pytest.mark.gpu  # the fake device
def test_scaled_rope_grown_on_a_fake_gpu_is_bitwise_the_cpu_model(tiny_path):
    rope = RopeOptions(scaling="yarn", scale=4, yarn_orig_ctx=16)
    cpu = load_model(tiny_path)
    apply_rope(cpu, rope, 40)
    eng = split_onto_device(cpu, HostBackend.fake_device(), GpuSplit(1, True, False))
    a, b = cpu.new_state(100), eng.new_state(100)  # both grow their tables past the 40 placed with
    dev_cos = eng.layout.rope["fake-gpu"][0]
    assert dev_cos.shape[0] == 100 and np.array_equal(dev_cos, cpu.cos)
    seq = np.arange(3, 93, dtype=np.int64) % 300
    assert np.array_equal(cpu.forward(seq[:80], a), eng.forward(seq[:80], b))
    a.commit(80)
    b.commit(80)
    for T in (1, 4, 8):
        assert np.array_equal(cpu.forward(seq[80:80 + T], a), eng.forward(seq[80:80 + T], b)), T
        a.commit(1)
        b.commit(1)
