"""The backends every architecture's one window forward (guild/models/) is written against: the CPU kernels'
signatures, allocation and staged transfers, plus the Layout that says which backend holds each layer.

`HostBackend` (host.py) runs the CPU kernels on NumPy arrays: the shared instance `HOST` is what a CPU model runs
on (its arrays are the caller's, its weights the CPU model's packed matrices and Linears, linear.py), and
`HostBackend.fake_device()` is a stand-in GPU for CPU tests whose transfers copy and are counted, so the same
orchestration must give bitwise the CPU model's logits. `CudaBackend` (cuda.py) runs the kernels of kernels/cuda/ on
CuPy arrays (one non-blocking stream, pinned staging buffers). Both implement the `Backend` protocol
(protocol.py). A model placed by guild.engine.gpu is the same model object with a device Layout (layout.py) and
device twins of the layers placed there; its forward is the CPU model's, line for line.
"""

from .clock import KernelClock
from .cuda import CudaBackend
from .host import HOST, PARALLEL_ROWS, HostBackend
from .layout import DeviceRows, Layout, rows_on
from .linear import Linear
from .protocol import Backend, TimedBackend, backend_ops

__all__ = ["HOST", "PARALLEL_ROWS", "Backend", "CudaBackend", "DeviceRows", "HostBackend",
           "KernelClock", "Layout", "Linear", "TimedBackend", "backend_ops", "rows_on"]
