"""User-facing errors: one line naming the file, field or flag at fault; the CLI prints them without a traceback."""


class GuildError(Exception):
    """Base of every error guild reports to a user."""


class GgufFormatError(GuildError):
    """The file is not a readable GGUF (bad magic, truncated, inconsistent index)."""


class MissingTensorError(GuildError):
    pass


class UnsupportedArchitectureError(GuildError):
    pass


class UnsupportedQuantTypeError(GuildError):
    pass


class NumericsError(GuildError):
    """Non-finite weights in a file, or non-finite values produced while running the model."""


class MetadataError(GuildError):
    """A required GGUF metadata key is missing or has the wrong type."""


class ContextOverflowError(GuildError):
    """The tokens do not fit the context; `n_ctx` is its size (the CLI names the flag that sets it)."""

    def __init__(self, msg: str, n_ctx: int | None = None):
        super().__init__(msg)
        self.n_ctx = n_ctx


class BadFlagError(GuildError):
    pass


class UnknownStrategyError(GuildError):
    """A strategy name that is neither normal, adaptive, nor a registered drafter's (guild.speculative.registry)."""


class DeviceUnavailableError(GuildError):
    """--device cuda without a usable GPU (CuPy, driver, device or NVRTC missing)."""


class GpuPathError(GuildError):
    """The GPU engine cannot run this model here (architecture, shape, memory)."""


class DeviceOutOfMemoryError(GpuPathError):
    """A device allocation that did not fit: what it was for (a tensor, a KV cache, a buffer), the bytes it needed
    and the bytes the device had free (None where the device cannot say)."""

    def __init__(self, device: str, what: str, needed: int, free: int | None):
        def size(n: int) -> str:
            return f"{n:,} bytes ({n / 2**20:.1f} MiB)"

        super().__init__(f"out of GPU memory on {device}: {what} needs {size(needed)}, "
                         + ("free memory unknown" if free is None else f"{size(free)} free"))
        self.device, self.what, self.needed, self.free = device, what, needed, free


class ModelNotFoundError(GuildError):
    pass


class ChatTemplateError(GuildError):
    """The chat template failed to compile or render (or raised via `raise_exception`)."""


class PlanError(GuildError):
    """A `.gexec` plan is missing, unreadable or of another format version."""


class PlanSealError(PlanError):
    """A plan's bytes do not match its seal or a section its digest: the file was changed after `optimize`."""


class PlanMismatchError(PlanError):
    """A sealed plan was calibrated for another machine, model or KV cache type (base of the typed mismatches)."""


class CpuIsaMismatch(PlanMismatchError):
    pass


class NumaTopologyMismatch(PlanMismatchError):
    pass


class GpuArchitectureMismatch(PlanMismatchError):
    pass


class ModelMismatch(PlanMismatchError):
    pass


class KVTypeMismatch(PlanMismatchError):
    pass
