"""Where a model's parts run (Layout: a backend per layer, the embedding and the output head) and the only
transfers between backends: staged window metadata, residual rows, MoE rows and final hidden rows (DeviceRows)."""

from __future__ import annotations

import numba
import numpy as np

from ...kernels.cpu.decode_row import attention_half, ffn_half
from ...kernels.cpu.moe import experts_ffn, moe_ffn, moe_residual_row
from ...kernels.cpu.ops.gqa import MARKS, row_mode
from .clock import KernelClock, clocked
from .host import HOST
from .protocol import TimedBackend

_NO_NORM = np.zeros(0, np.float32)  # attention_row's QK-norm weights where a model has none
_ALIGN = 256  # staging buffer sections start on this many bytes


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Staging:
    """A growable host buffer (pinned on a GPU) and, if `with_dev`, its device twin; reused across windows.
    Reuse is safe: every window ends waiting for the stream, and within a window each reuse comes after a
    wait that orders it behind the previous use."""

    def __init__(self, with_dev: bool = True):
        self.with_dev = with_dev
        self.dev = self.host = None
        self.size = 0

    def get(self, be, nbytes: int):
        if nbytes > self.size:
            self.size = max(nbytes, 2 * self.size)
            self.dev = be.empty((self.size,), np.uint8) if self.with_dev and be.device else None
            self.host = be.pinned(self.size)
        return self.dev, self.host


