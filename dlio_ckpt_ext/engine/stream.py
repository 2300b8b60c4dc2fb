"""Save and load one file as a stream through the buffer pool."""
from __future__ import annotations

import bisect

import ctypes
import ctypes.util
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np

from dlio_ckpt_ext.engine import pipeline
from dlio_ckpt_ext.engine.buffers import BufferPool
from dlio_ckpt_ext.engine.content import ContentSpec, fill_exact, generator
from dlio_ckpt_ext.engine.pipeline import Chunk
from dlio_ckpt_ext.engine.profile import FileStats, busy_seconds
from dlio_ckpt_ext.engine.spans import SpanSink, stage_span
from dlio_ckpt_ext.errors import VerificationError
from dlio_ckpt_ext.engine.storage_interface import Backend, Writer


#: called with the byte count of each chunk as it completes (e.g. a progress bar)
Progress = Optional[Callable[[int], None]]

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def first_difference(a: memoryview, b: memoryview) -> int:
    """Offset of the first differing byte of two equal-length buffers, or -1.

    memcmp (GIL released, memory speed) for the common equal case; memoryview
    equality goes element by element and would dominate the load phase. Either
    buffer may be read-only (bytes a reader lent).
    """
    n = len(a)
    xa, xb = np.frombuffer(a, dtype=np.uint8, count=n), np.frombuffer(b, dtype=np.uint8, count=n)
    if _libc.memcmp(xa.ctypes.data, xb.ctypes.data, n) == 0:
        return -1
    return int(np.argmax(xa != xb))


def _record(stats: FileStats, chunks: list[Chunk], fill_stage: Optional[str],
            background_io_s: float = 0.0) -> None:
    """Fold chunk timings into stats; fill_stage names the pipeline stage that
    generates content ("producer" on save, "consumer" on a verified load,
    None on an unverified load, where nothing is generated).

    I/O time is wall time with at least one request in flight: parallel reads
    overlap, and summing their durations would count the same second many
    times. Each chunk's bottleneck compares its generation time with its share
    of that wall time. background_io_s is storage time no chunk was charged
    for (uploads that finish in close()); each chunk's bottleneck counts its
    share of it."""
    timed = []
    for c in chunks:
        if fill_stage == "producer":
            fill, io, io_end = c.produce_s, c.consume_s, c.done_at
        else:
            fill, io, io_end = (c.consume_s if fill_stage else 0.0), c.produce_s, c.produced_at
        timed.append((c, fill, io, (io_end - io, io_end)))
    requests_s = sum(io for _, _, io, _ in timed)
    busy_s = busy_seconds([span for _, _, _, span in timed])
    overlap = busy_s / requests_s if requests_s > 0 else 1.0
    share = background_io_s / len(chunks) if chunks else 0.0
    stats.io_s += busy_s
    for c, fill, io, _ in timed:
        stats.fill_s += fill
        stats.wait_free_s += c.wait_free_s
        stats.wait_filled_s += c.wait_filled_s
        if fill > io * overlap + share:
            stats.chunks_fill_bound += 1
        else:
            stats.chunks_io_bound += 1
        stats.chunks.append([c.offset, c.nbytes, fill, io, c.wait_free_s, c.wait_filled_s, c.done_at, c.produced_at])


def _sequential(start: int, end: int, chunk: int,
                action: Callable[[memoryview, int, int], Optional[memoryview]], cuts: tuple[int, ...] = ()):
    """A pipeline producer handing out [start, end) in pieces that end at
    multiples of chunk (only a range's first piece is shorter, where it starts
    between them) and at the cuts; action(buf, offset, n) puts the n bytes at
    offset into buf[:n], or returns them in memory of its own (a lending reader)."""
    offset = start
    cuts = tuple(sorted(c for c in cuts if start < c < end))

    def produce(buf: memoryview) -> Optional[Chunk]:
        nonlocal offset
        if offset >= end:
            return None
        n = min(chunk - offset % chunk, end - offset)
        k = bisect.bisect_right(cuts, offset)
        if k < len(cuts):
            n = min(n, cuts[k] - offset)
        piece = Chunk(offset, n, data=action(buf, offset, n))
        offset += n
        return piece
    return produce


