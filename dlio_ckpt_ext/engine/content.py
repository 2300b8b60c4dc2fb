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
import numpy as np

BLOCK = 1 << 20
_SEED_BITS = 62  # headroom so seed + block index never overflows u64


def derive_seed(*parts: object) -> int:
    """Seed for one file from (run seed, checkpoint id, rank, file name, ...)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


#: streaming.content=tensors: dgen-py's bytes with each number's top byte (sign and high
#: exponent bits) narrowed, as trained weights and Adam's moments hold them; zstd's
#: entropy coder then shrinks them about as far as it shrinks real tensor files.
#: Per number size: the (AND, OR) of the top byte of even numbers, then of odd ones. The
#: top byte of fp32, bf16 and fp16 numbers of one tensor takes few values (its exponent's
#: high bits vary little): here 8 values, then 2. Calibrated against the real libraries'
#: files (fidelity/manifests: zstd keeps 0.92 of torch's fp32 .distcp, 0.78 of bf16
#: safetensors; of ours 0.925 and 0.778; lz4 keeps all of both, as of ours)
TENSOR_TOP = {4: ((0x83, 0x3C), (0x80, 0x3C)), 2: ((0x83, 0x3C), (0x80, 0x3C))}


@dataclass(frozen=True)
class ContentSpec:
    seed: int
    dedup_ratio: int = 1
    compress_ratio: int = 1
    #: bytes the file starts with, not generated (a safetensors header); the rest is generated after them
    prefix: bytes = field(default=b"", repr=False)
    #: streaming.content=tensors: the size of the file's numbers (2 or 4), whose top
    #: bytes are narrowed (TENSOR_TOP); 0: incompressible
    number_bytes: int = 0

    @property
    def seekable(self) -> bool:
        return self.dedup_ratio == 1 and self.compress_ratio == 1


class _Prefixed:
    """Bytes [offset, offset + size) of a file that is `prefix` then generated
    data: the prefix's part copied, the data's generated (its offsets counted
    from the data's start, as it was written)."""

    def __init__(self, spec: ContentSpec, size: int, offset: int, threads: int, chunk_size: int) -> None:
        self.prefix, self.pos, self.end = memoryview(spec.prefix), offset, offset + size
        p = len(spec.prefix)
        self.data = None
        if self.end > p:
            start = max(0, offset - p)
            self.data = _generated(ContentSpec(spec.seed, spec.dedup_ratio, spec.compress_ratio,
                                               number_bytes=spec.number_bytes), self.end - p - start,
                                   start, threads, chunk_size)

    def fill_chunk(self, view: memoryview) -> int:
        n, done = min(len(view), self.end - self.pos), 0
        if self.pos < len(self.prefix):
            done = min(n, len(self.prefix) - self.pos)
            view[:done] = self.prefix[self.pos:self.pos + done]
        if done < n:
            done += self.data.fill_chunk(view[done:n])
        self.pos += done
        return done


def _word_masks(number_bytes: int) -> tuple[np.uint64, np.uint64]:
    """(AND, OR) of 8 bytes that start at a file offset a multiple of 8: TENSOR_TOP
    on each number's top byte, even numbers then odd ones."""
    keep, put = bytearray(b"\xff" * 8), bytearray(8)
    for k in range(8 // number_bytes):
        top = k * number_bytes + number_bytes - 1
        keep[top], put[top] = TENSOR_TOP[number_bytes][k % 2]
    return np.uint64(int.from_bytes(keep, "little")), np.uint64(int.from_bytes(put, "little"))


class _Tensors:
    """A generator's bytes with the top byte of every number narrowed
    (TENSOR_TOP): position-local, so a range regenerates as it was written.
    Eight bytes at a time where the file offset allows (two passes over the
    chunk), byte by byte at an unaligned start or end."""

    def __init__(self, gen: "dgen_py.Generator", number_bytes: int, offset: int) -> None:
        self.gen, self.size, self.pos = gen, number_bytes, offset
        self.keep, self.put = _word_masks(number_bytes)

    def fill_chunk(self, view: memoryview) -> int:
        n = self.gen.fill_chunk(view)
        data = np.frombuffer(view, np.uint8, n)
        head = min(n, (-self.pos) % 8)
        words = (n - head) // 8 * 8
        self._shape_bytes(data[:head], self.pos)
        if words:
            body = data[head:head + words].view(np.uint64)
            np.bitwise_and(body, self.keep, out=body)
            np.bitwise_or(body, self.put, out=body)
        self._shape_bytes(data[head + words:], self.pos + head + words)
        self.pos += n
        return n

    def _shape_bytes(self, data: np.ndarray, at: int) -> None:
        """The top bytes of `data`, which starts at file offset `at`, one by one."""
        for i in range((self.size - 1 - at) % self.size, len(data), self.size):
            mask, bits = TENSOR_TOP[self.size][((at + i) // self.size) % 2]
            data[i] = (data[i] & mask) | bits


def generator(spec: ContentSpec, size: int, offset: int = 0, threads: int = 1,
              chunk_size: int = 32 * BLOCK) -> "dgen_py.Generator":
    """Bytes [offset, offset+size) of a file, as dgen-py generated them after
    the spec's prefix, if it has one."""
    if spec.prefix:
        return _Prefixed(spec, size, offset, threads, chunk_size)
    return _generated(spec, size, offset, threads, chunk_size)


class _BlockFills:
    """A dgen-py generator whose fills never cross a block boundary from inside a
    block, nor span blocks to end inside one. With more than one thread,
    dgen-py's bytes depend on how a fill is cut there (measured, 0.2: one fill
    of 1 MiB + 1,577 bytes ends in another byte than a fill of 1 MiB then one of
    1,577; a fill from 1,000,000 to past 1 MiB differs from 1 MiB on), so a
    reader's whole-file request and a writer's chunks regenerated different
    bytes wherever a rank had two threads. Each fill is cut into the rest of its
    first block, its whole blocks, then the part of its last: the same bytes
    whatever the cut and the threads (tests/test_content.py)."""

    def __init__(self, gen: "dgen_py.Generator") -> None:
        self.gen, self.pos = gen, 0   # pos: from the generator's start, a block boundary

    def fill_chunk(self, view: memoryview) -> int:
        n, done = len(view), 0
        while done < n:
            inside = self.pos % BLOCK
            left = n - done
            step = min(left, BLOCK - inside) if inside else left // BLOCK * BLOCK or left
            got = self.gen.fill_chunk(view[done:done + step])
            done += got
            self.pos += got
            if got < step:
                break
        return done


def _generated(spec: ContentSpec, size: int, offset: int = 0, threads: int = 1,
               chunk_size: int = 32 * BLOCK) -> "dgen_py.Generator":
    """A dgen-py generator producing bytes [offset, offset+size) of a file. An offset inside a block (a saved
    item a restore reads whole) starts at the block and discards the bytes
    before it. dgen-py makes a generator's last bytes differently when it ends
    inside a block (measured: a 9,001-byte generator's last byte is not a
    longer one's; a range from 16 MiB to the end of a 17,476,003-byte file
    differs from the whole file's generator in its last 3 bytes), so every
    generator, the writer's and a reader's, runs to its last block's end and
    only the bytes asked for are used."""
    if offset and not spec.seekable:
        raise ValueError("content with dedup/compress ratios other than 1 can only be "
                         "generated from the start of the file")
    head = offset % BLOCK
    end = -(-(offset + size) // BLOCK) * BLOCK
    gen = dgen_py.Generator(size=end - offset + head, seed=spec.seed + offset // BLOCK, max_threads=threads,
                            chunk_size=chunk_size, dedup_ratio=float(spec.dedup_ratio),
                            compress_ratio=float(spec.compress_ratio))
    if threads > 1:
        gen = _BlockFills(gen)
    if head:
        fill_exact(gen, memoryview(bytearray(head)), 0, "the block before a range")
    return _Tensors(gen, spec.number_bytes, offset) if spec.number_bytes else gen


def fill_exact(gen: "dgen_py.Generator", view: memoryview, offset: int, where: str) -> None:
    """Fill all of view from gen, or raise naming the file and offset."""
    n = len(view)
    got = gen.fill_chunk(view)
    if got != n:
        raise RuntimeError(f"dgen-py filled {got} bytes instead of {n} at offset {offset} of {where}")