class Layout:
    """Where a model's parts run: a backend per layer, for the embedding lookup and for the output head (the
    final norm and LM head), rope tables per backend, and the staging buffers of the transfers between them.
    A CPU model's layout is HOST everywhere (`Layout.host`) and moves nothing; guild.engine.gpu builds a
    device layout from a placement. Transfers happen only here: the window's indices (one H2D per device),
    the residual rows at a placement boundary, the MoE rows to the CPU experts and back, the logits, and the
    final hidden rows when a consumer reads them (DeviceRows)."""

    def __init__(self, layer_be, embed_be, out_be, rope: dict, head_be=None):
        self.layer_be = list(layer_be)
        self.embed_be, self.out_be = embed_be, out_be
        self.head_be = head_be or out_be  # where an MTP head's block, norms and draft LM head run
        self.rope = rope  # backend name -> (cos, sin)
        seen = {}
        for be in (*self.layer_be, embed_be, out_be, self.head_be):
            if be.device:
                seen.setdefault(id(be), be)
        self.devices = list(seen.values())
        self._stage: dict = {}

    @classmethod
    def host(cls, n_layers: int, cos, sin) -> Layout:
        return cls([HOST] * n_layers, HOST, HOST, {HOST.name: (cos, sin)})

    def set_rope(self, cos, sin) -> None:
        """New rope tables on every backend that holds them, in place: an MTP head's layout shares the dict."""
        bes = {be.name: be for be in (*self.layer_be, self.embed_be, self.out_be, self.head_be)}
        for name in list(self.rope):
            with bes[name].activate():
                self.rope[name] = (bes[name].upload(cos), bes[name].upload(sin))

    def timed(self, clock: KernelClock) -> Layout:
        """This layout with each of its backends wrapped once in a TimedBackend on clock."""
        wrapped: dict[int, TimedBackend] = {}

        def w(be):
            if id(be) not in wrapped:
                wrapped[id(be)] = TimedBackend(be, clock)
            return wrapped[id(be)]

        return Layout([w(be) for be in self.layer_be], w(self.embed_be), w(self.out_be), self.rope, w(self.head_be))

    def stage(self, key: str, with_dev: bool = True) -> _Staging:
        s = self._stage.get(key)
        if s is None:
            s = self._stage[key] = _Staging(with_dev)
        return s

    def move(self, x, src, dst):
        """x [R, D] (contiguous float32) from backend src to dst, through a pinned host buffer."""
        if src is dst or (not src.device and not dst.device):
            return x
        nbytes = x.size * 4
        if src.device:
            with src.activate():
                _, host = self.stage("move", False).get(src, nbytes)
                src.to_host(src.bytes_of(x), host[:nbytes])
                src.wait()
            x_host = host[:nbytes].view(np.float32).reshape(x.shape).copy()
            if not dst.device:
                return x_host
            x = x_host
        with dst.activate():
            _, host = self.stage("move", False).get(dst, nbytes)
            host[:nbytes] = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
            out = dst.empty(x.shape)
            dst.to_device(host[:nbytes], dst.bytes_of(out))
        return out

    def download(self, be, x) -> np.ndarray:
        """x (float32 on be) as a new host array; one counted D2H on a device."""
        if not be.device:
            return x
        nbytes = x.size * 4
        with be.activate():
            _, host = self.stage("down", False).get(be, nbytes)
            be.to_host(be.bytes_of(be.contiguous(x)), host[:nbytes])
            be.wait()
        return host[:nbytes].view(np.float32).reshape(x.shape).copy()

    def meta(self, tokens: np.ndarray, positions: np.ndarray, last: np.ndarray, extra=()) -> dict:
        """The window's token ids, positions and last-row indices (and `extra` int64 arrays: the states' per-row
        buffer indices) on every backend of the layout: one H2D per device. Returns backend name ->
        (tokens, positions, last, [extra...])."""
        extra = [np.asarray(e, np.int64) for e in extra]
        out = {HOST.name: (tokens, positions, last, extra)}
        if not self.devices:
            return out
        parts = [tokens, positions, last, *extra]
        flat = np.concatenate(parts).astype(np.int64)
        bounds = np.cumsum([0] + [p.size for p in parts])
        for dev in self.devices:
            with dev.activate():
                d, h = self.stage("meta").get(dev, flat.nbytes)
                h[: flat.nbytes] = flat.view(np.uint8)
                dev.to_device(h[: flat.nbytes], d[: flat.nbytes])
                md = d[: flat.nbytes].view(np.int64)
                views = [md[bounds[i] : bounds[i + 1]] for i in range(len(parts))]
                out[dev.name] = (views[0], views[1], views[2], views[3:])
        return out

    def moe_rows(self, be, R: int, D: int, k: int):
        """Where a MoE layer's FFN input rows [R, D] go: on a device, a view of the staging buffer that also
        holds the router's ids and weights, so that one D2H carries all three to the CPU experts."""
        if not be.device:
            return np.empty((R, D), np.float32)
        o_h = _align(R * k * 8) + _align(R * k * 4)
        buf, _ = self.stage("moe").get(be, o_h + R * D * 4)
        return be.view(buf, o_h, (R, D), np.float32)

    def attention_row(self, be, x, norm, qkv, q_norm, k_norm, wo, eps: float, heads: tuple, n_rot: int, neox: bool,
                      st, li: int, pos0: int, positions, cos, sin, scores) -> bool:
        """The attention half of a layer over one row x [1, D] on the host, in place, in one compiled call
        (kernels/cpu/decode_row.py; bitwise the composed ops): st a host KVCache (the caller's check), every
        matrix on the int8 path. False, having done nothing, where that does not hold (a device, another type)."""
        H, Hkv, hd = heads
        if be.device or not x.flags.c_contiguous:
            return False
        tq, to = qkv.table, wo.table
        if not (tq.ok and to.ok):
            return False
        kt, vc = st.kv_layer(li)
        qn = _NO_NORM if q_norm is None else q_norm
        kn = _NO_NORM if k_norm is None else k_norm
        mark = MARKS[row_mode(H, hd, kt, vc)]
        with clocked(HOST.clock, "attention_row"):
            attention_half(x, norm, eps, tq.addr, tq.dims, tq.sg, tq.col, H, Hkv, hd, qn, kn, positions, cos, sin,
                           n_rot, neox, kt, vc, pos0, np.float32(1.0 / np.sqrt(hd)), mark, mark, scores, to.addr,
                           to.dims, to.sg, to.col, numba.get_num_threads())
        return True

    def ffn_row(self, be, x, norm, eps: float, gu, down) -> bool:
        """A dense layer's FFN half over one row x [1, D] on the host, in place, in one compiled call (bitwise the
        composed ops); False, having done nothing, on a device or off the int8 path."""
        if be.device or not x.flags.c_contiguous:
            return False
        tg, td = gu.table, down.table
        if not (tg.ok and td.ok):
            return False
        ffn_half(x, norm, eps, tg.addr, tg.dims, tg.sg, tg.col, td.addr, td.dims, td.sg, td.col,
                 numba.get_num_threads())
        return True

    def moe_row(self, be, x, norm, eps: float, router, experts_gu, experts_down, k: int, renorm: bool) -> bool:
        """A MoE layer's FFN half over one row x [1, D] on the host, in place, in one compiled call
        (kernels/cpu/moe.moe_half); False, having done nothing, on a device or where moe_ffn would not take its
        one-call row."""
        if be.device:
            return False
        with clocked(HOST.clock, "experts"):
            return moe_residual_row(x, norm, eps, router, experts_gu, experts_down, k, renorm)

    def routed_experts(self, be, h, router, experts_gu, experts_down, k: int, renorm: bool):
        """The routed-experts half of a MoE FFN over h [R, D] (from moe_rows, on be): the router runs on be,
        the experts always on the CPU. Returns (out [R, D] on be, distinct experts). On the host it is
        kernels/cpu/moe.moe_ffn (bitwise); on a device the ids, weights and rows go down in one D2H and the
        experts' output comes back in one H2D."""
        R, D = h.shape
        if not be.device:
            out = np.empty((R, D), np.float32)
            with clocked(HOST.clock, "experts"):
                return out, moe_ffn(h, router, experts_gu, experts_down, k, renorm, out)
        o_w = _align(R * k * 8)
        o_h = o_w + _align(R * k * 4)
        nbytes = o_h + R * D * 4
        buf, host = self.stage("moe").get(be, nbytes)
        ids = be.view(buf, 0, (R, k), np.int64)
        w = be.view(buf, o_w, (R, k), np.float32)
        logits = be.empty((R, router.n_rows))
        be.matmul(router, h, logits)
        be.softmax_topk(logits, k, renorm, ids, w)
        be.to_host(buf[:nbytes], host[:nbytes])
        be.wait()  # the only wait of the layer: the experts need these rows
        hh = host[o_h:nbytes].view(np.float32).reshape(R, D)
        ww = host[o_w : o_w + R * k * 4].view(np.float32).reshape(R, k)
        ii = host[: R * k * 8].view(np.int64).reshape(R, k)
        fdev, fhost = self.stage("ffn").get(be, R * D * 4)
        out = fhost[: R * D * 4].view(np.float32).reshape(R, D)
        with clocked(HOST.clock, "experts"):
            n = experts_ffn(hh, ii, ww, experts_gu, experts_down, out)
        be.to_device(fhost[: R * D * 4], fdev[: R * D * 4])
        return fdev[: R * D * 4].view(np.float32).reshape(R, D), n


