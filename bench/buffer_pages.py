"""What the memory behind the buffers does to O_DIRECT on one disk, side by side.

    python bench/buffer_pages.py --dir /work/bench_data [--size 2432MiB] [--rounds 6] [--settle 2]

Writes (and the engine also reads back) one file per measurement, in rounds
whose order rotates, with each of:
  engine       our engine, buffers from buffers.allocate (private, huge pages asked for)
  engine-shm   our engine, buffers mapped as plain mmap(-1, n) (shared, 4 KiB pages):
               how the engine mapped them before
  raw          pre-generated unique bytes in one allocate() area, os.write of 32 MiB
  raw-shm      the same from a plain mmap(-1, n) area
and prints, per measurement, GiB/s and the average size of the write (read)
requests the block device received (from its /sys stat counters), then the
medians and their ratios. The device splits a request wherever its
scatter-gather list runs out (max_segments, printed): scattered 4 KiB pages
cost a segment each, a huge page one per 2 MiB.
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time

import dgen_py
import numpy as np

from bench_table import BenchTable

from dlio_ckpt_ext.config import parse_size
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, load_file, save_file
from dlio_ckpt_ext.engine.buffers import allocate, huge_page_bytes, thp_setting
from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions

GiB = float(1 << 30)
CHUNK = 32 << 20
DEPTH = 4
# fields of /sys/block/<dev>/stat (the kernel's Documentation/block/stat.rst)
READ_IOS, READ_SECTORS, WRITE_IOS, WRITE_SECTORS = 0, 2, 4, 6


def shared_map(size: int) -> mmap.mmap:
    """A buffer the way Python maps anonymous memory by default: shared."""
    buf = mmap.mmap(-1, size)
    np.frombuffer(buf, dtype=np.uint8).fill(0)
    return buf


class SharedPool(BufferPool):
    def _allocate(self, size: int = 0) -> mmap.mmap:
        return shared_map(size or self.buffer_size)


def device_stat(path: str) -> tuple[str, list[int]]:
    """The block device holding `path` and its I/O counters (see the kernel's block/stat docs)."""
    dev = os.stat(path).st_dev
    sysdir = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    with open(f"{sysdir}/stat") as fh:
        return sysdir, [int(x) for x in fh.read().split()]


def request_kib(before: list[int], after: list[int], ios: int, sectors: int) -> float:
    n = after[ios] - before[ios]
    return (after[sectors] - before[sectors]) * 512 / 1024 / n if n else 0.0


def raw_write(path: str, area: mmap.mmap) -> None:
    view = memoryview(area)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    for off in range(0, len(area), CHUNK):
        os.write(fd, view[off:off + CHUNK])
    os.fsync(fd)
    os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="scratch directory on the disk to measure")
    ap.add_argument("--size", default="2432MiB", help="bytes per measurement (rounded down to 32 MiB)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of idle disk before each measurement")
    ap.add_argument("--json", help="also save the table here (bench/results/buffer_pages.json for the docs)")
    args = ap.parse_args()
    size = parse_size("--size", args.size) // CHUNK * CHUNK
    os.makedirs(args.dir, exist_ok=True)
    sysdir, _ = device_stat(args.dir)
    disk = os.path.realpath(sysdir)
    queue_dir = next(d for d in (disk, os.path.dirname(disk)) if os.path.exists(f"{d}/queue"))
    limits = {}
    for key in ("max_segments", "max_sectors_kb"):
        with open(f"{queue_dir}/queue/{key}") as fh:
            limits[key] = fh.read().strip()
    print(f"device {os.path.basename(disk)}: {limits}; transparent huge pages: {thp_setting()}")

    backend = PosixBackend(args.dir, PosixOptions())
    pools = {"engine": (BufferPool(DEPTH, CHUNK), BufferPool(DEPTH + 2, 8 << 20)),
             "engine-shm": (SharedPool(DEPTH, CHUNK), SharedPool(DEPTH + 2, 8 << 20))}
    areas = {"raw": allocate(size), "raw-shm": shared_map(size)}
    names = list(pools) + list(areas)
    rates: dict[str, dict[str, list[float]]] = {n: {"write": [], "read": []} for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seed = 1000 * r + names.index(name) + 1
            if name in areas:  # unique bytes, generated before the window
                gen = dgen_py.Generator(size=size, seed=seed, max_threads=1, chunk_size=CHUNK)
                view = memoryview(areas[name])
                for off in range(0, size, CHUNK):
                    gen.fill_chunk(view[off:off + CHUNK])
            os.sync()
            time.sleep(args.settle)
            _, before = device_stat(args.dir)
            t0 = time.perf_counter()
            if name in areas:
                raw_write(os.path.join(args.dir, "f"), areas[name])
            else:
                save_file(backend, "f", size, ContentSpec(seed=seed), pools[name][0], gen_threads=1)
            dt = time.perf_counter() - t0
            _, after = device_stat(args.dir)
            rates[name]["write"].append(size / dt / GiB)
            kib = request_kib(before, after, WRITE_IOS, WRITE_SECTORS)
            line = f"round {r} {name:10s} write {size / dt / GiB:5.2f} GiB/s ({kib:5.0f} KiB requests)"
            if name in pools:
                time.sleep(args.settle)
                _, before = device_stat(args.dir)
                t0 = time.perf_counter()
                load_file(backend, "f", size, pools[name][1], parallelism=DEPTH, request_size=8 << 20)
                dt = time.perf_counter() - t0
                _, after = device_stat(args.dir)
                rates[name]["read"].append(size / dt / GiB)
                kib = request_kib(before, after, READ_IOS, READ_SECTORS)
                line += f"  read {size / dt / GiB:5.2f} GiB/s ({kib:5.0f} KiB requests)"
            print(line, flush=True)
    os.unlink(os.path.join(args.dir, "f"))

    med = {n: {k: statistics.median(v) if v else None for k, v in rates[n].items()} for n in names}
    ours = sum(pool.nbytes for pool in pools["engine"]) + len(areas["raw"])
    table = BenchTable("buffer_pages", f"Buffer memory: engine and raw writes from huge-page (`allocate`) and shared-map "
                       f"buffers, {size / GiB:.1f} GiB file per measurement, 1 generator thread, median of "
                       f"{args.rounds} rotated rounds", ["measure", "ratio"])
    ratios = {"write: engine, huge-page buffers / engine, shared-map buffers": ("engine", "engine-shm", "write"),
              "read (4 x 8 MiB in flight): engine, huge-page / shared-map buffers": ("engine", "engine-shm", "read"),
              "write: engine / raw `os.write` of pre-generated bytes, both from `allocate`d memory":
                  ("engine", "raw", "write"),
              "write: engine / raw, both from shared maps": ("engine-shm", "raw-shm", "write"),
              "write: raw from `allocate`d / from a shared map": ("raw", "raw-shm", "write")}
    for label, (a, b, phase) in ratios.items():
        table.add(label, f"{med[a][phase] / med[b][phase]:.3f}")
    table.note(f"Huge pages behind the `allocate`d buffers (engine pools, raw area): {(huge_page_bytes() or 0) >> 20} "
               f"of {ours >> 20} MiB. Medians, GiB/s: " + ", ".join(
                   f"{n} write {med[n]['write']:.2f}" + (f" read {med[n]['read']:.2f}" if med[n]["read"] else "")
                   for n in names) + ".")
    table.finish(args.json, {"medians_gib_s": med})

if __name__ == "__main__":
    main()
