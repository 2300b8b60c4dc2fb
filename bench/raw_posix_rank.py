"""One rank of the raw O_DIRECT reference for bench/local_bench.py (run under mpirun).

Writes the given file sizes from pre-filled page-aligned buffers (os.write,
O_DIRECT, the unaligned tail buffered, fsync before close) --writes times,
then reads them back with O_DIRECT preadv --reads times, a barrier before
each checkpoint as in the benchmark; prints one JSON line per rank: per
checkpoint (start, end) and peak RSS.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import time

from mpi4py import MPI
from raw_rank_common import finish, parser

PAGE = mmap.PAGESIZE


def write_file(path: str, size: int, buf: mmap.mmap, chunk: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    view = memoryview(buf)
    for off in range(0, size, chunk):
        n = min(chunk, size - off)
        if n % PAGE:  # the unaligned tail goes through the page cache, as the engine does
            aligned = n - n % PAGE
            if aligned:
                os.write(fd, view[:aligned])
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            os.write(fd, view[aligned:n])
        else:
            os.write(fd, view[:n])
    os.fsync(fd)
    os.close(fd)


def read_file(path: str, size: int, buf: mmap.mmap, chunk: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    for off in range(0, size, chunk):
        os.preadv(fd, [buf], off)
    os.close(fd)


def main() -> None:
    ap = parser("--dir", "directory on the disk to measure")
    ap.add_argument("--chunk", type=int, default=32 << 20)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in args.sizes.split(",")]
    buf = mmap.mmap(-1, args.chunk)
    buf.write(os.urandom(args.chunk))
    out = {"rank": comm.rank, "save": [], "load": []}

    def name(step: int, i: int) -> str:
        os.makedirs(f"{args.dir}/step{step}", exist_ok=True)
        return f"{args.dir}/step{step}/rank{comm.rank}_{i}"

    for phase, count, action in (("save", args.writes, write_file), ("load", args.reads, read_file)):
        for step in range(1, count + 1):
            comm.barrier()
            t0 = time.time()
            for i, size in enumerate(sizes):
                action(name(step, i), size, buf, args.chunk)
            out[phase].append((t0, time.time()))
    finish(comm, out, args.writes, len(sizes), lambda step, i: os.unlink(name(step, i)))


if __name__ == "__main__":
    main()