class DeviceRows:
    """A window's final residual rows left on a device backend: nothing moves until a consumer reads them.
    Slicing gives another DeviceRows (no transfer); `np.asarray(rows)` (or `host()`) copies them to the host
    (one counted D2H); `on(be)` hands the device array to a consumer on the same backend (no transfer)."""

    def __init__(self, layout: Layout, be, x, r0: int, r1: int):
        self.layout, self.be, self.x, self.r0, self.r1 = layout, be, x, int(r0), int(r1)

    def __len__(self) -> int:
        return self.r1 - self.r0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.r1 - self.r0, int(self.x.shape[1]))

    def __getitem__(self, s):
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("DeviceRows: only contiguous row slices")
        a, b, _ = s.indices(len(self))
        return DeviceRows(self.layout, self.be, self.x, self.r0 + a, self.r0 + max(a, b))

    def device(self):
        return self.x[self.r0 : self.r1]

    def host(self) -> np.ndarray:
        if self.r1 == self.r0:
            return np.empty((0, self.x.shape[1]), np.float32)
        return self.layout.download(self.be, self.device())

    def __array__(self, dtype=None, copy=None):
        a = self.host()
        return a if dtype is None else a.astype(dtype)

    def __array_function__(self, func, types, args, kwargs):
        """np.concatenate of rows that all live on this device stays there (no transfer: the MTP head catching
        up over several windows' rows on the same device); anything else reads them to the host first."""
        if func is np.concatenate and not kwargs:
            seq = list(args[0])
            if all(isinstance(r, DeviceRows) and r.be is self.be for r in seq):
                with self.be.activate():
                    x = self.be.concat([r.device() for r in seq])
                return DeviceRows(self.layout, self.be, x, 0, int(x.shape[0]))
            return np.concatenate([np.asarray(r) for r in seq], *args[1:])
        conv = [np.asarray(a) if isinstance(a, DeviceRows) else a for a in args]
        return func(*conv, **kwargs)


def rows_on(rows, be):
    """Hidden rows (a NumPy array or DeviceRows) as an array on backend be, moving them only if needed."""
    if isinstance(rows, DeviceRows):
        if rows.be is be:
            return rows.device()
        rows = rows.host()
    rows = np.ascontiguousarray(rows, np.float32)
    if not be.device:
        return rows
    return Layout([], HOST, HOST, {}).move(rows, HOST, be)
