"""kernels/cpu/quant_gen.py is generated from the codec table (kernels/cpu/codecs.py) by kernels/cpu/gen_quant.py:
the committed file must be exactly what the generator writes today (run `python -m guild.kernels.cpu.gen_quant`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from guild.kernels import blocks
from guild.kernels.cpu import codecs, gen_quant, quant_gen


def test_generated_kernels_are_current():
    assert Path(quant_gen.__file__).read_text() == gen_quant.source()


def test_codec_table_is_consistent():
    """Every codec's canonical order is a permutation of its block, and its byte fields lie inside the block."""
    for c in codecs.CODECS:
        order = codecs.canonical_order(c)
        assert np.array_equal(np.sort(order), np.arange(c.block)), c.qtype.name
        if not c.padded:
            spans = [f[3] for f in c.fields if not callable(f[3])]
            assert max(hi for _, hi in spans) <= blocks.BLOCK[c.qtype][1], c.qtype.name


def test_block_sizes_match_gguf():
    """kernels/blocks.py's (elements, bytes) per block agree with gguf's GGML_QUANT_SIZES for every type."""
    from gguf.constants import GGML_QUANT_SIZES

    for qt, size in blocks.BLOCK.items():
        assert size == GGML_QUANT_SIZES[qt], qt.name
    assert {c.qtype for c in codecs.CODECS} == set(blocks.BLOCK)