def _fill_in_place(writer: Writer, gen, size: int, chunk: int, progress: Progress, where: str,
                   filled: Optional[Callable] = None, written: Optional[Callable] = None) -> list[Chunk]:
    """Generate straight into memory the writer lends (reserve), then hand it
    over (commit). Reserve and commit block only while the writer's uploads in
    flight are full, so their time is time spent waiting on storage."""
    chunks = []
    for offset in range(0, size, chunk):
        n = min(chunk, size - offset)
        t0 = time.perf_counter()
        view = writer.reserve(n)
        t1 = time.perf_counter()
        fill_started = time.time()
        fill_exact(gen, view[:n], offset, where)
        t2 = time.perf_counter()
        filled_at = time.time()
        if filled:
            filled(offset, n, fill_started)
        writer.commit(n)
        if written:
            written(offset, n, filled_at)
        chunks.append(Chunk(offset, n, produce_s=t2 - t1, consume_s=(t1 - t0) + (time.perf_counter() - t2),
                            produced_at=filled_at, done_at=time.time()))
        del view
        if progress:
            progress(n)
    return chunks


class PendingFile:
    """A file whose bytes have all been handed to its writer but not yet closed."""

    def __init__(self, stats: FileStats, chunks: list[Chunk], writer: Writer, fill_stage: Optional[str]) -> None:
        self.stats, self.chunks, self.writer, self.fill_stage = stats, chunks, writer, fill_stage

    def finish(self) -> FileStats:
        t0 = time.perf_counter()
        self.writer.close()
        self.stats.close_s = time.perf_counter() - t0
        self.stats.end = time.time()
        # Lent-memory uploads run behind commit() and are waited for in close().
        _record(self.stats, self.chunks, self.fill_stage, self.stats.close_s if self.writer.zero_copy else 0.0)
        return self.stats


def abort_together(writers: Sequence[Writer]) -> None:
    """Abort every writer, side by side: an S3 abort is a round trip or more
    to the store (two in a row took 0.9-1.2 s through a 10 ms link, side by
    side 0.4-0.5 s), and after a Ctrl-C mpirun kills the ranks soon."""
    if len(writers) == 1:
        writers[0].abort()
        return
    aborts = [threading.Thread(target=w.abort, name="abort") for w in writers]
    for t in aborts:
        t.start()
    for t in aborts:
        t.join()


class FileWindow:
    """The files a rank is writing at once, closed oldest first.

    With lent-memory uploads (S3) the last parts of a file are still in flight
    when its bytes have been sent; closing it only after the next at_once - 1
    files' bytes were sent keeps the upload window full across file boundaries
    (a file of few parts cannot fill it alone). On any failure every file still
    open, the one being sent included, is aborted at once."""

    def __init__(self, at_once: int = 1) -> None:
        self.at_once = at_once
        self._open: list[Writer] = []      # opened and neither closed nor aborted
        self._sent: list[PendingFile] = []  # every byte handed over, oldest first

    def opened(self, writer: Writer) -> None:
        self._open.append(writer)

    def sent(self, pending: PendingFile) -> list[FileStats]:
        """Take a file whose bytes were all sent; returns the files this closed."""
        self._sent.append(pending)
        return self._close(len(self._sent) - self.at_once + 1)

    def close_all(self) -> list[FileStats]:
        return self._close(len(self._sent))

    def _close(self, n: int) -> list[FileStats]:
        closed = []
        try:
            for _ in range(max(0, n)):
                oldest = self._sent[0]
                closed.append(oldest.finish())
                self._sent.pop(0)
                self._open.remove(oldest.writer)
        except BaseException:
            self.abort()
            raise
        return closed

    def abort(self) -> None:
        """Remove every open file (partial files, open uploads); never raises."""
        writers, self._open, self._sent = self._open, [], []
        if writers:
            abort_together(writers)


def _send(backend: Backend, path: str, size: int, send: Callable[[Writer], list[Chunk]],
          fill_stage: Optional[str], window: FileWindow, gen_threads: int = 0) -> list[FileStats]:
    """Open a writer, let send() hand it the bytes, and pass the file to
    `window`; returns the files that closed. On any failure the window's open
    files are removed (Writer.abort) before the error propagates."""
    stats = FileStats(name=path, nbytes=size, start=time.time(), gen_threads=gen_threads)
    try:
        t0 = time.perf_counter()
        writer = backend.open_writer(path, size)
        stats.open_s = stats.io_s = time.perf_counter() - t0  # a storage request, as the writes are
        window.opened(writer)
        chunks = send(writer)
    except BaseException:
        window.abort()
        raise
    return window.sent(PendingFile(stats, chunks, writer, fill_stage))


