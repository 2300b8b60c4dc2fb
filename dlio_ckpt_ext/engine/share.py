"""One range read once for a group of readers and broadcast to the others.

Megatron's fully-parallel load and runai-model-streamer's distributed mode
split the reads of replicated bytes across the ranks that need them and
broadcast over the interconnect. Here the k readers of a range each read a
contiguous part of it from storage, in windows of `pieces` requests (the
reads in flight of a plain load), and after each window every reader's
window is broadcast in read_size pieces. Memory: one window of the rank's own
part plus one piece received, whatever the range's size. The group's
communication is whatever implements Broadcast (MPI in the DLIO layer), so
the engine stays free of MPI.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Protocol

from dlio_ckpt_ext.engine.buffers import BufferPool
from dlio_ckpt_ext.engine.content import ContentSpec, generator
from dlio_ckpt_ext.engine.profile import FileStats
from dlio_ckpt_ext.engine.storage_interface import Backend
from dlio_ckpt_ext.engine.stream import Progress, first_difference, load_file, split_range
from dlio_ckpt_ext.errors import VerificationError


class Broadcast(Protocol):
    """The readers of one range, in a fixed order; this rank is one of them."""
    index: int
    size: int

    def bcast(self, buf: memoryview, root: int) -> None:
        """Every member calls it with the same root and length: root's bytes land in every buf."""


@dataclass
class Shared:
    """What a shared range cost this rank: its storage reads and the broadcast."""
    storage: list[FileStats]
    broadcast_bytes: int = 0   # received from the others
    broadcast_s: float = 0.0   # in the broadcasts (waiting for a slower root included)


def windows(start: int, end: int, chunk: int, pieces: int) -> list[tuple[int, int]]:
    """[start, end) in windows of `pieces` chunk-sized requests, meeting at
    multiples of chunk as the engine's requests do."""
    first = start // chunk
    bounds = [start] + [c * chunk for c in range(first + pieces, -(-end // chunk), pieces)] + [end]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def read_shared(backend: Backend, path: str, file_size: int, offset: int, length: int, group: Broadcast,
                pool: BufferPool, window: memoryview, received: memoryview, request: int, pieces: int,
                content: Optional[ContentSpec] = None, gen_threads: int = 1, progress: Progress = None,
                expected: Optional[memoryview] = None, owner: Optional[int] = None) -> Shared:
    """Read this rank's part of [offset, offset + length) of `path` and
    broadcast it; receive the others' parts (verified against `content` when
    given). With `owner` (a member's index) that member reads it all
    (fastsafetensors: file i by rank i), else the members split it. window: at
    least pieces x request bytes; received and expected: at least request bytes."""
    end = offset + length
    if owner is None:
        parts = split_range(offset, end, request, group.size)
        parts += [(end, end)] * (group.size - len(parts))
    else:
        parts = [(offset, end) if i == owner else (end, end) for i in range(group.size)]
    plan = [windows(a, b, request, pieces) for a, b in parts]
    out = Shared([])
    for j in range(max(len(w) for w in plan)):
        if j < len(plan[group.index]):
            a, b = plan[group.index][j]

            def keep(at: int, data: memoryview, a: int = a) -> None:
                window[at - a:at - a + len(data)] = data
            out.storage.append(load_file(backend, path, file_size, pool, content, pieces, gen_threads, progress,
                                         request, offset=a, length=b - a, deliver=keep))
        for root, rounds in enumerate(plan):
            if j >= len(rounds):
                continue
            a, b = rounds[j]
            t0 = time.perf_counter()
            for at, end in windows(a, b, request, 1):
                n = end - at
                if root == group.index:
                    group.bcast(window[at - a:at - a + n], root)
                    continue
                group.bcast(received[:n], root)
                out.broadcast_bytes += n
                if content is not None:
                    _verify(content, received[:n], at, expected, gen_threads, backend.uri(path))
                if progress:
                    progress(n)
            out.broadcast_s += time.perf_counter() - t0
    return out


def _verify(content: ContentSpec, got: memoryview, at: int, expected: memoryview,
            gen_threads: int, where: str) -> None:
    n = len(got)
    gen = generator(content, n, offset=at, threads=gen_threads, chunk_size=max(n, 1 << 20))
    gen.fill_chunk(expected[:n])
    first = first_difference(got, expected[:n])
    if first >= 0:
        raise VerificationError(f"{where} differs from the written data at byte offset {at + first} "
                                "(received by broadcast)")

