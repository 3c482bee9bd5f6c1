"""guild train-mtp: the MTP head trainer (guild/tools/train_mtp/) on tiny random models."""

import sys

import numpy as np
import pytest

from tests.helpers.optional import installed

torch = installed("torch")

from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from guild.errors import GuildError, ModelNotFoundError, UnsupportedArchitectureError  # noqa: E402
from guild.formats.gguf import GGUFFile  # noqa: E402
from guild.kernels import ref  # noqa: E402
from guild.kernels.rope import rope_tables  # noqa: E402
from guild.models import load_model  # noqa: E402
from guild.tools import train_mtp as tm  # noqa: E402
from guild.tools.tiny import write_tiny_model  # noqa: E402
from guild.tools.tiny_hybrid import write_tiny_hybrid  # noqa: E402

TINY = dict(text_tokens=500, gen_tokens=100, seq_len=32, batch=4, lr=3e-3, threads=1, progress=False)


@pytest.fixture(autouse=True)
def _restore_threads(threads):
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp_models")
    return {
        "dense": write_tiny_model(d / "dense.gguf", "llama", seed=3),
        "moe": write_tiny_model(d / "moe.gguf", "llama", n_experts=4, top_k=2, qtype="Q4_0", seed=4),
        "qwen3": write_tiny_model(d / "qwen3.gguf", "qwen3", head_dim=32, seed=5),
        "qwen3moe": write_tiny_model(d / "qwen3moe.gguf", "qwen3moe", n_experts=4, top_k=2, seed=6),
    }


# -- the torch block is the engine's layer -------------------------------------------------------------------
def _w(g, name):
    t = g.tensors[name]
    return dequantize(np.asarray(t.data), t.qtype).reshape(t.shape).astype(np.float64)


def _reference_head(g, args, hn, hnorm_w):
    """NumPy (guild.kernels.ref) head at init with a zero embedding half: the base's last layer over
    rmsnorm(hn) * hnorm_w at positions 0..T-1, then rmsnorm with output_norm (= shared_head_norm)."""
    p = f"blk.{args.n_layers - 1}."
    eps, T = args.norm_eps, hn.shape[0]
    H, Hkv, hd = args.n_heads, args.n_kv_heads, args.head_dim
    n_rot = args.rope_dim or hd
    cos, sin = rope_tables(T, n_rot, args.rope_base)
    pos = np.arange(T)
    x = ref.rmsnorm(hn, hnorm_w, eps).astype(np.float64)
    h = ref.rmsnorm(x, _w(g, p + "attn_norm.weight"), eps).astype(np.float64)
    q = (h @ _w(g, p + "attn_q.weight").T).reshape(T, H, hd)
    k = (h @ _w(g, p + "attn_k.weight").T).reshape(T, Hkv, hd)
    v = (h @ _w(g, p + "attn_v.weight").T).reshape(T, Hkv, hd)
    if args.qk_norm:
        q = ref.rmsnorm(q, _w(g, p + "attn_q_norm.weight"), eps)
        k = ref.rmsnorm(k, _w(g, p + "attn_k_norm.weight"), eps)
    q = ref.rope(q, pos, cos, sin, n_rot, args.rope_neox)
    k = ref.rope(k, pos, cos, sin, n_rot, args.rope_neox)
    att = ref.attention(q, k, v, 0, 1.0 / np.sqrt(hd)).astype(np.float64)
    x = x + att.reshape(T, H * hd) @ _w(g, p + "attn_output.weight").T
    h = ref.rmsnorm(x, _w(g, p + "ffn_norm.weight"), eps)
    if args.is_moe:
        ffn = ref.moe_ffn(h, _w(g, p + "ffn_gate_inp.weight"), _w(g, p + "ffn_gate_exps.weight"),
                          _w(g, p + "ffn_up_exps.weight"), _w(g, p + "ffn_down_exps.weight"), args.n_experts_used,
                          args.norm_topk_prob)
    else:
        a = ref.silu_mul(h @ _w(g, p + "ffn_gate.weight").T, h @ _w(g, p + "ffn_up.weight").T)
        ffn = a.astype(np.float64) @ _w(g, p + "ffn_down.weight").T
    x = x + ffn
    return ref.rmsnorm(x, _w(g, "output_norm.weight"), eps)