#: a copying writer's first pieces of a file (POSIX, the libraries that take bytes): 256 KiB, then
#: each twice the last up to a chunk's edge, so the first write waits for 256 KiB of generation
#: and not a whole chunk's, and each next fill overlaps the write before it. A 32 MiB chunk's fill
#: alone was 12 ms before any byte went, a file: Orbax's rank (312 MiB in 5 files) saved at 0.90
#: of raw writes, 0.94 with a 1 MiB first piece, 0.95-0.96 with this; Megatron's 0.96 -> 1.00
#: (bench/layout_bench.py). Page-aligned pieces: direct I/O takes them.
RAMP_FIRST = 1 << 18


def ramp_cuts(size: int, chunk: int) -> tuple[int, ...]:
    """Where a file's ramp pieces end: 256 KiB, 768, 1792 ... below the first chunk's edge."""
    cuts, at, n = [], 0, RAMP_FIRST
    while at + n < min(size, chunk):
        at += n
        cuts.append(at)
        n *= 2
    return tuple(cuts)


def send_file(backend: Backend, path: str, size: int, content: ContentSpec, pool: BufferPool,
              gen_threads: int = 1, progress: Progress = None, window: Optional[FileWindow] = None,
              spans: Optional[SpanSink] = None) -> list[FileStats]:
    """Generate `size` bytes of `content`, hand them to a writer of `path` and
    the file to `window` (default: closed at once); returns the files closed."""
    where = backend.uri(path)
    filled, written = (stage_span(spans, stage, path, pool.buffer_size) for stage in ("fill", "write"))

    def send(writer: Writer) -> list[Chunk]:
        if not size:
            return []
        gen = generator(content, size, threads=gen_threads, chunk_size=pool.buffer_size)
        if writer.zero_copy:
            return _fill_in_place(writer, gen, size, pool.buffer_size, progress, where, filled, written)

        def fill(buf: memoryview, offset: int, n: int) -> None:
            started = time.time() if filled else 0.0
            fill_exact(gen, buf[:n], offset, where)
            if filled:
                filled(offset, n, started)

        def write(c: Chunk) -> None:
            started = time.time() if written else 0.0
            writer.write(c.buffer[:c.nbytes])
            if written:
                written(c.offset, c.nbytes, started)
            if progress:
                progress(c.nbytes)
        # a file of one ramp piece cannot overlap its fill and write: no thread for it
        cuts = ramp_cuts(size, pool.buffer_size)
        return pipeline.run(pool, [_sequential(0, size, pool.buffer_size, fill, cuts)], write, not cuts)
    return _send(backend, path, size, send, "producer", window or FileWindow(), gen_threads)


def save_file(backend: Backend, path: str, size: int, content: ContentSpec, pool: BufferPool,
              gen_threads: int = 1, progress: Progress = None) -> FileStats:
    """Generate `size` bytes of `content` and write them to `path`."""
    return send_file(backend, path, size, content, pool, gen_threads, progress)[0]


def write_from_memory(backend: Backend, path: str, data: memoryview, chunk: int,
                      progress: Progress = None, spans: Optional[SpanSink] = None) -> FileStats:
    """Write bytes already in memory (an async checkpoint's staging area) to
    `path` in chunk-sized requests; nothing is generated, so every second is
    storage time."""
    written = stage_span(spans, "write", path, chunk)

    def send(writer: Writer) -> list[Chunk]:
        chunks = []
        for offset in range(0, len(data), chunk):
            n = min(chunk, len(data) - offset)
            t0 = time.perf_counter()
            started = time.time()
            writer.write(data[offset:offset + n])
            if written:
                written(offset, n, started)
            chunks.append(Chunk(offset, n, produce_s=time.perf_counter() - t0, produced_at=time.time()))
            if progress:
                progress(n)
        return chunks
    return _send(backend, path, len(data), send, None, FileWindow())[0]


