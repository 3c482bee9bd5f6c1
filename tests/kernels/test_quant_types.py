"""The quant-type records (kernels/quant_types.py): in agreement with gguf, validated on construction, and the one
source of the per-type tables (block facts, the CPU dispatch by (type, numerics), the int8 entry points, the GPU
kernels' names)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

from guild.kernels.cpu import qdot
from guild.kernels.cpu import quant as kq
from guild.kernels.quant_types import BLOCK, F16_SCALES, I8_ROLES, QUANT_TYPES, QuantType


def test_block_sizes_match_gguf():
    """Each record's (elements, bytes) per block agree with gguf's GGML_QUANT_SIZES."""
    for qt, size in BLOCK.items():
        assert size == GGML_QUANT_SIZES[qt], qt.name


def test_every_table_derives_from_the_records():
    assert set(BLOCK) == set(QUANT_TYPES) and set(F16_SCALES) == {q for q, t in QUANT_TYPES.items() if t.block > 1}
    assert set(kq.KINDS) == {q for q, t in QUANT_TYPES.items() if t.f32}
    assert set(qdot.KERNELS) == {q for q, t in QUANT_TYPES.items() if t.i8}
    assert set(kq._KPY) == {(q, n) for q, t in QUANT_TYPES.items() for n in t.numerics}
    for q, t in QUANT_TYPES.items():
        assert kq.numerics_for(q, "i8") == ("i8" if t.i8 else "f32") and kq.numerics_for(q, "f32") == "f32"


def test_a_packed_matrix_is_dispatched_by_type_and_numerics():
    raw = np.zeros((64, 18 * 2), np.uint8)  # Q4_0, 64 x 64, zero blocks
    for mode in kq.NUMERICS:
        with kq.numerics(mode):
            w = kq.pack(Q.Q4_0, raw, 64, 64)
        assert w.key == (Q.Q4_0, mode) and w.key in kq._KPY


@pytest.mark.parametrize("change, why", [
    (dict(f16=(17,)), "bad block facts"),
    (dict(block=0), "bad block facts"),
    (dict(f32=None), "an int8 path needs an fp32 codec"),
    (dict(i8=(("qs", "q4", np.uint8), ("qs", "h", np.uint16))), "int8 fields"),
    (dict(i8=(("qs", "q5", np.uint8),)), "int8 fields"),
    (dict(i8=(("qs", "q4", np.float32),)), "int8 fields"),
    (dict(block=64, nbytes=36, f16=(0,)), "the int8 path takes blocks of 32 or 256"),
    (dict(gpu="q4_0; rm"), "GPU kernel suffix"),
])
def test_a_bad_record_is_refused(change, why):
    t = QUANT_TYPES[Q.Q4_0]
    with pytest.raises(ValueError, match=f"Q4_0: {why}"):
        dataclasses.replace(t, **change)


def test_a_codec_field_outside_the_block_is_refused():
    t = QUANT_TYPES[Q.Q4_0]
    codec = dataclasses.replace(t.f32, fields=(("qs", "u8", (16,), (2, 19)),) + t.f32.fields[1:])
    with pytest.raises(ValueError, match="Q4_0: codec field 'qs'"):
        QuantType(Q.Q4_0, 32, 18, (0,), f32=codec)


def test_every_int8_role_has_a_shape():
    """The roles a record may give its int8 fields are the ones qdot lays out."""
    for role in I8_ROLES:
        assert qdot.types._shape(role, 1, 8)[:2] == (1, qdot.NJ), role
