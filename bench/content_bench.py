"""What streaming.content=tensors costs: the engine's generator filling a
buffer with incompressible bytes (dgen-py alone) and with tensor-shaped bytes
(dgen-py, then each number's top byte narrowed), interleaved in the same run,
one thread, GiB/s and the ratio; and what zstd (level 3) and lz4 keep of each.

    python bench/content_bench.py [--mib 256] [--rounds 5] [--json bench/results/content_bench.json]

Generation must outrun storage: the ratio says how much of dgen-py's margin the
shaping takes."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import lz4.frame
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import BenchTable  # noqa: E402

from dlio_ckpt_ext.engine.content import BLOCK, ContentSpec, generator  # noqa: E402

CHUNK = 32 * BLOCK
KINDS = {"incompressible": 0, "tensors fp32": 4, "tensors bf16": 2}


def fill_rate(number_bytes: int, nbytes: int, buf: memoryview, seed: int) -> float:
    """GiB/s of one thread filling `nbytes` in CHUNK pieces, as a writer does."""
    gen = generator(ContentSpec(seed, number_bytes=number_bytes), nbytes, threads=1, chunk_size=CHUNK)
    start = time.perf_counter()
    for _ in range(0, nbytes, CHUNK):
        gen.fill_chunk(buf)
    return nbytes / (time.perf_counter() - start) / 2**30


def kept(number_bytes: int, nbytes: int) -> tuple[float, float]:
    data = bytearray(nbytes)
    generator(ContentSpec(7, number_bytes=number_bytes), nbytes, chunk_size=CHUNK).fill_chunk(memoryview(data))
    raw = bytes(data)
    return (len(zstandard.ZstdCompressor(level=3).compress(raw)) / nbytes, len(lz4.frame.compress(raw)) / nbytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="MiB generated per fill, per kind and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also save the table (bench/results/content_bench.json for the docs)")
    args = ap.parse_args()
    nbytes = args.mib << 20
    buf = memoryview(bytearray(CHUNK))
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    ratios: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(args.rounds):  # interleaved: the machine's noise falls on every kind alike
        for kind, size in KINDS.items():
            rates[kind].append(fill_rate(size, nbytes, buf, r))
        for kind in KINDS:
            ratios[kind].append(rates[kind][-1] / rates["incompressible"][-1])
    table = BenchTable("content_bench", f"streaming.content: one thread generating {args.mib} MiB in 32 MiB "
                       f"chunks, {args.rounds} rounds interleaved (median)",
                       ["content", "GiB/s a thread", "against incompressible", "zstd keeps", "lz4 keeps"])
    figures = {}
    for kind, size in KINDS.items():
        z, l4 = kept(size, 64 << 20)
        rate, ratio = statistics.median(rates[kind]), statistics.median(ratios[kind])
        figures[kind] = {"gib_s": rate, "ratio": ratio, "zstd": z, "lz4": l4}
        table.add(kind, f"{rate:.2f}", f"{ratio:.2f}x", f"{z:.3f}", f"{l4:.3f}")
    table.note("The real libraries' files keep 0.920 (torch DCP, fp32) and 0.780 (safetensors, bf16) under zstd, "
               "about 1.0 under lz4 (fidelity/manifests; docs/fidelity.md).")
    table.finish(args.json, figures)


if __name__ == "__main__":
    main()
