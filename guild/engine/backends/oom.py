"""A device allocation that did not fit, reported as one line naming it.

CuPy raises cupy.cuda.memory.OutOfMemoryError when the GPU (or its memory pool) cannot serve an allocation; the fake
device (HostBackend.fake_device with a capacity) raises host.OutOfMemoryError, named the same. `allocating` turns
either into guild's DeviceOutOfMemoryError with what was being allocated (a tensor's name, a layer's KV cache),
the bytes it needed and the bytes the device has free, which the CLI prints in one line. Any other exception,
a host MemoryError included, passes through untouched."""

from __future__ import annotations

import contextlib

from ...errors import DeviceOutOfMemoryError


def is_oom(e: BaseException) -> bool:
    """A device's out-of-memory error: CuPy's, or the fake device's (both named OutOfMemoryError, both MemoryErrors)."""
    return isinstance(e, MemoryError) and type(e).__name__ == "OutOfMemoryError"


@contextlib.contextmanager
def allocating(be, what: str, nbytes: int):
    """Allocations on backend `be` for `what` (nbytes in all): a device out-of-memory error inside becomes a
    DeviceOutOfMemoryError naming them."""
    try:
        yield
    except MemoryError as e:
        if not is_oom(e):
            raise
        raise DeviceOutOfMemoryError(be.name, what, int(nbytes), be.free_bytes()) from None
