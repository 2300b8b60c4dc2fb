"""Our layout beside a real library's save: for a manifest (fidelity/manifests),
our save of the same shape, parallelism and world size is run on POSIX under
strace (fidelity/ours.py), then both are compared file for file: names, sizes
(within 1 % or 4 KiB), renames, fsyncs, and data files per folder where the
names are hashes (OCDBT's `d/`).

    python fidelity/compare.py [MANIFEST ...]    markdown tables
    python fidelity/compare.py --doc docs/fidelity.md   rewrite the page's tables

tests/test_fidelity.py asserts on the same comparison; the differences kept on
purpose are listed there, each with its reason."""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from record import TRACED, files as listed, parse_trace  # noqa: E402

MANIFESTS = HERE / "manifests"
#: a size within this fraction, or within SLACK bytes, is the same size
TOLERANCE, SLACK = 0.01, 4096
HASHED = "{hash}"


def manifests() -> list[Path]:
    return sorted(MANIFESTS.glob("*.json"))


def load(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())


def same_size(real: int, ours: int) -> bool:
    return abs(real - ours) <= max(SLACK, TOLERANCE * real)


def run_ours(manifest: dict, ours: dict, workdir: str) -> tuple[list[dict], dict]:
    """Our save of the manifest's checkpoint, with our settings `ours`
    (fidelity/ours.py's overrides), traced: (files below the save root, operations)."""
    root = os.path.join(workdir, "ckpt")
    shutil.rmtree(root, ignore_errors=True)
    spec = os.path.join(workdir, "ours.json")
    Path(spec).write_text(json.dumps({**manifest, "ours": ours}))
    trace = os.path.join(workdir, "strace")
    subprocess.run(["strace", "-f", "-ff", "-y", "-qq", "-e", f"trace={TRACED}", "-o", trace,
                    sys.executable, str(HERE / "ours.py"), spec, root], check=True)
    lines = [line for name in sorted(Path(workdir).glob("strace.*")) for line in open(name, errors="replace")]
    for name in Path(workdir).glob("strace.*"):
        name.unlink()
    return listed(root, ratios=False), parse_trace(lines, root, os.getcwd())


@dataclass
class Comparison:
    manifest: dict
    our_dir: str
    #: (path, real size or None, our size or None, same?) for every name either side has
    rows: list[tuple[str, int | None, int | None, bool]] = field(default_factory=list)
    #: folder -> (real files, our files) where the names are hashes
    hashed: dict[str, tuple[int, int]] = field(default_factory=dict)
    operations: dict[str, tuple[int, int]] = field(default_factory=dict)

    def differences(self) -> list[Difference]:
        """Every difference: a name on one side only, a size, a count."""
        out = []
        for path, real, ours, same in self.rows:
            if real is None or ours is None:
                out.append(Difference("name", path, real or 0, ours or 0))
            elif not same:
                out.append(Difference("size", path, real, ours))
        for folder, (real, ours) in self.hashed.items():
            if abs(real - ours) > 1:
                out.append(Difference("data files", folder, real, ours))
        real, ours = self.operations["rename"]
        if real != ours:
            out.append(Difference("renames", "", real, ours))
        return out


@dataclass(frozen=True)
class Difference:
    kind: str   # name (on one side only), size, data files (in a hashed folder), renames
    path: str
    real: int   # bytes or count (0: a name we write and the library does not)
    ours: int

    def __str__(self) -> str:
        if self.kind == "name":
            return f"{self.path}: {'ours' if self.ours else 'real'} only"
        return f"{self.kind} {self.path}: real {self.real:,}, ours {self.ours:,}".replace(" :", ":")


