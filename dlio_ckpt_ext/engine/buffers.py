"""A fixed set of page-aligned buffers, allocated once per rank.

Anonymous mmaps are page aligned, which O_DIRECT needs, and are not touched
by Python's allocator, so the pool is the only memory that grows with
chunk_size x depth and nothing grows with the checkpoint size.
"""
from __future__ import annotations

import mmap
from typing import Optional

import numpy as np

PAGE = mmap.PAGESIZE
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"

#: start address -> size of every buffer allocate() made and release() has not
_allocated: dict[int, int] = {}


def allocate(size: int) -> mmap.mmap:
    """`size` bytes of private anonymous memory, backed by transparent huge
    pages where the kernel allows it, every page touched now so that no
    first-touch fault lands in a timed window.

    Why not plain mmap(-1, size): Python maps that *shared* (shmem), which
    huge pages never back, and its 4 KiB pages come physically scattered. An
    O_DIRECT request is split wherever the device's scatter-gather list
    (max_segments) runs out, so on this VM's virtio disk (254 segments) the
    engine's 32 MiB writes went out as 1.8 MiB requests where a freshly
    mapped area went as 4 MiB ones, and wrote 0.81x as fast. A 2 MiB huge
    page is one segment (bench/buffer_pages.py measures both).
    """
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _allocated[address(buf)] = size
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # THP not built in: 4 KiB pages, recorded by huge_page_bytes()
    np.frombuffer(buf, dtype=np.uint8).fill(0)
    return buf


def address(buf: mmap.mmap | memoryview) -> int:
    """Where a writable buffer's bytes start in this process's memory."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def thp_setting() -> Optional[str]:
    """The kernel's transparent huge page mode (always, madvise or never), None off Linux."""
    try:
        with open(THP_SETTING) as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()


def huge_page_bytes() -> Optional[int]:
    """Bytes of this process's allocate()d buffers backed by huge pages now
    (from /proc/self/smaps; None off Linux). The kernel merges adjacent
    mappings of the same kind into one, so whole mappings are counted when
    every byte of them is one of these buffers; one merged with other memory
    is left out: this can only under-count."""
    spans = sorted((start, start + size) for start, size in _allocated.items())
    try:
        with open("/proc/self/smaps") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None

    def ours(start: int, end: int) -> bool:
        at = start
        for s, e in spans:
            if s <= at < e:
                at = e
        return at >= end
    total, inside = 0, False
    for line in lines:
        first = line.split(maxsplit=1)[0] if line else ""
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            start, end = (int(x, 16) for x in first.split("-"))
            inside = ours(start, end)
        elif inside and first == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total


class BufferPool:
    """depth 0 is a pool that only states the chunk size: for writers that lend
    their own memory (Writer.zero_copy), nothing needs allocating."""

    def __init__(self, depth: int, buffer_size: int) -> None:
        if depth < 0:
            raise ValueError(f"pool depth must be >= 0, got {depth}")
        if buffer_size <= 0 or buffer_size % PAGE:
            raise ValueError(f"buffer size must be a positive multiple of {PAGE}, got {buffer_size}")
        self.buffer_size = buffer_size
        self.buffers = [self._allocate() for _ in range(depth)]
        self._scratch: mmap.mmap | None = None

    def _allocate(self, size: int = 0) -> mmap.mmap:
        return allocate(size or self.buffer_size)

    def scratch(self, size: int = 0) -> memoryview:
        """One extra buffer of at least `size` bytes (default: a buffer's), outside
        the queues, for regenerating expected data."""
        size = max(size, self.buffer_size)
        if self._scratch is None or len(self._scratch) < size:
            if self._scratch is not None:
                release(self._scratch)
            self._scratch = self._allocate(size)
        return memoryview(self._scratch)

    @property
    def depth(self) -> int:
        return len(self.buffers)

    @property
    def nbytes(self) -> int:
        return self.depth * self.buffer_size

    def close(self) -> None:
        for buf in self.buffers + ([self._scratch] if self._scratch else []):
            release(buf)
        self.buffers, self._scratch = [], None


def release(buf: mmap.mmap) -> None:
    if not buf.closed:
        _allocated.pop(address(buf), None)
    try:
        buf.close()
    except BufferError:
        pass  # a view still lives (an error's traceback holds one): unmapped when it goes
