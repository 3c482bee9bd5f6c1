"""Matrices sharing an input, fused into one packed matrix when their quant types agree: Linear for the CPU
kernels (what a CPU model holds), DeviceLinear packed by a device backend (its twin, guild.engine.gpu)."""

from __future__ import annotations

import numpy as np

from ...formats.repack_cache import pack
from ...kernels.cpu.quant import LinearTable, matmul


def fuse(tensors, pack) -> tuple[int, int, list]:
    """(n_out, n_in, packed parts): one packed matrix when the quant types agree, else one per tensor. `pack` is
    the packer of the device that will hold them."""
    n_out, n_in = sum(t.shape[0] for t in tensors), tensors[0].shape[1]
    if len({t.qtype for t in tensors}) == 1:
        if len(tensors) == 1:
            raw = tensors[0].data
        elif getattr(pack, "accepts_parts", False):  # concatenated only if repacked (not when read from a cache)
            raw = tuple(t.data for t in tensors)
        else:
            raw = np.concatenate([t.data for t in tensors], axis=0)
        return n_out, n_in, [pack(tensors[0].qtype, raw, n_out, n_in)]
    return n_out, n_in, [pack(t.qtype, t.data, t.shape[0], t.shape[1]) for t in tensors]


class Linear:
    """One or more weight matrices sharing an input, fused into one packed matrix when their quant types agree.

    Output columns are the parts' outputs side by side (e.g. [q | k | v]).
    """

    def __init__(self, tensors):
        self.n_out, self.n_in, self.parts = fuse(tensors, pack)
        self.tensors = tuple(tensors)  # the GGUF tensors, for a device twin (guild.engine.gpu)

    @property
    def table(self) -> LinearTable:
        """The parts as addresses for the compiled decode row (kernels/cpu/quant.linear_rows), built once."""
        t = self.__dict__.get("_table")
        if t is None:
            t = self._table = LinearTable(self.parts)
        return t

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], self.n_out), np.float32)
        if len(self.parts) == 1:
            matmul(self.parts[0], x, out)
            return out
        off = 0
        for p in self.parts:
            tmp = np.empty((x.shape[0], p.n_rows), np.float32)
            matmul(p, x, tmp)
            out[:, off : off + p.n_rows] = tmp
            off += p.n_rows
        return out


class DeviceLinear:
    """A Linear's matrices packed by a device backend's `pack` (same fusion), for its matmul."""

    def __init__(self, tensors, pack):
        self.n_out, self.n_in, self.parts = fuse(tensors, pack)
        self.nbytes = sum(p.nbytes for p in self.parts)

    @property
    def n_rows(self) -> int:  # as a PackedMatrix (output features)
        return self.n_out