@pytest.mark.parametrize("kind", ["dense", "moe", "qwen3", "qwen3moe"])
def test_head_at_init_is_the_base_last_layer(models, kind):
    """eh_proj = [0 | I]: the head is the base's last layer applied to hnorm(h) (RoPE convention, QK-norm, GQA,
    routing and renormalisation as the engine runs them), then shared_head_norm = output_norm."""
    g = GGUFFile(models[kind])
    args = load_model(g).args
    assert args.rope_neox == (kind.startswith("qwen3")) and args.qk_norm == kind.startswith("qwen3")
    block, qtypes = tm.base_block(g, args)
    out_norm = np.array(tm_f32(g, "output_norm.weight"))
    head = tm.build_head(torch, args, block, out_norm, 32, seed=0, emb_std=0.0, hidden_scale=2.5, qtypes=qtypes)
    # quantised FFNs are fake-quantised in the forward: the base's own (dequantised) weights are fixed points
    assert set(head.quant) == ({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"} if kind == "moe" else set())
    T = 20
    rng = np.random.default_rng(0)
    hn = rng.standard_normal((T, args.dim)).astype(np.float32) * 3
    e = rng.standard_normal((T, args.dim)).astype(np.float32)
    with torch.no_grad():
        got = head(torch.from_numpy(hn)[None], torch.from_numpy(e)[None])[0][0].numpy()
    want = _reference_head(g, args, hn, np.full(args.dim, 2.5, np.float32))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def tm_f32(g, name):
    from guild.formats.gguf import f32

    return f32(g.tensor(name))


@pytest.mark.parametrize("qtype", tm.QUANTIZABLE)
def test_fake_quant_is_gguf_rounding(qtype):
    w = np.random.default_rng(1).standard_normal((6, 96)).astype(np.float32)
    w[0, :32] = 0.0  # a zero block
    want = dequantize(quantize(w, GGMLQuantizationType[qtype]), GGMLQuantizationType[qtype]).reshape(w.shape)
    x = torch.from_numpy(w).requires_grad_()
    got = tm.fake_quant(torch, x, qtype)
    np.testing.assert_array_equal(got.detach().numpy(), want)
    got.sum().backward()  # straight-through
    np.testing.assert_array_equal(x.grad.numpy(), np.ones_like(w))


def test_fused_lm_head_ce_matches_autograd():
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((37, 16)).astype(np.float32)).requires_grad_()
    W = torch.from_numpy(rng.standard_normal((50, 16)).astype(np.float32))
    t = torch.from_numpy(rng.integers(0, 50, 37))
    loss, pred = tm._lm_head_ce(torch)(x, W, t)
    loss.backward()
    x2 = x.detach().clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(x2 @ W.T, t)
    want.backward()
    assert abs(float(loss.detach()) - float(want.detach())) < 1e-5
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert torch.equal(pred, (x2 @ W.T).argmax(-1))


# -- end to end ---------------------------------------------------------------------------------------------
def _tensors(path):
    g = GGUFFile(path)
    return g, {n: (t.shape, t.qtype.name) for n, t in g.tensors.items()}


@pytest.mark.parametrize("kind", ["moe", "qwen3"])
def test_train_writes_the_head_gguf(models, kind, tmp_path):
    out = tmp_path / "head.gguf"
    s = tm.train_mtp(models[kind], out, steps=3, **TINY)
    base = GGUFFile(models[kind])
    args = load_model(base).args
    g, t = _tensors(out)
    D, H, Hkv, hd = args.dim, args.n_heads, args.n_kv_heads, args.head_dim
    ffn_q = "Q4_0" if kind == "moe" else "F16"  # the base's quant type when quantisable, else F16
    want = {
        "blk.0.nextn.eh_proj.weight": ((D, 2 * D), "F16"),
        "blk.0.nextn.enorm.weight": ((D,), "F32"),
        "blk.0.nextn.hnorm.weight": ((D,), "F32"),
        "blk.0.nextn.shared_head_norm.weight": ((D,), "F32"),
        "blk.0.attn_norm.weight": ((D,), "F32"),
        "blk.0.attn_q.weight": ((H * hd, D), "F16"),
        "blk.0.attn_k.weight": ((Hkv * hd, D), "F16"),
        "blk.0.attn_v.weight": ((Hkv * hd, D), "F16"),
        "blk.0.attn_output.weight": ((D, H * hd), "F16"),
        "blk.0.ffn_norm.weight": ((D,), "F32"),
        "mtp.draft_vocab": ((args.vocab_size,), "I32"),
    }
    layers = tm.feature_layers(args.n_layers)  # fused with the final hidden by fc (EAGLE-3)
    assert layers and list(g.metadata["guild.mtp.feature_layers"]) == list(layers) == s["feature_layers"]
    want["blk.0.nextn.fc.weight"] = ((D, (1 + len(layers)) * D), "F16")
    if kind == "qwen3":
        want.update({"blk.0.attn_q_norm.weight": ((hd,), "F32"), "blk.0.attn_k_norm.weight": ((hd,), "F32"),
                     "blk.0.ffn_gate.weight": ((args.ffn_dim, D), ffn_q),
                     "blk.0.ffn_up.weight": ((args.ffn_dim, D), ffn_q),
                     "blk.0.ffn_down.weight": ((D, args.ffn_dim), ffn_q)})
    else:
        E, F = args.n_experts, args.ffn_dim
        want.update({"blk.0.ffn_gate_inp.weight": ((E, D), "F32"),
                     "blk.0.ffn_gate_exps.weight": ((E, F, D), ffn_q),
                     "blk.0.ffn_up_exps.weight": ((E, F, D), ffn_q),
                     "blk.0.ffn_down_exps.weight": ((E, D, F), ffn_q)})
    assert t == want
    md = g.metadata
    assert md["general.architecture"] == "guild-mtp"
    assert md["guild.mtp.base_architecture"] == args.arch
    assert md["guild.mtp.base_digest"] == base.identity_digest() == s["base_digest"]
    assert md["guild.mtp.base_name"] == models[kind].name
    assert md["guild.mtp.ffn"] == ("moe" if kind == "moe" else "dense")
    assert "standard library" in md["guild.mtp.train.sources"] and "generations" in md["guild.mtp.train.sources"]
    assert md["guild.mtp.train.rows"] == s["rows"] > 0 and md["guild.mtp.train.steps"] == 3
    assert md["guild.mtp.train.heldout_acceptance"] == pytest.approx(s["heldout_acceptance"], abs=1e-6)
    assert 0.0 <= s["heldout_acceptance"] <= 1.0 and s["heldout_rows"] > 0
    assert md["guild.mtp.train.seconds"] > 0
    d2 = s["heldout_acceptance_d2"]  # None when no held-out chain got past its first draft (3 steps)
    assert md["guild.mtp.train.depth"] == s["depth"] == 2 and (d2 is None or 0.0 <= d2 <= 1.0)
    # the draft vocabulary: a permutation of the vocabulary, most frequent targets first
    dv = np.asarray(g.tensors["mtp.draft_vocab"].data)
    assert sorted(dv.tolist()) == list(range(args.vocab_size))
    # the quantised tensors are the trained ones: the held-out figure of the file equals the float one (QAT)
    assert s["heldout_acceptance"] == pytest.approx(s["heldout_acceptance_float"], abs=0.02)
    assert set(s["phases"]) >= {"load", "data_text", "data_gen", "train", "export"}


def test_loss_decreases(models, tmp_path):
    s = tm.train_mtp(models["dense"], tmp_path / "h.gguf", steps=30, **TINY)
    losses = [h[1] for h in s["history"]]
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    assert s["heldout_loss"] < s["heldout_loss_step0"]


def test_resume_continues_to_the_same_parameters(models, tmp_path):
    kw = dict(steps=6, ckpt_every=2, **TINY)
    full = tm.train_mtp(models["moe"], tmp_path / "a.gguf", **kw)
    part = tm.train_mtp(models["moe"], tmp_path / "b.gguf", stop_after=3, **kw)
    assert part["stopped_at"] == 3 and not (tmp_path / "b.gguf").exists()
    st = torch.load(tmp_path / "b.gguf.ckpt" / "state.pt", weights_only=False)
    assert st["step"] == 3
    rest = tm.train_mtp(models["moe"], tmp_path / "b.gguf", **kw)
    assert [h[0] for h in rest["history"]] == list(range(6))
    assert rest["history"] == full["history"]
    a = torch.load(tmp_path / "a.gguf.ckpt" / "state.pt", weights_only=False)["params"]
    b = torch.load(tmp_path / "b.gguf.ckpt" / "state.pt", weights_only=False)["params"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ga, gb = GGUFFile(tmp_path / "a.gguf"), GGUFFile(tmp_path / "b.gguf")
    for n, t in ga.tensors.items():
        np.testing.assert_array_equal(np.asarray(t.data), np.asarray(gb.tensors[n].data))
    # --no-resume starts over (teacher data included)
    again = tm.train_mtp(models["moe"], tmp_path / "b.gguf", resume=False, stop_after=1, **kw)
    assert again["stopped_at"] == 1


def test_errors(models, tmp_path, monkeypatch):
    with pytest.raises(tm.TrainMtpError, match="--steps"):
        tm.train_mtp(models["dense"], tmp_path / "h.gguf", steps=0)
    with pytest.raises(tm.TrainMtpError, match="--seq-len"):
        tm.train_mtp(models["dense"], tmp_path / "h.gguf", seq_len=4)
    with pytest.raises(tm.TrainMtpError, match="does not exist"):
        tm.train_mtp(models["dense"], tmp_path / "nope" / "h.gguf", steps=1)
    with pytest.raises(ModelNotFoundError):
        tm.train_mtp(tmp_path / "missing.gguf", tmp_path / "h.gguf", steps=1, progress=False)
    hybrid = write_tiny_hybrid(tmp_path / "hybrid.gguf")
    with pytest.raises(UnsupportedArchitectureError, match="architectures llama, qwen3, qwen3moe, not 'qwen35moe'"):
        tm.train_mtp(hybrid, tmp_path / "h.gguf", steps=1, progress=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    with pytest.raises(GuildError, match=r"train-mtp needs torch: pip install 'guild\[train\]'"):
        tm.train_mtp(models["dense"], tmp_path / "h.gguf", steps=1, progress=False)


def test_cli(models, tmp_path):
    # the command's defaults are the library's
    import inspect
    import json

    from typer.testing import CliRunner

    from guild.cli import app
    from guild.cli.commands.train_mtp import command as cmd
    defaults = {k: v.default.default for k, v in inspect.signature(cmd).parameters.items() if k != "model"}
    assert (defaults["steps"], defaults["text_tokens"], defaults["gen_tokens"], defaults["seq_len"],
            defaults["batch"], defaults["lr"], defaults["seed"], defaults["depth"]) == (
        tm.DEFAULT_STEPS, tm.DEFAULT_TEXT_TOKENS, tm.DEFAULT_GEN_TOKENS, tm.DEFAULT_SEQ_LEN, tm.DEFAULT_BATCH,
        tm.DEFAULT_LR, tm.DEFAULT_SEED, tm.DEFAULT_DEPTH)
    r = CliRunner().invoke(app, ["train-mtp", "--help"])
    assert r.exit_code == 0 and "standard library" in r.output and "hour" in r.output
    out = tmp_path / "h.gguf"
    args = ["train-mtp", str(models["dense"]), "-o", str(out), "--steps", "2", "--text-tokens", "400",
            "--gen-tokens", "60", "--seq-len", "32", "--batch", "2", "-t", "1", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["output"] == str(out) and out.is_file() and "history" not in s
    r = CliRunner().invoke(app, ["train-mtp", str(models["dense"]), "-o", str(out), "--steps", "0"])
    assert r.exit_code == 1 and "--steps must be" in r.output and "Traceback" not in r.output
