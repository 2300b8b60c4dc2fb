"""Runs one real library's save under strace and writes its manifest: every
file below the checkpoint root (names normalised, sizes, the zstd and lz4
ratios of tensor files) and the file operations the save made there.

    python fidelity/record.py --manifest fidelity/manifests/dcp-w2.json --out /tmp/fid/dcp-w2 \
        -- python fidelity/save_dcp.py --out /tmp/fid/dcp-w2 --world 2

The save script writes its checkpoint under OUT/ckpt and OUT/info.json (the
library, its version, the shape, the parallelism, the world size); this file
knows nothing of any library. Standard library plus zstandard and lz4, which the
harness's venv holds."""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

#: the calls that create, rename, sync, remove and make folders; -y prints an fd's path
TRACED = "openat,open,creat,rename,renameat,renameat2,fsync,fdatasync,unlink,unlinkat,mkdir,mkdirat,rmdir"
#: files at least this large are tensor data: their bytes are compressed to measure the ratios
TENSOR_FILE = 64 << 10
#: uuids, long hex names (OCDBT's data files), long digit runs (timestamps, pids): one token each
_NORMALISE = [(re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "{uuid}"),
              (re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{16,}(?![0-9a-zA-Z])"), "{hash}"),
              (re.compile(r"\d{10,}"), "{n}"),
              # tempfile's names (safetensors writes each shard as .tmpXXXXXX, then renames it)
              (re.compile(r"\.tmp[A-Za-z0-9_]{6}(?![A-Za-z0-9_])"), ".tmp{rand}")]
_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD_PATH = re.compile(r"^(?:-?\d+|AT_FDCWD)<([^>]*)>|^AT_FDCWD")


def normalise(path: str) -> str:
    """A path with the parts that change from save to save (hashes, uuids, times) as tokens."""
    for pattern, token in _NORMALISE:
        path = pattern.sub(token, path)
    return path


def _unescape(s: str) -> str:
    return s.encode("latin-1", "backslashreplace").decode("unicode_escape")


def _resolve(dir_arg: str | None, name: str, cwd: str) -> str:
    """An absolute path from a call's (dirfd, path): -y gives a dirfd's path as fd<path>."""
    if name.startswith("/"):
        return os.path.normpath(name)
    base = cwd
    if dir_arg:
        m = _FD_PATH.match(dir_arg.strip())
        if m and m.group(1):
            base = m.group(1)
    return os.path.normpath(os.path.join(base, name))


def parse_trace(lines, root: str, cwd: str) -> dict:
    """Successful operations below `root`: counts by kind, and the normalised paths of each."""
    root = os.path.realpath(root)
    counts: Counter = Counter()
    paths: dict[str, list] = {}

    def under(p: str) -> str | None:
        p = os.path.realpath(p) if os.path.exists(os.path.dirname(p)) else p
        return normalise(os.path.relpath(p, root)) if p == root or p.startswith(root + os.sep) else None

    def add(kind: str, what) -> None:
        counts[kind] += 1
        paths.setdefault(kind, []).append(what)

    for line in lines:
        m = _CALL.match(line.strip())
        if not m or int(m.group(3)) < 0:
            continue
        call, args = m.group(1), m.group(2)
        strings = [_unescape(s) for s in _STRING.findall(args)]
        parts = [a.strip() for a in args.split(",")]
        if call in ("open", "openat", "creat"):
            if not strings or (call != "creat" and "O_CREAT" not in args):
                continue
            rel = under(_resolve(parts[0] if call == "openat" else None, strings[0], cwd))
            if rel is not None:
                add("create", rel)
        elif call in ("rename", "renameat", "renameat2") and len(strings) >= 2:
            dirs = (parts[0], parts[2]) if call != "rename" else (None, None)
            src = under(_resolve(dirs[0], strings[0], cwd))
            dst = under(_resolve(dirs[1], strings[1], cwd))
            if src is not None or dst is not None:
                add("rename", [src, dst])
        elif call in ("fsync", "fdatasync"):
            fd = _FD_PATH.match(parts[0])
            if fd and fd.group(1):
                rel = under(fd.group(1))
                if rel is not None:
                    add("fsync", rel)
        elif call in ("unlink", "unlinkat", "rmdir") and strings:
            kind = "rmdir" if call == "rmdir" or "AT_REMOVEDIR" in args else "unlink"
            rel = under(_resolve(parts[0] if call == "unlinkat" else None, strings[0], cwd))
            if rel is not None:
                add(kind, rel)
        elif call in ("mkdir", "mkdirat") and strings:
            rel = under(_resolve(parts[0] if call == "mkdirat" else None, strings[0], cwd))
            if rel is not None:
                add("mkdir", rel)
    return {"counts": {k: counts.get(k, 0) for k in ("create", "rename", "fsync", "unlink", "rmdir", "mkdir")},
            "paths": {k: sorted(v, key=json.dumps) for k, v in sorted(paths.items())}}


def compression(path: str) -> dict:
    """Compressed / raw size of a file's bytes under zstd (level 3) and lz4 (default frame)."""
    import lz4.frame
    import zstandard
    with open(path, "rb") as f:
        raw = f.read()
    return {"zstd": round(len(zstandard.ZstdCompressor(level=3).compress(raw)) / max(1, len(raw)), 5),
            "lz4": round(len(lz4.frame.compress(raw)) / max(1, len(raw)), 5)}


def files(root: str, ratios: bool = True) -> list[dict]:
    """Every file below root: its normalised path, size and (tensor files, with `ratios`) compression."""
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            entry = {"path": normalise(os.path.relpath(full, root)), "size": os.path.getsize(full)}
            if ratios and entry["size"] >= TENSOR_FILE:
                entry.update(compression(full))
            out.append(entry)
    return sorted(out, key=lambda e: (e["path"], e["size"]))


def record(out: str, command: list[str], trace: bool = True) -> dict:
    """Run the save (traced), then describe what it left in OUT/ckpt."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    prefix = ["strace", "-f", "-ff", "-y", "-qq", "-e", f"trace={TRACED}", "-o", os.path.join(out, "strace")]
    subprocess.run((prefix if trace else []) + command, check=True)
    info = json.load(open(os.path.join(out, "info.json")))
    root = os.path.join(out, "ckpt")
    lines = (line for name in sorted(glob.glob(os.path.join(out, "strace.*"))) for line in open(name, errors="replace"))
    ops = parse_trace(lines, root, os.getcwd())
    return {**info, "files": files(root), "operations": ops["counts"], "operation_paths": ops["paths"],
            "recorded_with": f"strace -f -y -e trace={TRACED}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True, help="the JSON file to write")
    ap.add_argument("--out", required=True, help="scratch folder the save writes in (removed first)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the save command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    manifest = record(args.out, command)
    os.makedirs(os.path.dirname(os.path.abspath(args.manifest)), exist_ok=True)
    with open(args.manifest, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{args.manifest}: {len(manifest['files'])} files, {sum(e['size'] for e in manifest['files'])} bytes, "
          f"operations {manifest['operations']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
