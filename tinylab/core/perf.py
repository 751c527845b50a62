"""Speed settings of a training process that are no model or loop code: the C library's
handling of freed memory on the CPU (what it saves: retain_freed_memory's docstring).
"""
import ctypes
import sys

# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def retain_freed_memory() -> bool:
    """Make glibc's malloc keep freed blocks of up to 1 GiB in the heap for reuse.

    By default a block over 32 MB is a fresh mmap that free() returns to the kernel at once, so
    every training step on the CPU faults in and zeroes its big tensors again (the tied
    embedding's gradients: 37 MB at vocab 32000; the fused head's logits chunks): about 0.26 s
    of kernel time a step at vocab 32000, batch 16 (5% of the step, one thread). With the
    thresholds raised, the next step reuses the same memory; the process keeps its peak memory
    instead of returning it between steps. A no-op (False) where the C library has no mallopt."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):  # e.g. musl: no mallopt
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) & bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