def split_range(start: int, end: int, chunk: int, parallelism: int) -> list[tuple[int, int]]:
    """Split [start, end) into up to `parallelism` contiguous ranges meeting at
    multiples of chunk (in the file, so direct I/O stays page-aligned)."""
    first, last = start // chunk, -(-end // chunk)
    per = max(1, -(-(last - first) // max(1, parallelism)))
    bounds = [max(start, c * chunk) for c in range(first, last, per)] + [end]
    return list(zip(bounds, bounds[1:]))


def load_file(backend: Backend, path: str, size: int, pool: BufferPool,
              content: Optional[ContentSpec] = None, parallelism: int = 1,
              gen_threads: int = 1, progress: Progress = None, request_size: int = 0,
              spans: Optional[SpanSink] = None, offset: int = 0, length: Optional[int] = None,
              deliver: Optional[Callable[[int, memoryview], None]] = None,
              cuts: tuple[int, ...] = ()) -> FileStats:
    """Read `path` (of `size` bytes) back, or only its bytes [offset, offset +
    length), in requests of request_size (default: the pool's buffer size),
    `parallelism` of them in flight over contiguous ranges; with `content`,
    compare every byte with the data regenerated at its offset. A reader that
    lends its memory reads without a copy, the pool only counting requests.
    deliver(offset, bytes), when given, gets every chunk read, in the order
    consumed (a broadcast keeps them), before its buffer is reused. cuts:
    offsets where a request ends besides the request_size grid (a loader's own).

    A missing file, a size other than `size`, or any differing byte raises an
    error naming the file (and the offset of the first difference).
    """
    request = request_size or pool.buffer_size
    t0 = time.perf_counter()
    reader = backend.open_reader(path, size)
    opened_s = time.perf_counter() - t0
    if not reader.lends_memory and request > pool.buffer_size:
        reader.close()
        raise ValueError(f"read requests of {request} bytes do not fit the pool's {pool.buffer_size}-byte buffers")
    end = size if length is None else offset + length
    stats = FileStats(name=path, nbytes=end - offset, start=time.time() - opened_s, open_s=opened_s, io_s=opened_s)
    try:
        if not reader.lends_memory and reader.size != size:
            raise VerificationError(f"{backend.uri(path)} has {reader.size} bytes, expected {size}")
        ranges = split_range(offset, end, request, parallelism)
        was_read, verified = (stage_span(spans, stage, path, request) for stage in ("read", "verify"))
        if content is not None and (len(ranges) > 1 or offset) and not content.seekable:
            raise ValueError("parallel verified reads need dedup_ratio = compress_ratio = 1")

        def read(buf: memoryview, offset: int, n: int) -> Optional[memoryview]:
            started = time.time() if was_read else 0.0
            data = reader.read(offset, n) if reader.lends_memory else reader.read_view(offset, buf, n)
            got = len(data)
            if was_read:
                was_read(offset, got, started)
            if got != n:
                raise VerificationError(f"{backend.uri(path)} ended at byte {offset + got}, expected {size} bytes")
            return data

        gens: dict[int, object] = {}
        expected = pool.scratch(request) if content is not None else None

        def verify(c: Chunk) -> None:
            first, last = next(r for r in ranges if r[0] <= c.offset < r[1])
            if first not in gens:
                gens[first] = generator(content, last - first, offset=first, threads=gen_threads,
                                        chunk_size=request)
            gens[first].fill_chunk(expected[:c.nbytes])
            got = c.data if c.data is not None else c.buffer
            first = first_difference(got[:c.nbytes], expected[:c.nbytes])
            if first >= 0:
                raise VerificationError(f"{backend.uri(path)} differs from the written data at byte "
                                        f"offset {c.offset + first}")

        def consume(c: Chunk) -> None:
            if content is not None:
                started = time.time() if verified else 0.0
                verify(c)
                if verified:
                    verified(c.offset, c.nbytes, started)
            if deliver is not None:
                deliver(c.offset, (c.data if c.data is not None else c.buffer)[:c.nbytes])
            if progress:
                progress(c.nbytes)
        single = len(ranges) == 1 and not cuts and end - offset <= request - offset % request
        chunks = pipeline.run(pool, [_sequential(s, e, request, read, cuts) for s, e in ranges], consume, single)
        if reader.lends_memory and reader.size != size:  # asked for while the reads ran
            raise VerificationError(f"{backend.uri(path)} has {reader.size} bytes, expected {size}")
    finally:
        reader.close()
    stats.end = time.time()
    _record(stats, chunks, "consumer" if content is not None else None)
    return stats
