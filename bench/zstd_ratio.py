"""How far zstd shrinks a checkpoint's tensors: the stored / raw bytes of each
state Orbax writes (its zarr3 chunks are zstd level 3, TensorStore's default),
measured with the zstandard library on tensors generated with the value
distributions of a trained LLaMA's state:

- params: a trained linear layer's weights, normal around 0 with std 0.02
  (LLaMA's init and what trained weights keep);
- mu, Adam's first moment: an exponential average of gradients, normal around
  0, std 1e-4 (gradients' scale in a large model's training);
- nu, Adam's second moment: an exponential average of squared gradients,
  positive: the mean of 20 squared normal gradients of std 1e-4.

Each in fp32 and in bf16 (fp32's upper half, as a cast truncates). The layout
(dlio_ckpt_ext/layouts/orbax.py, ZSTD_STORED) sizes each stored chunk by these
ratios; the chunk's bytes themselves are incompressible (zstd's output is).

    python bench/zstd_ratio.py [--mib 64] [--json bench/results/zstd_ratio.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import BenchTable  # noqa: E402

#: zarr3's zstd codec in TensorStore: level 3, no checksum
LEVEL = 3
CHUNK = 16 << 20


def tensor(state: str, count: int, seed: int) -> np.ndarray:
    """`count` fp32 values of a state, drawn as the module's docstring says."""
    rng = np.random.default_rng(seed)
    if state == "params":
        return rng.normal(0.0, 0.02, count).astype(np.float32)
    if state == "mu":
        return rng.normal(0.0, 1e-4, count).astype(np.float32)
    if state == "nu":
        return (rng.chisquare(20, count) / 20 * 1e-8).astype(np.float32)
    raise ValueError(state)


def as_dtype(values: np.ndarray, itemsize: int) -> bytes:
    """fp32 as it is, or bf16: each value's upper 16 bits."""
    if itemsize == 4:
        return values.tobytes()
    return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def stored_ratio(state: str, itemsize: int, nbytes: int, seed: int = 0) -> float:
    """zstd level 3's output / input over `nbytes` of the state, compressed in 16 MiB chunks."""
    data = as_dtype(tensor(state, nbytes // itemsize, seed), itemsize)
    compressor = zstandard.ZstdCompressor(level=LEVEL)
    out = sum(len(compressor.compress(data[i:i + CHUNK])) for i in range(0, len(data), CHUNK))
    return out / len(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="MiB of each state and datatype compressed")
    ap.add_argument("--json", help="also save the table here (bench/results/zstd_ratio.json for the docs)")
    args = ap.parse_args()
    table = BenchTable("zstd_ratio", f"zstd level {LEVEL} on generated checkpoint tensors: stored / raw bytes, "
                       f"{args.mib} MiB of each, 16 MiB chunks", ["state", "datatype", "stored / raw"])
    figures = {}
    for state in ("params", "mu", "nu"):
        for itemsize, name in ((4, "fp32"), (2, "bf16")):
            ratio = stored_ratio(state, itemsize, args.mib << 20)
            figures[f"{state} {name}"] = ratio
            table.add(state, name, f"{ratio:.3f}")
    table.finish(args.json, figures)


if __name__ == "__main__":
    main()
