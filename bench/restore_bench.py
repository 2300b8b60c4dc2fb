"""Restores: each load pattern through our engine against a raw reference that
reads the same ranges with the same requests in flight, in one run.

    python bench/restore_bench.py [--storage local,remote] [--pairs 4] [--json bench/results/restore_bench.json]

A checkpoint is saved once per layout (DCP at 4 ranks; DeepSpeed ZeRO-1 with
2 pipeline stages at 4 ranks), then one loading rank's plan (load_plan) is
read per pattern: own (rank 1's files), DCP resharded to 3 ranks (rank 1:
.metadata and the saved items overlapping its rows, from inside files),
DeepSpeed framework (rank 2: its stage's layer files of replica 0, its own
partition) and DeepSpeed resharded to 2 ranks. Ours is Checkpointer.load
(verify off: what a storage figure measures); the reference reads the same
ranges in the same pieces (ending at multiples of read_size) with the same
requests in flight per range: preadv with O_DIRECT from a thread pool
locally (a range starting inside a page read from the page's start, as
ours), s3dlio get_range from a thread pool through the emulated remote link
(SeaweedFS behind dlio_ckpt_ext.tools.remote_link, 10 ms each way, 40 MB/s
per connection). Pairs are interleaved (A B / B A); the ratio is the
order-balanced one (bench/pairs.py). Target: >= 0.9 everywhere.
"""
from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_servers import link_of, seaweedfs  # noqa: E402
from bench_table import BenchTable  # noqa: E402
from pairs import check_pairs, interleaved  # noqa: E402

from omegaconf import OmegaConf  # noqa: E402

from dlio_ckpt_ext.checkpoint import universal  # noqa: E402
from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer  # noqa: E402
from dlio_ckpt_ext.config import load_config  # noqa: E402
from dlio_ckpt_ext.engine.buffers import PAGE, allocate  # noqa: E402

BUCKET = "restorebench"
#: (label, layout, parallelism, saved ranks, loading ranks, loading rank, pattern)
PATTERNS = [
    ("own (DCP, rank 1 of 4)", "dcp", {}, 4, 4, 1, "own"),
    ("framework, DCP resharded 4 -> 3 (rank 1)", "dcp", {}, 4, 3, 1, "framework"),
    ("framework, ZeRO-1 2 stages (rank 2: replica 1)", "deepspeed", {"pipeline": 2, "zero_stage": 1}, 4, 4, 2,
     "framework"),
    ("framework, ZeRO-1 resharded 4 -> 2 (rank 0)", "deepspeed", {"pipeline": 2, "zero_stage": 1}, 4, 2, 0,
     "framework"),
]


def config(args, root: str, storage_type: str, layout: str, parallelism: dict, ranks: int, **checkpoint):
    shape = {"num_layers": args.layers, "transformer": {
        "hidden_size": args.hidden, "ffn_hidden_size": args.hidden * 7 // 2, "vocab_size": args.vocab,
        "num_attention_heads": 8, "num_kv_heads": 2}, "parallelism": parallelism}
    options = {"read_mode": "direct"} if storage_type == "local_fs" else {}
    return load_config(OmegaConf.create({
        "model": shape, "streaming": {"read_size": f"{args.read_size >> 20}MiB", "chunk_size": "8MiB"},
        "storage": {"storage_type": storage_type, "storage_root": root, "storage_options": options},
        "checkpoint": {"checkpoint_folder": "ckpt", "layout": layout, **checkpoint}}), ranks)


def save(args, root: str, storage_type: str, layout: str, parallelism: dict, ranks: int) -> None:
    cfg = config(args, root, storage_type, layout, parallelism, ranks)
    writers = [Checkpointer(cfg, r, ranks, ranks) for r in range(ranks)]
    for ck in writers:
        ck.prepare()
        ck.save(1)
    for ck in writers:  # DCP's commit: rank 0's .metadata last
        ck._save_generated(ck.directory(1), ck.rank_plan(ck.rank).commit_files, None, 1)
        ck.close()


def pieces(offset: int, length: int, request: int) -> list[tuple[int, int]]:
    """The engine's pieces of a range: ending at multiples of request."""
    out, at, end = [], offset, offset + length
    while at < end:
        n = min(request - at % request, end - at)
        out.append((at, n))
        at += n
    return out


