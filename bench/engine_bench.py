#!/usr/bin/env python3
"""Streaming engine vs the fastest simple way to move the same bytes, same disk, same run.

Interleaves (A B A B ...) our engine against a raw reference for writes
(O_DIRECT, and buffered + fsync) and reads (O_DIRECT), prints the median
of the per-pair ratios, the generation capacity ratio (fill-only GiB/s over
the engine's I/O GiB/s) and the peak RSS of the engine writing a file many
times the pool size. Rerun it on your machine; absolute figures swing, the
ratios are what it is for.

    python bench/engine_bench.py --dir /mnt/fs/bench --size 4GiB --reps 3
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time

import dgen_py
from tqdm import tqdm

from bench_table import BenchTable
from dlio_ckpt_ext.config import parse_size
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, load_file, save_file
from dlio_ckpt_ext.engine.buffers import allocate
from dlio_ckpt_ext.engine.threads import gen_thread_budget, unbound_share
from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions

GiB = float(1 << 30)


_raw_buffers: list[mmap.mmap] = []


def raw_buffers(chunk: int, depth: int) -> list[mmap.mmap]:
    """The reference's aligned buffers, allocated and filled once and reused
    like the engine's pool (fresh and long-lived pages differ for DMA in a VM)."""
    if not _raw_buffers:
        gen = dgen_py.Generator(size=chunk * depth, seed=1)
        for _ in range(depth):
            buf = allocate(chunk)
            gen.fill_chunk(buf)
            _raw_buffers.append(buf)
    return _raw_buffers


def raw_write(path: str, size: int, chunk: int, direct: bool, depth: int = 4) -> float:
    """Reference: pre-filled aligned buffers written with os.write, then fsync.
    Timed like the engine: open (truncating the previous file) to close."""
    bufs = raw_buffers(chunk, depth)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
    done, i = 0, 0
    while done < size:
        n = min(chunk, size - done)
        view = memoryview(bufs[i % depth])[:n]
        while len(view):
            view = view[os.write(fd, view):]
        done += n
        i += 1
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return size / GiB / (time.perf_counter() - t0)


def raw_read(path: str, chunk: int, depth: int) -> float:
    """Reference: sequential O_DIRECT preadv into `depth` aligned buffers."""
    bufs = raw_buffers(chunk, depth)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    size = os.fstat(fd).st_size
    off, i = 0, 0
    while off < size:
        n = os.preadv(fd, [bufs[i % depth]], off)
        i += 1
        if n <= 0:
            break
        off += n
    os.close(fd)
    return size / GiB / (time.perf_counter() - t0)


PROGRESS_SHARE: list[float] = []  # time inside progress-bar updates / write time


def engine_write(backend: PosixBackend, size: int, pool: BufferPool, threads: int,
                 progress: bool = False) -> tuple[float, float]:
    """Our engine; with progress, a tqdm bar updated per chunk as rank 0 does
    on a terminal (drawn to /dev/null here, at the same cost)."""
    if progress:
        spent = [0.0]

        def update(n: int) -> None:
            t0 = time.perf_counter()
            bar.update(n)
            spent[0] += time.perf_counter() - t0
        with open(os.devnull, "w") as sink, tqdm(total=size, unit="B", unit_scale=True, file=sink) as bar:
            st = save_file(backend, "engine.bin", size, ContentSpec(12345), pool, threads, update)
        PROGRESS_SHARE.append(spent[0] / st.elapsed)
    else:
        st = save_file(backend, "engine.bin", size, ContentSpec(12345), pool, threads)
    return size / GiB / st.elapsed, size / GiB / (st.io_s + st.close_s)


def engine_read(backend: PosixBackend, size: int, pool: BufferPool, verify: bool, threads: int) -> float:
    st = load_file(backend, "engine.bin", size, pool, ContentSpec(12345) if verify else None, 1, threads)
    return size / GiB / st.elapsed


def fill_only(size: int, pool: BufferPool, threads: int) -> float:
    """Pure generation rate into the pool's buffers, no I/O."""
    gen = dgen_py.Generator(size=size, seed=7, max_threads=threads, chunk_size=pool.buffer_size)
    t0 = time.perf_counter()
    done, i = 0, 0
    while done < size:
        done += gen.fill_chunk(memoryview(pool.buffers[i % pool.depth])[:min(pool.buffer_size, size - done)])
        i += 1
    return size / GiB / (time.perf_counter() - t0)


