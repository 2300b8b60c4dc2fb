"""Deterministic checkpoint content from dgen-py.

A file's bytes are a pure function of its seed, so a reader regenerates
them to verify. dgen-py's stream for seed s+k equals the stream for seed s
shifted by k blocks of 1 MiB (with unit dedup/compress ratios), which makes
the content seekable at 1 MiB offsets; it also means counted seeds would
overlap, hence seeds come from a hash.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional

import dgen_py

BLOCK = 1 << 20
_SEED_BITS = 62  # headroom so seed + block index never overflows u64


def derive_seed(*parts: object) -> int:
    """Seed for one file from (run seed, checkpoint id, rank, file name, ...)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


@dataclass(frozen=True)
class ContentSpec:
    seed: int
    dedup_ratio: int = 1
    compress_ratio: int = 1
    #: bytes the file starts with, not generated (a safetensors header); the rest is generated after them
    prefix: bytes = field(default=b"", repr=False)

    @property
    def seekable(self) -> bool:
        return self.dedup_ratio == 1 and self.compress_ratio == 1


class _Prefixed:
    """Bytes [offset, offset + size) of a file that is `prefix` then generated
    data: the prefix's part copied, the data's generated (its offsets counted
    from the data's start, as it was written)."""

    def __init__(self, spec: ContentSpec, size: int, offset: int, threads: int, chunk_size: int,
                 file_size: Optional[int]) -> None:
        self.prefix, self.pos, self.end = memoryview(spec.prefix), offset, offset + size
        p = len(spec.prefix)
        self.data = None
        if self.end > p:
            start = max(0, offset - p)
            self.data = _generated(ContentSpec(spec.seed, spec.dedup_ratio, spec.compress_ratio), self.end - p - start,
                                   start, threads, chunk_size, None if file_size is None else file_size - p)

    def fill_chunk(self, view: memoryview) -> int:
        n, done = min(len(view), self.end - self.pos), 0
        if self.pos < len(self.prefix):
            done = min(n, len(self.prefix) - self.pos)
            view[:done] = self.prefix[self.pos:self.pos + done]
        if done < n:
            done += self.data.fill_chunk(view[done:n])
        self.pos += done
        return done


def generator(spec: ContentSpec, size: int, offset: int = 0, threads: int = 1,
              chunk_size: int = 32 * BLOCK, file_size: Optional[int] = None) -> "dgen_py.Generator":
    """Bytes [offset, offset+size) of a file of file_size bytes (default: ending
    there), as dgen-py generated them after the spec's prefix, if it has one."""
    if spec.prefix:
        return _Prefixed(spec, size, offset, threads, chunk_size, file_size)
    return _generated(spec, size, offset, threads, chunk_size, file_size)


def _generated(spec: ContentSpec, size: int, offset: int = 0, threads: int = 1,
               chunk_size: int = 32 * BLOCK, file_size: Optional[int] = None) -> "dgen_py.Generator":
    """A dgen-py generator producing bytes [offset, offset+size) of a file of
    file_size bytes (default: ending there). An offset inside a block (a saved
    item a restore reads whole) starts at the block and discards the bytes
    before it. dgen-py makes a generator's last bytes differently when it ends
    inside a block (measured: a 9,001-byte generator's last byte is not a
    longer one's), so a range that ends before the file does is generated to
    its block's end, as the writer generated it, and only its bytes are used."""
    if offset and not spec.seekable:
        raise ValueError("content with dedup/compress ratios other than 1 can only be "
                         "generated from the start of the file")
    head = offset % BLOCK
    end = offset + size
    if file_size is not None and end < file_size:
        end = min(file_size, -(-end // BLOCK) * BLOCK)
    gen = dgen_py.Generator(size=end - offset + head, seed=spec.seed + offset // BLOCK, max_threads=threads,
                            chunk_size=chunk_size, dedup_ratio=float(spec.dedup_ratio),
                            compress_ratio=float(spec.compress_ratio))
    if head:
        fill_exact(gen, memoryview(bytearray(head)), 0, "the block before a range")
    return gen


def fill_exact(gen: "dgen_py.Generator", view: memoryview, offset: int, where: str) -> None:
    """Fill all of view from gen, or raise naming the file and offset."""
    n = len(view)
    got = gen.fill_chunk(view)
    if got != n:
        raise RuntimeError(f"dgen-py filled {got} bytes instead of {n} at offset {offset} of {where}")
