"""Seeds and mutators for the fuzzer: GGUF models (header, metadata, tensor index, weights), .gexec plans
(unsealed and resealed) and chat templates, plus prompts and conversation files. Every case is a pure function
of (category, case number): a failure found in CI is replayed by its number (`python -m tests.fuzz --replay`)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np

from . import gguf_io as gi

U64 = 2**64
BOUNDARY_INTS = [0, 1, -1, 2, 3, 7, 255, 2**15, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63,
                 U64 - 1, U64 - 32, 100_000, 10**9]
BOUNDARY_FLOATS = [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, -1e-5, 1e-45, 1e30, 1e308, 3.4e38, 1.0]
# ggml type ids (ggml.h enum ggml_type): the supported ones, unsupported real ones, and nonsense
QTYPES = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30, 4, 5, 9, 16, 29, 31, 39, 40, 1000, 2**31]
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 3: (32, 20), 6: (32, 22), 12: (256, 144),
         13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136)}
SCALE_OFF = {8: 0, 2: 0, 3: 0, 6: 0, 12: 0, 13: 0, 14: 208, 20: 0, 23: 0}  # f16 `d` of a block


# ------------------------------------------------------------------------------------------------ GGUF seeds
def write_seeds(d: Path) -> dict[str, Path]:
    """The tiny models every GGUF case mutates (written once per worker; same bytes on every machine)."""
    from guild.tools.tiny import write_tiny_model, write_tiny_mtp_head
    from guild.tools.tiny_hybrid import write_tiny_hybrid

    d.mkdir(parents=True, exist_ok=True)
    s = {
        "llama": write_tiny_model(d / "llama.gguf", n_layers=1, dim=64, ffn=96, qtype="Q8_0", context=64),
        "llama_moe": write_tiny_model(d / "llama_moe.gguf", n_layers=1, n_experts=4, top_k=2, qtype="Q4_0",
                                      context=64),
        "qwen3": write_tiny_model(d / "qwen3.gguf", "qwen3", n_layers=1, qtype="F16", context=64),
        "qwen3moe": write_tiny_model(d / "qwen3moe.gguf", "qwen3moe", n_layers=1, dim=256, ffn=256, n_experts=4,
                                     top_k=2, qtype="Q4_K", context=64),
        "qwen35moe": write_tiny_hybrid(d / "qwen35moe.gguf", "qwen35moe", n_layers=2, full_attention_interval=2,
                                       n_experts=4, context=64),
        "qwen3next": write_tiny_hybrid(d / "qwen3next.gguf", "qwen3next", n_layers=2, full_attention_interval=2,
                                       n_experts=4, shared_ffn=64, qtype="Q8_0", context=64),
    }
    s["mtp"] = write_tiny_mtp_head(s["llama"], d / "llama.mtp.gguf", draft_vocab=64)
    return s


GGUF_SEEDS = ("llama", "llama_moe", "qwen3", "qwen3moe", "qwen35moe", "qwen3next", "mtp")


def _num_kv(g: gi.Gguf, rng) -> int | None:
    idx = [i for i, (_, t, _) in enumerate(g.kv) if t not in (gi.STR, gi.ARR)]
    model = [i for i in idx if not g.kv[i][0].startswith(b"tokenizer.")]
    pool = model if model and rng.random() < 0.85 else idx
    return int(rng.choice(pool)) if pool else None


def _m_int(g, rng):
    i = _num_kv(g, rng)
    if i is None:
        return
    k, t, v = g.kv[i]
    if t in (gi.F32, gi.F64):
        g.kv[i] = (k, t, float(rng.choice(BOUNDARY_FLOATS)))
    else:
        choice = rng.random()
        nv = int(rng.choice(BOUNDARY_INTS)) if choice < 0.6 else int(v) + int(rng.integers(-3, 4))
        g.kv[i] = (k, gi.U64 if rng.random() < 0.3 else t, nv)


def _m_float(g, rng):
    keys = [i for i, (k, t, _) in enumerate(g.kv) if t in (gi.F32, gi.F64)]
    if keys:
        i = int(rng.choice(keys))
        k, t, _ = g.kv[i]
        g.kv[i] = (k, t, float(rng.choice(BOUNDARY_FLOATS)))


def _m_type(g, rng):
    """A value of another type under a known key: string for int, nested array, bool, float."""
    i = int(rng.integers(len(g.kv)))
    k, t, v = g.kv[i]
    r = rng.integers(6)
    if r == 0:
        g.kv[i] = (k, gi.STR, b"\xff\xfe" + b"x" * int(rng.integers(0, 8)))
    elif r == 1:
        g.kv[i] = (k, gi.ARR, (gi.ARR, [(gi.U32, [1, 2]), (gi.ARR, [(gi.U8, [3])])]))
    elif r == 2:
        g.kv[i] = (k, gi.F64, float(rng.choice(BOUNDARY_FLOATS)))
    elif r == 3:
        g.kv[i] = (k, gi.BOOL, 1)
    elif r == 4:
        g.kv[i] = (k, gi.ARR, (gi.I32, [int(x) for x in rng.integers(-5, 5, size=3)]))
    else:
        g.kv[i] = (k, int(rng.choice([13, 99, 2**31])), 0)


def _m_drop_kv(g, rng):
    if g.kv:
        del g.kv[int(rng.integers(len(g.kv)))]


def _m_dup_kv(g, rng):
    if g.kv:
        g.kv.append(g.kv[int(rng.integers(len(g.kv)))])


def _m_tokens(g, rng):
    """Token list / ids: empty, shorter than the vocab, ids past the end, a huge array count."""
    r = rng.integers(4)
    if r == 0:
        tv = g.get("tokenizer.ggml.tokens")
        if tv:
            sub, items = tv[1]
            g.set("tokenizer.ggml.tokens", gi.ARR, (sub, items[: int(rng.integers(0, len(items)))]))
    elif r == 1:
        g.set("tokenizer.ggml.eos_token_id", gi.U32, int(rng.choice([2**32 - 1, 100000, 10**6])))
    elif r == 2:
        g.set("tokenizer.chat_template", gi.STR, b"{% for m in messages %}{{ m.content }}{% endfor %}\xff")
    else:
        g.set("tokenizer.ggml.model", gi.STR, rng.choice([b"bert", b"", b"llama"]))


def _tensor(g, rng, want=None):
    pool = [t for t in g.tensors if want is None or want in t.name.decode(errors="replace")] or g.tensors
    return pool[int(rng.integers(len(pool)))] if pool else None


def _m_dims(g, rng):
    t = _tensor(g, rng, rng.choice([None, "norm", "attn", "exps", "ssm"]))
    if t is None:
        return
    r = rng.integers(7)
    if r == 0 and t.dims:
        j = int(rng.integers(len(t.dims)))
        t.dims[j] = int(rng.choice([0, 1, t.dims[j] - 1, t.dims[j] + 1, t.dims[j] * 2, 2**32, 2**62, U64 - 1]))
    elif r == 1:
        t.dims = t.dims[::-1]
    elif r == 2:
        t.dims = [*t.dims, int(rng.choice([1, 2, 3]))]
    elif r == 3 and len(t.dims) > 1:
        t.dims = t.dims[:-1]
    elif r == 4:
        t.dims = [int(np.prod(t.dims))]
    elif r == 5:
        t.dims = [1] * int(rng.choice([5, 9, 2**20]))
    else:
        t.dims = [d // 2 if d > 1 else d for d in t.dims]


def _m_swap(g, rng):
    """Two tensors trade names (e.g. attn_q / attn_v): their shapes no longer fit their roles."""
    if len(g.tensors) > 1:
        a, b = rng.choice(len(g.tensors), 2, replace=False)
        g.tensors[a].name, g.tensors[b].name = g.tensors[b].name, g.tensors[a].name


def _m_qtype(g, rng):
    t = _tensor(g, rng)
    if t is not None:
        t.qtype = int(rng.choice(QTYPES))


def _m_offset(g, rng):
    t = _tensor(g, rng)
    if t is None:
        return
    r = rng.integers(6)
    if r == 0:
        t.offset = U64 - 32
    elif r == 1:
        t.offset += int(rng.integers(1, 32))
    elif r == 2:
        t.offset = g.tensors[int(rng.integers(len(g.tensors)))].offset  # aliased
    elif r == 3:
        t.offset = len(g.data) + int(rng.choice([0, 32, 2**20]))
    elif r == 4:
        t.offset = max(0, len(g.data) - 32)
    else:
        t.offset = int(rng.choice([2**31, 2**32, 2**63]))


def _m_drop_tensor(g, rng):
    if g.tensors:
        del g.tensors[int(rng.integers(len(g.tensors)))]


def _m_dup_tensor(g, rng):
    t = _tensor(g, rng)
    if t is not None:
        g.tensors.append(gi.TensorInfo(t.name, list(t.dims), t.qtype, t.offset))


def _m_nan(g, rng):
    """A NaN/inf weight or block scale in the data (F32/F16 element, or a block's f16 `d`)."""
    t = _tensor(g, rng, rng.choice([None, "norm", "output", "exps", "token_embd"]))
    if t is None or t.qtype not in BLOCK or not t.dims:
        return
    bs, nb = BLOCK[t.qtype]
    n = int(np.prod(t.dims))
    nbytes = n // bs * nb
    if t.offset + nbytes > len(g.data) or nbytes == 0:
        return
    data = bytearray(g.data)
    bad = rng.choice([float("nan"), float("inf"), -float("inf"), 6e4])
    j = int(rng.integers(n // bs))
    if t.qtype == 0:
        struct.pack_into("<f", data, t.offset + 4 * j, bad)
    elif t.qtype == 30:  # bf16: the high half of the f32
        data[t.offset + 2 * j : t.offset + 2 * j + 2] = struct.pack("<f", bad)[2:]
    else:
        off = t.offset + j * nb + (0 if t.qtype == 1 else SCALE_OFF.get(t.qtype, 0))
        data[off : off + 2] = np.float16(bad).tobytes()
    g.data = bytes(data)


def _m_header(g, rng):
    r = rng.integers(5)
    if r == 0:
        g.version = int(rng.choice([0, 1, 2, 4, 2**32 - 1]))
    elif r == 1:
        g.n_tensors = len(g.tensors) + int(rng.choice([-1, 1, 2**40, U64 - 1]))
    elif r == 2:
        g.n_kv = len(g.kv) + int(rng.choice([-1, 1, 2**40, U64 - 1]))
    elif r == 3:
        g.magic = rng.choice([b"GGUF", b"GGML", b"FUGG", b"\0\0\0\0"])
    else:
        g.alignment = int(rng.choice([1, 7, 64, 4096]))
        g.set("general.alignment", gi.U32, int(rng.choice([0, 1, 7, 64, 2**31])))


def _m_arch(g, rng):
    g.set("general.architecture", gi.STR, rng.choice([b"llama", b"qwen3", b"qwen3moe", b"qwen3next", b"qwen35moe",
                                                      b"gpt2", b"", b"llama\0"]))


MODEL_MUTATORS = [(_m_int, 8), (_m_float, 3), (_m_type, 2), (_m_drop_kv, 2), (_m_dup_kv, 1), (_m_tokens, 1),
                  (_m_dims, 5), (_m_swap, 2), (_m_qtype, 2), (_m_offset, 3), (_m_drop_tensor, 2),
                  (_m_dup_tensor, 1), (_m_nan, 4), (_m_header, 1), (_m_arch, 1)]
_MW = np.array([w for _, w in MODEL_MUTATORS], float)
_MW /= _MW.sum()


def mutate_gguf(seed_bytes: bytes, rng: np.random.Generator) -> bytes:
    g = gi.parse(seed_bytes)
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        MODEL_MUTATORS[int(rng.choice(len(MODEL_MUTATORS), p=_MW))][0](g, rng)
    out = gi.serialize(g)
    r = rng.random()
    if r < 0.05:  # truncated file
        out = out[: int(rng.integers(0, len(out)))]
    elif r < 0.10:  # a few flipped bytes in the header region
        b = bytearray(out)
        hdr = len(out) - len(g.data)
        for _ in range(int(rng.integers(1, 6))):
            j = int(rng.integers(max(1, hdr)))
            b[j] ^= 1 << int(rng.integers(8))
        out = bytes(b)
    return out


# ------------------------------------------------------------------------------------------------ plans
def seed_plan() -> bytes:
    """A valid sealed plan of plausible figures (built directly, no calibration run)."""
    from guild.plans.plan import (
        CpuTuning,
        DraftCalibration,
        HardwareIdentity,
        Header,
        KernelTuning,
        ModelIdentity,
        Placement,
        PlacementGroup,
        Plan,
        render,
    )

    plan = Plan(
        Header("0.1.0", "2026-01-01T00:00:00Z", "quick", 256, 64, 0),
        HardwareIdentity("Fuzz CPU", ("avx2", "fma"), 2, 2, 1, None),
        ModelIdentity("ab" * 32, "llama", 2, 4, 2, "tiny.gguf"),
        Placement(None, 0, 256, (PlacementGroup("attention", "cpu", 8, 4096, 0),
                                 PlacementGroup("routed_experts", "cpu", 6, 8192, 0)), "cpu only"),
        CpuTuning(2, 10.5, (KernelTuning("Q8_0", "rows", ("rows", "cols"), "experts", 6, 6, (1, 2), (0.2, 0.15),
                                         2, 3.5),)),
        DraftCalibration(256, 200, 3, tuple(1.0 + 0.1 * i for i in range(8)), tuple(0.5 + 0.05 * i for i in range(8)),
                         tuple(2.0 + i for i in range(8)), tuple(1.0 + 0.5 * i for i in range(8)),
                         {"lookup": 0.01, "retrieval": 0.02, "mtp": 0.4}, 0.003, 0.05, 300.0, {"mtp": 0.2}, "", True),
    )
    return render(plan)


def _reseal(body: bytes) -> bytes:
    return body + f"seal: {hashlib.sha256(body).hexdigest()}\n".encode()


HOSTILE_YAML = [
    "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n",
    "x: " + "[" * 5000 + "]" * 5000 + "\n",
    "x: !!python/object/apply:os.system ['true']\n",
    "x: !!binary aGVsbG8=\n",
    "x: !!set {a, b}\n",
    "x: 2026-01-01\n",
    "x: !!timestamp 2026-01-01T00:00:00Z\n",
    "x: &a [*a]\n",
    "x: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
]
PLAN_VALUES = [2**63, -1, 1e30, float("nan"), float("inf"), "blk.0.attn_q.weight", None, [], {}, True, "", 0,
               [1, 2], 10**100, -1e-9, "x" * 300, {"a": 1}]


def _walk(d, rng, depth=0):
    """A random (container, key) leaf of a parsed plan."""
    keys = list(d.keys()) if isinstance(d, dict) else list(range(len(d)))
    if not keys:
        return None
    k = keys[int(rng.integers(len(keys)))]
    v = d[k]
    if isinstance(v, (dict, list)) and v and (depth < 1 or rng.random() < 0.7):
        return _walk(v, rng, depth + 1) or (d, k)
    return d, k


def mutate_plan(seed: bytes, rng: np.random.Generator) -> bytes:
    import yaml

    from guild.plans.plan import SECTIONS, section_digest

    r = rng.random()
    if r < 0.15:  # unsealed edits: byte flips / splices anywhere (must all be seal errors)
        b = bytearray(seed)
        for _ in range(int(rng.integers(1, 4))):
            j = int(rng.integers(len(b)))
            if rng.random() < 0.5:
                b[j] = int(rng.integers(256))
            else:
                del b[j : j + int(rng.integers(1, 40))]
        return bytes(b)
    body = seed[: seed.rfind(b"seal: ")]
    if r < 0.35:  # resealed text: hostile YAML inside an undigested part, a new top-level key
        text = body.decode()
        snippet = HOSTILE_YAML[int(rng.integers(len(HOSTILE_YAML)))]
        if rng.random() < 0.5:
            text += snippet
        else:
            key = rng.choice(["header", "hardware", "model"])
            text = text.replace(f"\n{key}:\n", f"\n{key}:\n  extra: 1\n", 1)
            text += snippet.replace("x:", "zz:", 1)
        return _reseal(text.encode())
    d = yaml.safe_load(seed)
    d.pop("seal", None)
    for _ in range(int(rng.integers(1, 3))):
        sec = rng.choice(["header", "hardware", "model", *SECTIONS, *SECTIONS, *SECTIONS])
        hit = _walk(d[sec], rng)
        if hit is None:
            continue
        c, k = hit
        if rng.random() < 0.1 and isinstance(c, dict):
            del c[k]
        else:
            v = PLAN_VALUES[int(rng.integers(len(PLAN_VALUES)))]
            c[k] = v
        if sec in SECTIONS and rng.random() < 0.9:  # resealed: digest recomputed (an edit that tries to pass)
            try:
                d[sec]["sha256"] = section_digest(d[sec])
            except ValueError:  # NaN/inf are not JSON: the canonical form refuses them; write the YAML anyway
                pass
    text = "# fuzz\n" + yaml.safe_dump(d, sort_keys=False, allow_unicode=True, width=120)
    return _reseal(text.encode())


# ------------------------------------------------------------------------------------------------ chat templates
BASE_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
HOSTILE_TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'x' * 3000000000 }}",
    "{{ 'x' * 100000000 }}{{ 'y' * 100000000 }}",
    "{% set s = namespace(v='ab') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v|length }}",
    "{% macro f(n) %}{{ n }}\n{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ raise_exception('no system role') }}",
    "{{ messages[99]['content'] }}",
    "{{ messages[0].content.foo.bar }}",
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ 10 ** 10 ** 10 }}",
    "{{ 2 ** 100000 }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:>9999999999}'.format(1) }}",
    "{{ 'x'|center(3000000000) }}",
    "{{ 'x'|indent(1000000000) }}",
    "{{ messages|tojson(indent=100000000) }}",
    "{{ range(10000000)|list|length }}",
    "{{ lipsum(1000000) }}",
    "{{ strftime_now('%Y' * 10000000) }}",
    "{{ strftime_now(None) }}",
    "{% set x = [] %}{% for i in range(100000) %}{{ x.append(i) }}{% endfor %}",
    "{{ messages|map(attribute='content')|join('x' * 100000000) }}",
    "{% for i in range(99999) %}{{ messages|tojson }}{% endfor %}",
    "{{ ('x' * 1000)|wordwrap(1) * 1000 }}",
    "{{ '\\udcff' }}",
    "{% if %}",
    "{{ x.y.z }}",
    "{{ (messages * 100000000)|length }}",
    "{{ [0] * 1000000000 }}",
    "{% include 'other' %}",
    "{% import 'x' as y %}",
    "{{ self._TemplateReference__context }}",
    "{{ config }}{{ request }}",
    "{{ messages.pop() }}",
    "{{ 'a'.ljust(1000000000) }}",
    "{{ '{0.__class__}'.format(1) }}",
    "{{ 9999999999999999999999999 * 'x' }}",
    "{{ range(-1)|first }}",
    "{{ 'x'|truncate(-1) }}",
]
TEMPLATE_TOKENS = ["{{", "}}", "{%", "%}", "{#", "#}", "for", "in", "endfor", "if", "endif", "messages", "loop",
                   "'", '"', "(", ")", "[", "]", "|", "~", "*", "**", "range(", "9" * 12, "message", ".",
                   "raise_exception(",
                   "set", "=", "macro", "endmacro", "recursive", "namespace(", "\\", "\x00", "\udcff", "-"]


