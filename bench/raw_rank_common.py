"""What the raw reference ranks (raw_posix_rank.py, raw_s3_rank.py) share."""
from __future__ import annotations

import argparse
import json
import mmap
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import dgen_py

from dlio_ckpt_ext.engine.buffers import allocate
from dlio_ckpt_ext.engine.profile import process_usage, usage_since

PAGE = mmap.PAGESIZE
CHUNK = 32 << 20


class Content:
    """One rank's files, unique bytes, regenerated before each checkpoint
    (outside the timed window), each file at a page-aligned offset.

    A reference that writes one repeated block is not a fair one: on this
    VM's disk a repeated 32 MiB block wrote 1.44x slower than unique data
    (the storage below dedupes or hashes), which made the engine look faster
    than raw O_DIRECT. The engine writes unique dgen-py bytes; so does this,
    from memory mapped as the engine maps its buffers (buffers.allocate: on
    this VM memory of other pages wrote at other request sizes)."""

    def __init__(self, sizes: list[int]) -> None:
        self.offsets, total = [], 0
        for size in sizes:
            self.offsets.append((total, size))
            total += -(-size // PAGE) * PAGE
        self.area = allocate(max(total, PAGE))

    def refill(self, seed: int) -> None:
        gen = dgen_py.Generator(size=len(self.area), seed=seed, max_threads=1, chunk_size=CHUNK)
        view = memoryview(self.area)
        for off in range(0, len(view), CHUNK):
            gen.fill_chunk(view[off:off + CHUNK])

    def file(self, i: int) -> memoryview:
        start, size = self.offsets[i]
        return memoryview(self.area)[start:start + size]


def parser(target: str, target_help: str) -> argparse.ArgumentParser:
    """The options every raw rank takes: where, what sizes, how many checkpoints."""
    ap = argparse.ArgumentParser()
    ap.add_argument(target, required=True, help=target_help)
    ap.add_argument("--sizes", required=True, help="comma-separated sizes of one rank's files or objects")
    ap.add_argument("--writes", type=int, default=2)
    ap.add_argument("--reads", type=int, default=2)
    return ap


def timed(comm, count: int, checkpoint: Callable[[int], None], usage: list[dict],
          prepare: Callable[[int], None] = lambda step: None) -> list[tuple[float, float]]:
    """Per checkpoint 1..count: prepare(step) untimed, a barrier, then the
    checkpoint timed on this rank: (start, end) each, as the benchmark times,
    and the process's CPU and minor faults in that window appended to usage."""
    spans = []
    for step in range(1, count + 1):
        prepare(step)
        comm.barrier()
        t0, before = time.time(), process_usage()
        checkpoint(step)
        spans.append((t0, time.time()))
        usage.append(usage_since(before))
    return spans


def hwm() -> int:
    """Peak resident memory of this process (VmHWM)."""
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))


def finish(comm, out: dict, writes: int, count: int, delete: Callable[[int, int], None]) -> None:
    """After the last checkpoint: every rank deletes what it wrote, then prints its record."""
    comm.barrier()
    for step in range(1, writes + 1):
        for i in range(count):
            delete(step, i)
    out["peak_rss_bytes"] = hwm()
    print(json.dumps(out), flush=True)


def run(comm, args, content: Content, save: Callable[[int], None],
        load: Callable[[int, ThreadPoolExecutor], None], delete: Callable[[int, int], None]) -> None:
    """The whole raw rank: --writes saves (content regenerated before each,
    untimed), --reads loads with a pool of --read-in-flight threads, then finish."""
    out = {"rank": comm.rank, "usage": {"save": [], "load": []}}
    out["save"] = timed(comm, args.writes, save, out["usage"]["save"],
                        lambda step: content.refill(seed=step * 1000 + comm.rank))
    with ThreadPoolExecutor(args.read_in_flight) as pool:
        out["load"] = timed(comm, args.reads, lambda step: load(step, pool), out["usage"]["load"])
    finish(comm, out, args.writes, len(content.offsets), delete)