def fio_write(path: str, size: int, chunk: int) -> float | None:
    """fio writing a new file with O_DIRECT + end fsync, timed by wall clock:
    fio's own runtime leaves out the final fsync and file set-up, which the
    engine's figure includes (fio's start-up, a few ms, is counted against it)."""
    if not shutil.which("fio"):
        return None
    t0 = time.perf_counter()
    if os.path.exists(path):  # the others truncate their previous file inside their timing too
        os.unlink(path)
    subprocess.run(["fio", "--name=w", f"--filename={path}", "--rw=write", f"--bs={chunk}", "--direct=1",
                    f"--size={size}", "--end_fsync=1", "--ioengine=psync", "--fallocate=none",
                    "--output-format=json"], capture_output=True, check=True)
    return size / GiB / (time.perf_counter() - t0)


# VmHWM, not ru_maxrss: Linux carries ru_maxrss across execve, so a child
# would report its parent's peak.
RSS_CHILD = """
import sys
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, save_file
from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions
def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
root, size, chunk, depth, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
base = hwm()
pool = BufferPool(depth, chunk)
st = save_file(PosixBackend(root, PosixOptions()), "rss.bin", size, ContentSpec(99), pool, threads)
print(base, hwm(), st.elapsed)
"""


def peak_rss(root: str, size: int, chunk: int, depth: int, threads: int) -> dict:
    """Peak RSS of a fresh process writing `size` bytes through the engine."""
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, root, str(size), str(chunk), str(depth), str(threads)],
                         capture_output=True, text=True, check=True).stdout.split()
    os.unlink(os.path.join(root, "rss.bin"))
    base, peak, elapsed = int(out[0]), int(out[1]), float(out[2])
    return {"file_bytes": size, "pool_bytes": chunk * depth, "rss_before_pool": base, "peak_rss": peak,
            "peak_minus_pool_mib": (peak - chunk * depth) / 2**20, "gib_s": size / GiB / elapsed}


