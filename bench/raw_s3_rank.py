"""One rank of the raw s3dlio reference for bench/remote_bench.py (run under mpirun).

Writes the given object sizes (unique bytes generated before each checkpoint,
raw_rank_common.Content; MultipartUploadWriter with
--write-in-flight parts) --writes times, then reads them back --reads times
with --read-in-flight ranged GETs of --read-size, a barrier before each
checkpoint as in the benchmark; prints one JSON line per rank: per checkpoint
(start, end) and peak RSS.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import s3dlio
from mpi4py import MPI
from raw_rank_common import Content, parser, run


def main() -> None:
    ap = parser("--root", "s3://bucket/prefix")
    ap.add_argument("--part-size", type=int, default=32 << 20)
    ap.add_argument("--write-in-flight", type=int, default=8)
    ap.add_argument("--read-size", type=int, default=8 << 20)
    ap.add_argument("--read-in-flight", type=int, default=16)
    ap.add_argument("--concurrent-files", action="store_true",
                    help="upload a checkpoint's files at the same time (each with --write-in-flight parts)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in args.sizes.split(",")]
    content = Content(sizes)

    def name(step: int, i: int) -> str:
        return f"{args.root}/step{step}/rank{comm.rank}_{i}"

    def save(step: int) -> None:
        def upload(i: int) -> None:
            w = s3dlio.MultipartUploadWriter.from_uri(name(step, i), part_size=args.part_size,
                                                      max_in_flight=args.write_in_flight)
            data = content.file(i)
            for off in range(0, sizes[i], args.part_size):
                w.write(data[off:off + args.part_size], copy=True)
            w.close()
        if args.concurrent_files:
            with ThreadPoolExecutor(len(sizes)) as uploads:
                list(uploads.map(upload, range(len(sizes))))
        else:
            for i in range(len(sizes)):
                upload(i)

    def load(step: int, pool: ThreadPoolExecutor) -> None:
        for i, size in enumerate(sizes):
            uri = name(step, i)
            offsets = range(0, size, args.read_size)
            got = sum(pool.map(lambda o: len(s3dlio.get_range(uri, o, min(args.read_size, size - o))), offsets))
            assert got == size, (uri, got, size)

    run(comm, args, content, save, load, lambda step, i: s3dlio.delete(name(step, i)))

if __name__ == "__main__":
    main()
