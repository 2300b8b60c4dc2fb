"""A fixed set of page-aligned buffers, allocated once per rank.

Anonymous mmaps are page aligned, which O_DIRECT needs, and are not touched
by Python's allocator, so the pool is the only memory that grows with
chunk_size x depth and nothing grows with the checkpoint size.
"""
from __future__ import annotations

import mmap

PAGE = mmap.PAGESIZE


class BufferPool:
    """depth 0 is a pool that only states the chunk size: for writers that lend
    their own memory (Writer.zero_copy), nothing needs allocating."""

    def __init__(self, depth: int, buffer_size: int, prefault: bool = True) -> None:
        if depth < 0:
            raise ValueError(f"pool depth must be >= 0, got {depth}")
        if buffer_size <= 0 or buffer_size % PAGE:
            raise ValueError(f"buffer size must be a positive multiple of {PAGE}, got {buffer_size}")
        self.buffer_size, self.prefault = buffer_size, prefault
        self.buffers = [self._allocate() for _ in range(depth)]
        self._scratch: mmap.mmap | None = None

    def _allocate(self, size: int = 0) -> mmap.mmap:
        size = size or self.buffer_size
        buf = mmap.mmap(-1, size)
        if self.prefault:
            # Touch every page now so first-touch faults land outside timed windows.
            buf.write(b"\0" * size)
            buf.seek(0)
        return buf

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
    try:
        buf.close()
    except BufferError:
        pass  # a view still lives (an error's traceback holds one): unmapped when it goes
