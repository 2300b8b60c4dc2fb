"""One rank of the raw O_DIRECT reference for bench/local_bench.py (run under mpirun).

Writes the given file sizes from unique bytes generated before each checkpoint
(raw_rank_common.Content; os.write of 32 MiB, O_DIRECT, the unaligned tail
buffered, fsync before close) --writes times, then reads them back with
O_DIRECT preadv, --read-in-flight requests of --read-size at a time (threads),
--reads times, a barrier before each checkpoint as in the benchmark; prints
one JSON line per rank: per checkpoint (start, end) and peak RSS.
"""
from __future__ import annotations

import fcntl
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

from mpi4py import MPI

from dlio_ckpt_ext.engine.buffers import allocate
from raw_rank_common import PAGE, Content, parser, run


def write_file(path: str, data: memoryview, chunk: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    size = len(data)
    for off in range(0, size, chunk):
        view = data[off:off + chunk]
        n = len(view)
        if n % PAGE:  # the unaligned tail goes through the page cache, as the engine does
            aligned = n - n % PAGE
            if aligned:
                os.write(fd, view[:aligned])
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            os.write(fd, view[aligned:n])
        else:
            os.write(fd, view)
    os.fsync(fd)
    os.close(fd)


def read_file(path: str, size: int, bufs: list[mmap.mmap], pool: ThreadPoolExecutor) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    request = len(bufs[0])
    offsets = list(range(0, size, request))
    # one buffer per request in flight: request k uses buffer k mod depth
    list(pool.map(lambda k: os.preadv(fd, [bufs[k % len(bufs)]], offsets[k]), range(len(offsets))))
    os.close(fd)


def main() -> None:
    ap = parser("--dir", "directory on the disk to measure")
    ap.add_argument("--chunk", type=int, default=32 << 20)
    ap.add_argument("--read-size", type=int, default=8 << 20)
    ap.add_argument("--read-in-flight", type=int, default=16)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in args.sizes.split(",")]
    content = Content(sizes)
    bufs = [allocate(args.read_size) for _ in range(args.read_in_flight)]

    def name(step: int, i: int) -> str:
        os.makedirs(f"{args.dir}/step{step}", exist_ok=True)
        return f"{args.dir}/step{step}/rank{comm.rank}_{i}"

    def save(step: int) -> None:
        for i in range(len(sizes)):
            write_file(name(step, i), content.file(i), args.chunk)

    def load(step: int, pool: ThreadPoolExecutor) -> None:
        for i, size in enumerate(sizes):
            read_file(name(step, i), size, bufs, pool)

    run(comm, args, content, save, load, lambda step, i: os.unlink(name(step, i)))

if __name__ == "__main__":
    main()
