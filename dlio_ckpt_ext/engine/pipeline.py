"""Two-stage producer/consumer pipeline over a BufferPool.

A buffer is in exactly one place at a time: the free queue, a producer, the
filled queue or the consumer, so no buffer is refilled before it has been
consumed. Producers and the consumer are threads (dgen-py fills and file or
s3dlio I/O release the GIL); nothing here forks.
Each stage's work is timed apart from its queue waits, so the ratio of the
two stages' work times is their real capacity ratio.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from dlio_ckpt_ext.engine.buffers import BufferPool


@dataclass
class Chunk:
    """One buffer's worth of a file, with the time each stage spent on it."""
    offset: int
    nbytes: int
    produce_s: float = 0.0
    consume_s: float = 0.0
    wait_free_s: float = 0.0    # producer waiting for an empty buffer
    wait_filled_s: float = 0.0  # consumer waiting for a full buffer
    produced_at: float = 0.0    # wall clock when the producer finished it
    done_at: float = 0.0        # wall clock when the consumer finished it
    buffer: Optional[memoryview] = None
    data: Optional[memoryview] = None  # the bytes, when a reader lent them instead of filling buffer


# A producer gets an empty buffer and returns the Chunk it put there, or None
# when it has nothing more to produce.
Producer = Callable[[memoryview], Optional[Chunk]]
Consumer = Callable[[Chunk], None]

_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def run(pool: BufferPool, producers: list[Producer], consume: Consumer, inline: bool = False) -> list[Chunk]:
    """Run the producers (one thread each) against one consumer (this thread).

    Returns the chunk records in consumption order. The first exception of any
    stage stops every stage and is re-raised here. inline: one producer, run
    in this thread, each chunk consumed as it is made: for a single request,
    where a thread and two queues only cost (a chunked restore reads many).
    """
    if not pool.buffers:
        raise ValueError("the pipeline needs a pool with at least one buffer")
    if inline:
        return _run_inline(memoryview(pool.buffers[0]), producers, consume)
    free: queue.Queue = queue.Queue()
    filled: queue.Queue = queue.Queue()
    for buf in pool.buffers:
        free.put(memoryview(buf))
    stop = threading.Event()

    def produce_loop(produce: Producer) -> None:
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                buf = free.get()
                t1 = time.perf_counter()
                if buf is None:
                    break
                chunk = produce(buf)
                t2 = time.perf_counter()
                if chunk is None:
                    free.put(buf)
                    break
                chunk.wait_free_s, chunk.produce_s, chunk.buffer = t1 - t0, t2 - t1, buf
                chunk.produced_at = time.time()
                filled.put(chunk)
            filled.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer thread
            filled.put(_Failure(exc))

    threads = [threading.Thread(target=produce_loop, args=(p,), daemon=True) for p in producers]
    for t in threads:
        t.start()
    chunks: list[Chunk] = []
    running = len(threads)
    try:
        while running:
            t0 = time.perf_counter()
            item = filled.get()
            t1 = time.perf_counter()
            if item is _DONE:
                running -= 1
                continue
            if isinstance(item, _Failure):
                raise item.exc
            item.wait_filled_s = t1 - t0
            consume(item)
            item.consume_s = time.perf_counter() - t1
            item.done_at = time.time()
            buf, item.buffer, item.data = item.buffer, None, None
            free.put(buf)
            chunks.append(item)
    finally:
        stop.set()
        for _ in threads:
            free.put(None)
        for t in threads:
            t.join()
    return chunks


def _run_inline(buf: memoryview, producers: list[Producer], consume: Consumer) -> list[Chunk]:
    (produce,) = producers
    chunks: list[Chunk] = []
    while True:
        t0 = time.perf_counter()
        chunk = produce(buf)
        t1 = time.perf_counter()
        if chunk is None:
            return chunks
        chunk.produce_s, chunk.buffer, chunk.produced_at = t1 - t0, buf, time.time()
        consume(chunk)
        chunk.consume_s, chunk.done_at = time.perf_counter() - t1, time.time()
        chunk.buffer, chunk.data = None, None
        chunks.append(chunk)
