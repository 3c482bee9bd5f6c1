"""Non-finite weights in a GGUF: the count of inf/NaN floats or f16 block scales in a tensor, and the ledger by
which a first load's repack checks the scales as it reads them, so that the file is read once, not twice.

The load's finite scan (models/validate.py scan_finite) reads every float tensor and every block's f16 scales.
While a repack runs (repack_cache.build), the scan leaves the quantised tensors to `ScaleLedger`: the compiled
packers count the inf/NaN scales of each part they pack (kernels.cpu.quant.pack_checked), the pack hook hands
each part's count to `packed`, and `finish` scans what no packer read (a type packed in NumPy, a tensor used
from the file's bytes). Either way a bad scale is the scan's one-line NumericsError naming the tensor."""

from __future__ import annotations

import bisect
import threading

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from numba import njit

from ..errors import NumericsError
from ..kernels.cpu import cache_lock  # noqa: F401 - its kernels' cache saves, locked across processes
from ..kernels.quant_types import F16_SCALES

# The f16 scales of each block (kernels/quant_types.py F16_SCALES). IQ1_M (its scale spread over the sub-block
# scales) and MXFP4 (an E8M0 exponent) have none and are caught at run time.
SCALE_OFFSETS = {q: offs for q, offs in F16_SCALES.items() if offs}
EXP_MASK = {Q.F32: (np.uint32, 0x7F800000), Q.F16: (np.uint16, 0x7C00), Q.BF16: (np.uint16, 0x7F80)}


@njit(cache=True, nogil=True)
def _count_exponent_ones(raw, stride, off, width, mask):
    """Fields of `width` bytes (little-endian) at raw[i * stride + off] whose exponent bits (mask) are all ones:
    inf or NaN. One pass over the mapped bytes, no copies (a 400 MB model scans in tens of milliseconds)."""
    n = 0
    for i in range(raw.size // stride):
        j = i * stride + off
        v = np.uint32(raw[j]) | (np.uint32(raw[j + 1]) << 8)
        if width == 4:
            v |= (np.uint32(raw[j + 2]) << 16) | (np.uint32(raw[j + 3]) << 24)
        if v & mask == mask:
            n += 1
    return n


def nonfinite_count(t) -> int:
    """Non-finite values among a tensor's floats (F32/F16/BF16 elements) or its blocks' f16 scales."""
    raw = np.asarray(t.data).reshape(-1).view(np.uint8)
    if t.qtype in EXP_MASK:
        typ, mask = EXP_MASK[t.qtype]
        w = np.dtype(typ).itemsize
        return int(_count_exponent_ones(raw, w, 0, w, mask))
    _, tsize = GGML_QUANT_SIZES[t.qtype]
    return sum(int(_count_exponent_ones(raw, tsize, o, 2, 0x7C00)) for o in SCALE_OFFSETS.get(t.qtype, ()))


def nonfinite_error(path, name: str, t, n: int) -> NumericsError:
    what = "values" if t.qtype in EXP_MASK else "block scales"
    return NumericsError(f"{path}: tensor '{name}' has {n} non-finite (NaN/inf) {what}")


class ScaleLedger:
    """The quantised tensors of g whose scales a repack checks (`defer`), which byte ranges of them its packers
    read (`packed`, from the writer's threads), and `finish`: the rest scanned, g marked checked."""

    def __init__(self, g):
        self.g = g
        spans = sorted((t.data.__array_interface__["data"][0], t.data.nbytes, n) for n, t in g.tensors.items())
        self._starts = [s for s, _, _ in spans]
        self._spans = spans
        self._read: dict[str, list] = {}  # deferred tensor → (start, end) addresses its packers read
        self._lock = threading.Lock()

    def defer(self, name: str) -> None:
        self._read.setdefault(name, [])

    def _tensor(self, part) -> tuple | None:
        a = np.asarray(part)
        at = a.__array_interface__["data"][0]
        i = bisect.bisect_right(self._starts, at) - 1
        if i >= 0 and at + a.nbytes <= self._starts[i] + self._spans[i][1]:
            return self._spans[i][2], at, at + a.nbytes
        return None  # not a view of the file (a copy the model made): its tensor is scanned by `finish`

    def packed(self, parts, bad) -> None:
        """Parts of one matrix packed, with the count of inf/NaN scales each held (kernels.cpu.quant.pack_checked;
        None: not counted). A bad scale raises the scan's error, counted over the whole tensor."""
        if bad is None:
            return
        for p, n in zip(parts, bad, strict=True):
            hit = self._tensor(p)
            if hit is None:
                continue
            name, lo, hi = hit
            if n:
                t = self.g.tensors[name]
                raise nonfinite_error(self.g.path, name, t, nonfinite_count(t))
            with self._lock:
                if name in self._read:
                    self._read[name].append((lo, hi))

    def finish(self) -> None:
        """Scan the deferred tensors that the packers did not read whole; then g's values are all checked."""
        for name, read in self._read.items():
            t = self.g.tensors[name]
            lo = t.data.__array_interface__["data"][0]
            for a, b in sorted(read):
                if a > lo:
                    break
                lo = max(lo, b)
            if lo < t.data.__array_interface__["data"][0] + t.data.nbytes:
                n = nonfinite_count(t)
                if n:
                    raise nonfinite_error(self.g.path, name, t, n)
        self.g.finite_checked = True
