"""One file's bytes from the rank that holds them to the rank that lost them,
point to point, in bounded pieces (NVRx's retrieval of a replaced node's
part from its clique peer, which sends tensors over the interconnect).

The holder reads its file in request-sized pieces and sends each as it is
read; the receiver takes each into one piece-sized buffer and, with
`content`, compares it with the bytes regenerated in order. Memory on either
side: a piece or the read pool's buffers, whatever the file's size. The link
is whatever the caller passes (MPI's Send and Recv in the DLIO layer), so the
engine stays free of MPI.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from dlio_ckpt_ext.engine.buffers import BufferPool
from dlio_ckpt_ext.engine.content import ContentSpec, generator
from dlio_ckpt_ext.engine.profile import FileStats
from dlio_ckpt_ext.engine.storage_interface import Backend
from dlio_ckpt_ext.engine.stream import Progress, first_difference, load_file
from dlio_ckpt_ext.errors import VerificationError


def pieces(size: int, request: int) -> list[tuple[int, int]]:
    """(offset, length) of each piece the file crosses in, in order."""
    return [(at, min(request, size - at)) for at in range(0, size, request)]


def send_part(backend: Backend, path: str, size: int, pool: BufferPool, request: int,
              send: Callable[[memoryview], None], progress: Progress = None) -> FileStats:
    """Read `path` in order and send every piece as it is read (one request in
    flight: the pieces must leave in the order the receiver takes them)."""
    return load_file(backend, path, size, pool, None, 1, 1, progress, request,
                     deliver=lambda offset, data: send(data))


def receive_part(where: str, size: int, request: int, recv: Callable[[memoryview], None], piece: memoryview,
                 content: Optional[ContentSpec] = None, expected: Optional[memoryview] = None,
                 gen_threads: int = 1, progress: Progress = None) -> FileStats:
    """Take the file's pieces in order into `piece` (at least request bytes),
    each compared with the regenerated content when given (`expected`: as large)."""
    stats = FileStats(name=where, nbytes=size, start=time.time())
    gen = generator(content, size, 0, gen_threads, chunk_size=request) if content is not None else None
    for at, n in pieces(size, request):
        recv(piece[:n])
        if gen is not None:
            gen.fill_chunk(expected[:n])
            first = first_difference(piece[:n], expected[:n])
            if first >= 0:
                raise VerificationError(f"{where} differs from the written data at byte offset {at + first} "
                                        "(received from its holder)")
        if progress:
            progress(n)
    stats.end = time.time()
    stats.io_s = stats.end - stats.start
    return stats
