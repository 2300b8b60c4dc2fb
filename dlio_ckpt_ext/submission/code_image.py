"""The code-image pool of a submission (rules edition 3.0, 2.1.6): a copy of the
code that ran, named by its tree hash, that every timestamp folder points at.

    RESULTS/code-images/.mlps-image-pool
    RESULTS/code-images/code-<hash8>/{dlio_ckpt_ext/,hydra_plugins/...,configs/dlio/,.code-hash.json}
    RESULTS/<division>/<org>/results/.../<YYYYMMDD_HHmmss>/.mlps-code-image   md5-tree-v2:<hash>

The tree hash is the MD5, as 32 lowercase hex digits, of each file's POSIX
relative path followed by its content, over the files in UTF-8 byte order of
their paths, leaving out the directories, files and links the rules name.
"""
from __future__ import annotations

import datetime
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, Optional

ALGORITHM = "md5-tree-v2"
POOL_DIR = "code-images"
POOL_MARKER = ".mlps-image-pool"
POINTER_FILE = ".mlps-code-image"
HASH_FILE = ".code-hash.json"
#: directories left out at any depth (2.1.6), and the file names and patterns
EXCLUDED_DIRS = frozenset({".git", ".idea", ".vscode", ".claude", ".agent", ".agents", ".roo", ".planning",
                           ".gsd-tmp", "__pycache__", ".pytest_cache", ".venv", "node_modules", "build", "dist",
                           ".tox", "test", "tests"})
EXCLUDED_FILES = (HASH_FILE, ".DS_Store", "Thumbs.db", "*.pyc", "*.pyo")
_READ = 1 << 20


def _excluded_dir(name: str) -> bool:
    return name in EXCLUDED_DIRS or name.endswith(".egg-info")


def _excluded_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in EXCLUDED_FILES)


def tree_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(POSIX relative path, path) of every file the tree hash covers, in hash order."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if not _excluded_dir(d) and not os.path.islink(os.path.join(folder, d))]
        for name in files:
            path = Path(folder) / name
            if _excluded_file(name) or path.is_symlink():
                continue
            found.append((path.relative_to(root).as_posix(), path))
    return iter(sorted(found, key=lambda item: item[0].encode("utf-8")))


def tree_hash(root: Path) -> str:
    digest = hashlib.md5()
    for rel, path in tree_files(root):
        digest.update(rel.encode("utf-8"))
        with open(path, "rb") as f:
            while chunk := f.read(_READ):
                digest.update(chunk)
    return digest.hexdigest()


def code_sources() -> dict[str, Path]:
    """The code that runs in a submission, by its place in the image: our
    package, hydra's search-path plugin and the workload presets (where this
    installation keeps them: the checkout's configs/dlio, or the installed copy)."""
    import dlio_ckpt_ext
    import hydra_plugins.dlio_ckpt_ext_searchpath as plugin
    from hydra_plugins.dlio_ckpt_ext_searchpath import presets_location
    package = Path(dlio_ckpt_ext.__file__).resolve().parent
    sources = {"dlio_ckpt_ext": package, "hydra_plugins/dlio_ckpt_ext_searchpath": Path(plugin.__file__).resolve().parent}
    location = presets_location()
    if location.startswith("file://"):  # a checkout: the presets live beside the package
        sources["configs/dlio"] = Path(location[len("file://"):])
    return sources


def git_sha(path: Path) -> Optional[str]:
    """HEAD of the checkout whose tracked files `path` holds, or None (an
    installed package, even one in a virtual environment inside a checkout)."""
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "."], cwd=path, capture_output=True,
                                 timeout=10)
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = res.stdout.strip()
    return sha if tracked.returncode == 0 and res.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else None


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _copy(sources: dict[str, Path], into: Path) -> None:
    for place, source in sources.items():
        for rel, path in tree_files(source):
            target = into / place / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def capture(results: Path, sources: Optional[dict[str, Path]] = None) -> str:
    """Copy the code into the pool (once per distinct tree: an image already
    there is reused) and return its tree hash. The copy is hashed, not the
    source, so the image re-hashes to its record whatever the source tree held
    beside what was copied."""
    sources = sources or code_sources()
    pool = results / POOL_DIR
    pool.mkdir(parents=True, exist_ok=True)
    (pool / POOL_MARKER).touch()
    staging = pool / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _copy(sources, staging)
        digest = tree_hash(staging)
        image = pool / f"code-{digest[:8]}"
        if image.is_dir():
            return digest
        from importlib import metadata as md
        try:
            mlpstorage = md.version("mlpstorage")
        except md.PackageNotFoundError:
            mlpstorage = "unknown"  # the field is mlpstorage's; ours is in "tool"
        record = {"hash": digest, "algorithm": ALGORITHM, "captured_at": utc_now(), "mlpstorage_version": mlpstorage,
                  "git_sha": git_sha(next(iter(sources.values()))), "tool": f"dlio-ckpt-ext {md.version('dlio-ckpt-ext')}"}
        (staging / HASH_FILE).write_text(json.dumps(record, indent=2) + "\n")
        os.rename(staging, image)
        return digest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def pointer(digest: str) -> str:
    return f"{ALGORITHM}:{digest}"


def write_pointer(leaf: Path, digest: str) -> None:
    (leaf / POINTER_FILE).write_text(pointer(digest) + "\n")