def compare(manifest: dict, our_files: list[dict], our_ops: dict, our_dir: str) -> Comparison:
    """Both saves, names mapped (the real checkpoint folder named as ours names it)."""
    real_dir = manifest["checkpoint_dir"]

    def mapped(path: str) -> str:
        return our_dir + path[len(real_dir):] if path == real_dir or path.startswith(real_dir + "/") else path

    real = defaultdict(list)
    for f in manifest["files"]:
        real[mapped(f["path"])].append(f["size"])
    ours = defaultdict(list)
    for f in our_files:
        ours[f["path"]].append(f["size"])
    c = Comparison(manifest, our_dir)
    for path in sorted(set(real) | set(ours)):
        r, o = real.get(path), ours.get(path)
        if HASHED in path:
            folder = os.path.dirname(path)
            rn, on = c.hashed.get(folder, (0, 0))
            c.hashed[folder] = (rn + len(r or []), on + len(o or []))
            total_r, total_o = sum(r or []), sum(o or [])
            c.rows.append((path, total_r if r else None, total_o if o else None, same_size(total_r, total_o)))
        else:
            c.rows.append((path, r[0] if r else None, o[0] if o else None,
                           bool(r and o) and same_size(r[0], o[0])))
    c.operations = {k: (manifest["operations"].get(k, 0), our_ops["counts"].get(k, 0))
                    for k in ("create", "rename", "fsync", "unlink", "mkdir")}
    return c


@dataclass(frozen=True)
class Kept:
    """A difference kept on purpose: its kind (as Difference names it), a glob of
    the paths it covers and of the manifests' variants, the largest count
    difference it allows (0: any), and why."""
    kind: str
    path: str
    reason: str
    variant: str = "*"
    within: int = 0

    def covers(self, d: Difference, variant: str) -> bool:
        return (self.kind == d.kind and fnmatch.fnmatch(d.path, self.path) and fnmatch.fnmatch(variant, self.variant)
                and (not self.within or abs(d.real - d.ours) <= self.within))


def unexplained(c: Comparison, kept: list[Kept]) -> tuple[list[Difference], list[Kept]]:
    """The differences no Kept entry covers, and the Kept entries naming this very
    variant that cover none of its differences (stale: remove them)."""
    diffs, variant = c.differences(), c.manifest["variant"]
    return ([d for d in diffs if not any(k.covers(d, variant) for k in kept)],
            [k for k in kept if k.variant == variant and not any(k.covers(d, variant) for d in diffs)])


def markdown(c: Comparison, kept: list[Kept]) -> str:
    m = c.manifest
    head = (f"#### {m['layout']} `{m['variant']}`: {m['library']} {m['version']}, {m['world_size']} "
            f"process{'es' if m['world_size'] > 1 else ''}\n\n| file | real (B) | ours (B) | |\n|---|---:|---:|---|\n")
    reasons = {d.path: next((k.reason for k in kept if k.covers(d, m["variant"])), "") for d in c.differences()}

    def name(path: str) -> str:
        files = c.hashed.get(os.path.dirname(path)) if HASHED in path else None
        return f"`{path}` ({files[0]} / {files[1]} files)" if files else f"`{path}`"
    lines = [f"| {name(p)} | {'' if r is None else f'{r:,}'} | {'' if o is None else f'{o:,}'} | "
             f"{'=' if same else reasons.get(p, 'differs')} |" for p, r, o, same in c.rows]
    ops = ", ".join(f"{k} {r} / {o}" for k, (r, o) in c.operations.items())
    return head + "\n".join(lines) + f"\n\nOperations, real / ours: {ops}.\n"


DOC_START = "<!-- fidelity tables: python fidelity/compare.py --doc docs/fidelity.md -->"
DOC_END = "<!-- end of fidelity tables -->"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from test_fidelity import KEPT, OURS, our_dir  # one table of our settings and kept differences
    doc = argv[argv.index("--doc") + 1] if "--doc" in argv else None
    paths = [a for a in argv if a != "--doc" and a != doc] or manifests()
    tables: dict[str, list[str]] = {}
    for path in paths:
        m = load(path)
        with tempfile.TemporaryDirectory() as tmp:
            files, ops = run_ours(m, OURS.get(m["layout"], {}), tmp)
        tables.setdefault(m["layout"], []).append(markdown(compare(m, files, ops, our_dir(m)),
                                                           KEPT.get(m["layout"], [])))
    if not doc:
        print("\n".join(t for layout in tables.values() for t in layout))
        return 0
    text = Path(doc).read_text()
    body = "".join(f"\n<details><summary><code>{layout}</code>: {len(t)} saves</summary>\n\n" + "\n".join(t)
                   + "\n</details>\n" for layout, t in tables.items())
    head, rest = text.split(DOC_START, 1)
    Path(doc).write_text(head + DOC_START + "\n" + body + "\n" + DOC_END + rest.split(DOC_END, 1)[1])
    print(f"wrote the tables of {len(paths)} manifests into {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
