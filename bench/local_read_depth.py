"""O_DIRECT reads of one 2 GiB file with 1 to 16 requests in flight, of 8 or
32 MiB each, interleaved rounds: does a local disk gain from more than one
read in flight per rank? With --writes, the same question for O_DIRECT writes
(pwrite of unique bytes from threads over contiguous ranges, fsync at the end).

    python bench/local_read_depth.py DIR [--rounds 3] [--writes] [--mib 2048]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import BenchTable  # noqa: E402
from raw_rank_common import Content  # noqa: E402

from dlio_ckpt_ext.engine.buffers import allocate  # noqa: E402

SIZE = 2 << 30
CASES = [(32 << 20, 1), (8 << 20, 1), (8 << 20, 2), (8 << 20, 4), (8 << 20, 8), (8 << 20, 16), (32 << 20, 4)]


def prepare(path: str) -> None:
    if os.path.exists(path) and os.path.getsize(path) == SIZE:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    buf = allocate(32 << 20)
    buf.write(os.urandom(32 << 20))
    for _ in range(SIZE // (32 << 20)):
        os.write(fd, buf)
    os.fsync(fd)
    os.close(fd)


def read_rate(path: str, request: int, in_flight: int) -> float:
    """GiB/s reading the whole file, in_flight threads over contiguous ranges."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    bufs = [allocate(request) for _ in range(in_flight)]
    offsets = list(range(0, SIZE, request))
    per = -(-len(offsets) // in_flight)

    def reader(i: int) -> None:
        for off in offsets[i * per:(i + 1) * per]:
            os.preadv(fd, [bufs[i]], off)

    t0 = time.time()
    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(reader, range(in_flight)))
    seconds = time.time() - t0
    os.close(fd)
    return SIZE / 2**30 / seconds


WRITE_CASES = [(32 << 20, 1), (32 << 20, 2), (32 << 20, 4), (8 << 20, 4), (8 << 20, 16)]


def write_rate(path: str, data: memoryview, request: int, in_flight: int) -> float:
    """GiB/s writing data to a new file, in_flight threads over contiguous ranges."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    offsets = list(range(0, len(data), request))
    per = -(-len(offsets) // in_flight)

    def writer(i: int) -> None:
        for off in offsets[i * per:(i + 1) * per]:
            os.pwrite(fd, data[off:off + request], off)

    t0 = time.time()
    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(writer, range(in_flight)))
    os.fsync(fd)
    seconds = time.time() - t0
    os.close(fd)
    os.unlink(path)
    return len(data) / 2**30 / seconds


def writes(args) -> None:
    content = Content([SIZE // 2])
    rates: dict[tuple[int, int], list[float]] = {c: [] for c in WRITE_CASES}
    for r in range(args.rounds):
        for i, case in enumerate(WRITE_CASES if r % 2 == 0 else WRITE_CASES[::-1]):
            content.refill(seed=r * 100 + i)  # unique bytes each time: this disk writes repeats slower
            rates[case].append(write_rate(os.path.join(args.dir, "write_depth.bin"), content.file(0), *case))
    report(args, "write", rates, f"{SIZE // 2 >> 20} MiB file, unique bytes from threads, fsync at the end")


def main() -> None:
    global SIZE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writes", action="store_true", help="measure writes (half the file) instead of reads")
    ap.add_argument("--mib", type=int, default=SIZE >> 20, help="the file's MiB (a multiple of 64)")
    ap.add_argument("--json", help="also save the table here (bench/results/local_read_depth-reads.json or "
                                   "-writes.json for the docs)")
    args = ap.parse_args()
    if args.mib < 64 or args.mib % 64:
        ap.error("--mib takes a multiple of 64")
    SIZE = args.mib << 20
    if args.writes:
        writes(args)
        return
    path = os.path.join(args.dir, "read_depth.bin")
    prepare(path)
    rates: dict[tuple[int, int], list[float]] = {c: [] for c in CASES}
    for r in range(args.rounds):
        for case in (CASES if r % 2 == 0 else CASES[::-1]):
            rates[case].append(read_rate(path, *case))
    os.unlink(path)
    report(args, "read", rates, f"{SIZE >> 20} MiB file, threads issuing `preadv`")


def report(args, what: str, rates: dict[tuple[int, int], list[float]], setting: str) -> None:
    table = BenchTable("local_read_depth", f"Local O_DIRECT {what}s by requests in flight ({setting}; buffers from "
                       f"`allocate`; median of {args.rounds} interleaved rounds)",
                       ["request size", "in flight", "GiB/s (median)", "every round"])
    for (request, in_flight), values in rates.items():
        table.add(f"{request >> 20} MiB", in_flight, f"{statistics.median(values):.2f}", [round(v, 2) for v in values])
    table.finish(args.json, {f"{r}x{n}": v for (r, n), v in rates.items()})


if __name__ == "__main__":
    main()
