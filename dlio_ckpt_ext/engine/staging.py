"""Async checkpoints' host-memory staging: the rank's whole state, copied once
per checkpoint at memory speed, then persisted from there in the background.

On a GPU node staging is the device-to-host copy that blocks training; here
the "device" is emulated: each chunk is generated (untimed, it is what the
device already holds) into a small source buffer, then copied into the
staging area (timed). Unlike the streaming path, the staging area is as large
as the rank's share of a checkpoint: that is what async checkpointing costs.
"""
from __future__ import annotations

import ctypes
import time

from dlio_ckpt_ext.engine.buffers import PAGE, address, allocate, release
from dlio_ckpt_ext.engine.content import ContentSpec, fill_exact, generator


def aligned(n: int) -> int:
    """n rounded up to a whole page, so every staged file starts O_DIRECT-aligned."""
    return -(-n // PAGE) * PAGE


class StagingArea:
    """One anonymous mapping holding the files of a checkpoint, each at a
    page-aligned offset; touched when made, so its first-touch faults are
    not charged to the first checkpoint's staging."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.offsets: dict[str, tuple[int, int]] = {}
        total = 0
        for name, size in sizes.items():
            self.offsets[name] = (total, size)
            total += aligned(size)
        self.nbytes = max(total, PAGE)
        self._map = allocate(self.nbytes)

    def view(self, name: str) -> memoryview:
        start, size = self.offsets[name]
        return memoryview(self._map)[start:start + size]

    def close(self) -> None:
        release(self._map)


def stage_file(content: ContentSpec, dest: memoryview, source: memoryview, gen_threads: int = 1) -> tuple[float, float]:
    """Fill `dest` with the file's content: each chunk generated into `source`
    (untimed), then copied into dest (timed). Returns (generation seconds,
    copy seconds); the copy is memmove with the GIL released."""
    size, chunk = len(dest), len(source)
    fill_s = copy_s = 0.0
    if not size:
        return fill_s, copy_s
    gen = generator(content, size, threads=gen_threads, chunk_size=chunk)
    src, dst = address(source), address(dest)
    for offset in range(0, size, chunk):
        n = min(chunk, size - offset)
        t0 = time.perf_counter()
        fill_exact(gen, source[:n], offset, "the staging area")
        t1 = time.perf_counter()
        ctypes.memmove(dst + offset, src, n)
        t2 = time.perf_counter()
        fill_s += t1 - t0
        copy_s += t2 - t1
    return fill_s, copy_s