def median_ratio(pairs: list[tuple[float, float]]) -> float:
    return statistics.median(a / b for a, b in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="bench_data", help="scratch directory on the file system to measure")
    ap.add_argument("--size", default="4GiB", help="file size per measurement")
    ap.add_argument("--reps", type=int, default=3, help="A/B pairs per comparison")
    ap.add_argument("--chunk", default="32MiB")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="generator threads (0: usable CPUs, one rank)")
    ap.add_argument("--rss-size", default="16GiB", help="file size for the peak RSS measurement (0: skip)")
    ap.add_argument("--json", help="also save the table here (bench/results/engine_bench.json for the docs)")
    args = ap.parse_args()
    size, chunk = parse_size("--size", args.size), parse_size("--chunk", args.chunk)
    threads = gen_thread_budget(unbound_share(1), args.threads)
    os.makedirs(args.dir, exist_ok=True)
    pool = BufferPool(args.depth, chunk)
    direct = PosixBackend(args.dir, PosixOptions())
    buffered = PosixBackend(args.dir, PosixOptions(write_mode="buffered", read_mode="buffered"))
    raw_path = os.path.join(args.dir, "raw.bin")
    res: dict = {"size": size, "chunk": chunk, "depth": args.depth, "threads": threads, "reps": args.reps}

    io_rates: list[float] = []

    def eng_write(backend, gen_threads=threads, progress=False):
        rate, io = engine_write(backend, size, pool, gen_threads, progress)
        if backend is direct and gen_threads == threads and not progress:
            io_rates.append(io)  # the I/O rate the generation capacity is compared with
        return rate

    engine_path = os.path.join(args.dir, "engine.bin")
    warm_cache = lambda: raw_write(raw_path, size, chunk, False, args.depth)  # noqa: E731
    cases = {  # name: (engine, reference, warm-up before the pair or None); reads share one file
        "write_direct": (lambda: eng_write(direct), lambda: raw_write(raw_path, size, chunk, True, args.depth), None),
        "read_direct": (lambda: engine_read(direct, size, pool, False, threads),
                        lambda: raw_read(engine_path, chunk, args.depth), None),
        "read_verified": (lambda: engine_read(direct, size, pool, True, threads),
                          lambda: raw_read(engine_path, chunk, args.depth), None),
        # In a VM the first buffered write after a while is several times slower
        # than the next (fresh page-cache memory): warm it up before each pair.
        "write_buffered": (lambda: eng_write(buffered), lambda: raw_write(raw_path, size, chunk, False, args.depth),
                           warm_cache),
    }
    if threads > 1:
        # on a small VM the generator's CPU slows the storage path itself: show one thread too
        cases["write_direct_1_thread"] = (lambda: eng_write(direct, 1),
                                          lambda: raw_write(raw_path, size, chunk, True, args.depth), None)
    cases["progress_bar"] = (lambda: eng_write(direct, progress=True), lambda: eng_write(direct), None)
    if shutil.which("fio"):
        cases["write_fio"] = (lambda: eng_write(direct), lambda: fio_write(raw_path, size, chunk), None)
    pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    # One discarded warm-up round, then pairs in A B / B A order.
    for rep in range(args.reps + 1):
        for name, (engine, reference, warm_up) in cases.items():
            if warm_up and rep:
                warm_up()
            if rep % 2:
                b, a = reference(), engine()
            else:
                a, b = engine(), reference()
            if rep:
                pairs[name].append((a, b))
        if rep:
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1][0]:.2f} vs {v[-1][1]:.2f}" for k, v in pairs.items()),
                  flush=True)
    w_direct, w_buf, reads, reads_verify = (pairs[k] for k in ("write_direct", "write_buffered", "read_direct",
                                                                "read_verified"))
    fio = pairs.get("write_fio", [])
    gen = [fill_only(size, pool, threads) for _ in range(args.reps)]
    gen_1 = [fill_only(size, pool, 1) for _ in range(args.reps)]
    os.unlink(raw_path)
    os.unlink(os.path.join(args.dir, "engine.bin"))

    res["write_direct_ratio"] = median_ratio(w_direct)
    res["write_buffered_fsync_ratio"] = median_ratio(w_buf)
    res["read_direct_ratio"] = median_ratio(reads)
    res["read_verified_ratio"] = median_ratio(reads_verify)
    res["write_vs_fio_ratio"] = median_ratio(fio) if fio else None
    res["generation_gib_s"] = statistics.median(gen)
    res["engine_io_gib_s"] = statistics.median(io_rates)
    res["generation_capacity_ratio"] = res["generation_gib_s"] / res["engine_io_gib_s"]
    res["generation_1_thread_gib_s"] = statistics.median(gen_1)
    res["generation_1_thread_capacity_ratio"] = res["generation_1_thread_gib_s"] / res["engine_io_gib_s"]
    res["pair_ratios"] = {k: median_ratio(v) for k, v in pairs.items()}
    res["medians_gib_s"] = {k: [statistics.median(a for a, _ in v), statistics.median(b for _, b in v)]
                            for k, v in (("write_direct", w_direct), ("write_buffered", w_buf),
                                         ("read_direct", reads), ("read_verified", reads_verify))}
    rss_size = parse_size("--rss-size", args.rss_size)
    if rss_size:
        res["rss"] = peak_rss(args.dir, rss_size, chunk, args.depth, threads)
    pool.close()

    res["progress_bar_time_share"] = statistics.median(PROGRESS_SHARE)
    table = BenchTable("engine_bench", f"Engine and POSIX backend against raw I/O, one rank, {size / GiB:.0f} GiB "
                       f"files, pool {args.depth} x {chunk >> 20} MiB", ["measure", "value", "target"])
    table.add("write O_DIRECT + fsync: engine / raw `os.write` of pre-filled aligned buffers (median of "
              f"{args.reps} interleaved pairs)", f"{res['write_direct_ratio']:.3f}", ">= 0.95")
    if "write_direct_1_thread" in pairs:
        table.add("same, engine with 1 generator thread", f"{res['pair_ratios']['write_direct_1_thread']:.3f}", "")
    if fio:
        table.add("write O_DIRECT: engine / fio (wall clock)", f"{res['write_vs_fio_ratio']:.3f}", "")
    table.add("write buffered + fsync: engine / raw `os.write`", f"{res['write_buffered_fsync_ratio']:.3f}", "")
    table.add("read O_DIRECT: engine / raw `preadv`", f"{res['read_direct_ratio']:.3f}", ">= 0.95")
    table.add("read O_DIRECT verifying every byte: engine / raw `preadv`", f"{res['read_verified_ratio']:.3f}", "")
    table.add(f"generation capacity: fill-only GiB/s / engine I/O GiB/s ({res['generation_gib_s']:.2f} / "
              f"{res['engine_io_gib_s']:.2f}, {threads} threads)", f"{res['generation_capacity_ratio']:.2f}x", ">= 3x")
    table.add("same with 1 generator thread", f"{res['generation_1_thread_capacity_ratio']:.2f}x", "")
    table.add("progress bar: engine with tqdm updated per chunk / without", f"{res['pair_ratios']['progress_bar']:.3f}",
              "")
    table.add("progress bar: time inside its updates / write time", f"{100 * res['progress_bar_time_share']:.2f} %",
              "< 1 %")
    if rss_size:
        r = res["rss"]
        table.add(f"peak RSS writing a {rss_size >> 30} GiB file (pool {r['pool_bytes'] >> 20} MiB)",
                  f"{r['peak_rss'] / 2**20:.0f} MiB = pool + {r['peak_minus_pool_mib']:.0f} MiB", "<= pool + 150 MiB")
    table.note(f"Absolute rates (medians, engine / reference, GiB/s): " + ", ".join(
        f"{k} {a:.2f} / {b:.2f}" for k, (a, b) in res["medians_gib_s"].items()) + ".")
    table.finish(args.json, res)

if __name__ == "__main__":
    main()
