"""How freed request buffers come back: glibc's thresholds for this process."""
from __future__ import annotations

import ctypes

#: glibc maps an allocation this large or larger anew each time (its mmap threshold
#: cannot be set higher) and unmaps it at free, so every part or GET buffer that
#: size faults in fresh pages: one minor fault per 4 KiB (bench/cpu_bench.py)
FRESH_PAGES_FROM = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def reuse_freed_memory() -> bool:
    """Keep the memory of the client library's freed part and GET buffers for the next ones:
    glibc's default unmaps a freed allocation above its (sliding) mmap threshold
    and trims the heap, so the next buffer faults in fresh pages. A fixed
    threshold at glibc's maximum and no trimming halve the faults of 8 MiB GETs
    (bench/cpu_bench.py). The process keeps its high-water mark of buffers, which
    the memory check already counts."""
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, FRESH_PAGES_FROM)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):  # not glibc
        return False