def groups(items: list, parallelism: int) -> list[list]:
    """Contiguous runs of items, `parallelism` of them at most, like the engine's ranges of a file."""
    per = max(1, -(-len(items) // parallelism))
    return [items[i:i + per] for i in range(0, len(items), per)]


class RawLocal:
    """preadv with O_DIRECT, one thread per contiguous part of a range (the engine's in flight)."""

    def __init__(self, request: int, parallelism: int) -> None:
        self.request, self.parallelism = request, parallelism
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(parallelism)

    def _buffer(self) -> mmap.mmap:
        if not hasattr(self.local, "buf"):
            self.local.buf = allocate(self.request)
        return self.local.buf

    def read(self, path: str, offset: int, length: int) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            def part(run: list[tuple[int, int]]) -> int:
                buf, got = self._buffer(), 0
                for at, n in run:
                    head = at % PAGE
                    want = -(-(head + n) // PAGE) * PAGE
                    got += min(n, max(0, os.preadv(fd, [memoryview(buf)[:want]], at - head) - head))
                return got
            return sum(self.pool.map(part, groups(pieces(offset, length, self.request), self.parallelism)))
        finally:
            os.close(fd)


class RawS3:
    """s3dlio get_range, one thread per contiguous part of a range."""

    def __init__(self, request: int, parallelism: int) -> None:
        import s3dlio
        self.s3dlio, self.request, self.parallelism = s3dlio, request, parallelism
        self.pool = ThreadPoolExecutor(parallelism)

    def read(self, uri: str, offset: int, length: int) -> int:
        def part(run: list[tuple[int, int]]) -> int:
            return sum(len(self.s3dlio.get_range(uri, at, n)) for at, n in run)
        return sum(self.pool.map(part, groups(pieces(offset, length, self.request), self.parallelism)))


def measure(args, root: str, storage_type: str, label: str, layout: str, parallelism: dict, saved: int,
            ranks: int, rank: int, pattern: str) -> dict:
    cfg = config(args, root, storage_type, layout, parallelism, ranks, restore=pattern, saved_ranks=saved,
                 num_checkpoints_write=0, num_checkpoints_read=1)
    ck = Checkpointer(cfg, rank, ranks, ranks)
    ck.prepare()
    if ck.layout.converts(cfg.parallelism, ck.job):  # DeepSpeed's ZeRO: its universal checkpoint first
        others = [ck if r == rank else Checkpointer(cfg, r, ranks, ranks) for r in range(ranks)]
        for other in others:
            other.prepare()
        universal.convert_in_threads(others, ck.directory(1))
        for other in others:
            if other is not ck:
                other.close()
    raw = (RawLocal if storage_type == "local_fs" else RawS3)(cfg.read_size, cfg.read_parallelism)
    return load_against_raw(args, ck, raw, label)


def load_against_raw(args, ck: Checkpointer, raw, label: str) -> dict:
    """Pairs of ck's load (its plan's ranges) and raw reads of the same ranges, then ck closed."""
    reads = ck.reads()
    nbytes = sum(r.length for r in reads)
    directory = ck.layout.load_dir(ck.cfg.parallelism, ck.job, ck.directory(1))

    def ours() -> float:
        t0 = time.perf_counter()
        got = sum(f.nbytes for f in ck.load(1))
        assert got == nbytes, (got, nbytes)
        return time.perf_counter() - t0

    def reference() -> float:
        t0 = time.perf_counter()
        got = sum(raw.read(ck.backend.uri(f"{directory}/{r.name}"), r.offset, r.length) for r in reads)
        assert got == nbytes, (got, nbytes)
        return time.perf_counter() - t0

    ratios = interleaved(args.pairs, label, ours, reference, nbytes)
    ck.close()
    return {"bytes": nbytes, "ranges": len(reads), "ratio": ratios, "in_flight": ck.cfg.read_parallelism}


def model_options(ap: argparse.ArgumentParser, bench: str) -> argparse.ArgumentParser:
    """The options of a bench over a scaled-down model's checkpoint on a scratch disk."""
    ap.add_argument("--pairs", type=int, default=4, help="an even number: as many pairs with each order")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--read-size", type=int, default=8 << 20)
    ap.add_argument("--dir", help="scratch directory on the disk to measure (default: a temporary one)")
    ap.add_argument("--json", help=f"also save the table here (bench/results/{bench}.json for the docs)")
    return ap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storage", default="local,remote", help="local (O_DIRECT on --dir), remote (the emulated link)")
    ap.add_argument("--link", default="10:40", help="latency_ms:MB_per_s per connection of the remote link")
    args = model_options(ap, "restore_bench").parse_args()
    check_pairs(ap, args.pairs)
    table = BenchTable("restore_bench", "Restores: each pattern's reads through our engine against raw reads of "
                       f"the same ranges with the same requests in flight, order-balanced ratio of {args.pairs} "
                       "interleaved pairs (verify off)",
                       ["storage", "pattern (one loading rank)", "ranges", "MiB read", "requests in flight",
                        "ours / raw", "target"])
    figures = {}
    workdir = Path(tempfile.mkdtemp(prefix="restore-bench-", dir=args.dir))
    try:
        for storage in args.storage.split(","):
            server = None
            if storage == "remote":
                server = seaweedfs(workdir / "server", args.link, BUCKET)
                link = link_of(args.link)
                root, storage_type = f"s3://{BUCKET}", "s3"
                where = f"remote ({link.latency_ms:g} ms, {link.rate_mb_s:g} MB/s)" if link else "S3 on loopback"
            else:
                root, storage_type, where = str(workdir / "local"), "local_fs", "local disk, O_DIRECT"
            try:
                for layout, parallelism in (("dcp", {}), ("deepspeed", {"pipeline": 2, "zero_stage": 1})):
                    save(args, root, storage_type, layout, parallelism, 4)
                for label, layout, parallelism, saved, ranks, rank, pattern in PATTERNS:
                    r = measure(args, root, storage_type, label, layout, parallelism, saved, ranks, rank, pattern)
                    figures[f"{storage}: {label}"] = {**r, "ratio": r["ratio"].describe()}
                    table.add(where, label, r["ranges"], f"{r['bytes'] / 2**20:.0f}", r["in_flight"],
                              r["ratio"].cell(), ">= 0.9")
            finally:
                if server is not None:
                    server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    table.finish(args.json, figures)


if __name__ == "__main__":
    main()