def mutate_template(rng: np.random.Generator) -> str:
    r = rng.random()
    if r < 0.5:
        t = HOSTILE_TEMPLATES[int(rng.integers(len(HOSTILE_TEMPLATES)))]
        return BASE_TEMPLATE + t if rng.random() < 0.5 else t
    s = list(BASE_TEMPLATE)
    for _ in range(int(rng.integers(1, 6))):
        j = int(rng.integers(len(s) + 1))
        if rng.random() < 0.5:
            s.insert(j, TEMPLATE_TOKENS[int(rng.integers(len(TEMPLATE_TOKENS)))])
        else:
            del s[j : j + int(rng.integers(1, 8))]
    return "".join(s)


# ------------------------------------------------------------------------------------------------ inputs
def make_input(rng: np.random.Generator) -> tuple[str, bytes | int]:
    """(kind, payload): a prompt as argv would carry it (bytes), a conversation file's bytes, or the size of a
    sparse all-zero conversation file (a file that never ends, like /dev/zero, without the disk)."""
    r = rng.random()
    if r < 0.35:
        n = int(rng.choice([0, 1, 5, 100, 5000]))
        b = bytes(rng.integers(0, 256, size=n, dtype=np.uint8))
        if rng.random() < 0.5:
            b = "héllo wörld ".encode() * 3 + b
        return "prompt", b
    if r < 0.45:
        return "zeros", int(rng.choice([2**20, 2**31, 2**34]))
    docs = [b'["hi", "there"]', b"- role: user\n  content: hello\n", b'[{"role": "user", "content": "\xff\xfe"}]',
            b"- \xff\xfe\n", b"", b"{}", b"- [1, 2]\n", b"- !!binary aGVsbG8=\n", b"- 2026-01-01\n",
            HOSTILE_YAML[0].encode(), b"[" * 100000 + b"]" * 100000, ("- " + "x" * 100 + "\n").encode() * 100,
            b'- role: user\n  content: !!python/object/apply:os.system ["true"]\n', b"\x00\x01\x02"]
    b = docs[int(rng.integers(len(docs)))]
    if rng.random() < 0.3 and b:
        ba = bytearray(b)
        ba[int(rng.integers(len(ba)))] = int(rng.integers(256))
        b = bytes(ba)
    return "conversation", b
