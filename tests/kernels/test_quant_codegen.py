"""kernels/cpu/quant_gen.py is generated from the records' fp32 codecs (kernels/quant_types.py, kernels/cpu/codecs.py)
by kernels/cpu/gen_quant.py: the committed file must be exactly what the generator writes today (run
`python -m guild.kernels.cpu.gen_quant`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from guild.kernels.cpu import codecs, gen_quant, quant_gen
from guild.kernels.quant_types import QUANT_TYPES


def test_generated_kernels_are_current():
    assert Path(quant_gen.__file__).read_text() == gen_quant.source()


def test_codec_table_is_consistent():
    """Every codec's canonical order is a permutation of its block (its byte fields: the record checks them)."""
    for t in QUANT_TYPES.values():
        if t.f32 is not None:
            order = codecs.canonical_order(t.f32, t.f32_unit)
            assert np.array_equal(np.sort(order), np.arange(t.f32_block)), t.qtype.name
