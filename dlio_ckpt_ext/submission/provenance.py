"""What produced each timestamp folder, in the files rules edition 3.0 defines:
provenance.json in the folder (schema mlps-run-provenance/1) and the
organisation's submission.yaml (schema mlps-submission-manifest/1), an
inventory of every run folder, system description and code image.

A value this tool cannot determine is the string "unknown", never null.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from importlib import metadata as md
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from dlio_ckpt_ext.submission import code_image
from dlio_ckpt_ext.submission.edition import RULES_EDITION

PROVENANCE_FILE = "provenance.json"
MANIFEST_FILE = "submission.yaml"
PROVENANCE_SCHEMA = "mlps-run-provenance/1"
MANIFEST_SCHEMA = "mlps-submission-manifest/1"
CORE_CONFIG = "core-config-v1"
UNKNOWN = "unknown"
#: allowlist checkpointing@1: the keys that define a checkpointing workload (site
#: tunables, paths and the write/read phase selectors left out)
ALLOWLIST = "checkpointing@1"
ALLOW_PREFIXES = ("model.", "workflow.", "checkpoint.")
ALLOW_KEYS = ("framework",)
DENY_KEYS = ("checkpoint.checkpoint_folder", "checkpoint.num_checkpoints_write", "checkpoint.num_checkpoints_read")
STAMP_FIELDS = ("rules_edition", "layout_version", "tool", "dlio", "storage_library", "core_config")
TIMESTAMP = re.compile(r"^\d{8}_\d{6}$")


def _flat(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in (tree or {}).items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _canonical(value: Any) -> Any:
    """One spelling per value, so 7, 7.0 and "7" (or "True" and true) hash alike."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        for kind in (int, float):
            try:
                return _canonical(kind(text))
            except ValueError:
                pass
        return text
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def core_config(parameters: dict) -> dict:
    """core-config-v1: SHA-256 (first 16 hex digits) of the canonical JSON of
    the allowlisted parameters, with the keys hashed."""
    flat = dict(_flat(json.loads(json.dumps(parameters, default=str))))
    keys = sorted(k for k in flat if k not in DENY_KEYS and (k in ALLOW_KEYS or k.startswith(ALLOW_PREFIXES)))
    if not keys:
        return {"algorithm": CORE_CONFIG, "allowlist": ALLOWLIST, "hash": UNKNOWN, "keys": []}
    text = json.dumps({k: _canonical(flat[k]) for k in keys}, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {"algorithm": CORE_CONFIG, "allowlist": ALLOWLIST,
            "hash": hashlib.sha256(text.encode()).hexdigest()[:16], "keys": keys}


def _version(dist: str) -> Optional[str]:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def dlio_stamp() -> tuple[dict, str]:
    """The installed DLIO: its version, and where a checkout install says so
    (PEP 610 direct_url.json) its source and commit; a local checkout without
    VCS information gets its commit from git."""
    version = _version("dlio_benchmark") or _version("dlio-benchmark")
    try:
        direct = json.loads(md.distribution("dlio_benchmark").read_text("direct_url.json") or "null")
    except (md.PackageNotFoundError, ValueError, OSError):
        direct = None
    if isinstance(direct, dict):
        url = str(direct.get("url") or UNKNOWN)
        commit = (direct.get("vcs_info") or {}).get("commit_id")
        if commit:
            return {"version": version or UNKNOWN, "source": url, "commit": commit}, "direct-url"
        if url.startswith("file://"):
            sha = code_image.git_sha(Path(url[len("file://"):]))
            if sha:
                return {"version": version or UNKNOWN, "source": url, "commit": sha}, "runtime"
    if version:
        return {"version": version, "source": UNKNOWN, "commit": UNKNOWN}, "package-metadata"
    return {"version": UNKNOWN, "source": UNKNOWN, "commit": UNKNOWN}, "unknown"


#: the client library of each object store this tool writes to
OBJECT_LIBRARIES = {"s3": "s3dlio", "az": "azure-storage-blob", "gs": "google-cloud-storage"}


def storage_library(checkpoint_root: str, chosen: Optional[str] = None) -> tuple[dict, str]:
    """The client library the run's bytes went through: on s3://, storage_options.storage_library's
    (`chosen`, resolved; s3dlio by default), named as the run chose it, its package's version."""
    scheme = checkpoint_root.split("://", 1)[0] if "://" in checkpoint_root else ""
    library = OBJECT_LIBRARIES.get(scheme)
    if library is None:
        return {"name": "none"}, "n/a"
    package = library
    if scheme == "s3" and chosen:
        from dlio_ckpt_ext.storage.libraries import LIBRARIES
        library, package = chosen, LIBRARIES[chosen][1]
    version = _version(package)
    return {"name": library, "version": version or UNKNOWN}, "package-metadata" if version else "unknown"


def stamp(parameters: dict, digest: str, checkpoint_root: str, layout_version: int,
          library_chosen: Optional[str] = None) -> dict:
    """provenance.json for one timestamp folder."""
    dlio, dlio_tag = dlio_stamp()
    library, library_tag = storage_library(checkpoint_root, library_chosen)
    config = core_config(parameters)
    ours = md.version("dlio-ckpt-ext")
    sources = code_image.code_sources()
    return {"schema": PROVENANCE_SCHEMA, "rules_edition": RULES_EDITION, "layout_version": layout_version,
            "tool": {"name": "dlio-ckpt-ext", "version": ours,
                     "git_sha": code_image.git_sha(sources["dlio_ckpt_ext"]) or UNKNOWN,
                     "code_image": code_image.pointer(digest)},
            "dlio": dlio, "storage_library": library, "core_config": config,
            "stamped_at": code_image.utc_now(), "stamped_by": f"dlio-ckpt-submit {ours}",
            "provenance": {"rules_edition": "tool-constant", "layout_version": "tool-constant", "tool": "runtime",
                           "dlio": dlio_tag, "storage_library": library_tag,
                           "core_config": "runtime" if config["hash"] != UNKNOWN else "unknown"}}


def run_leaves(org_dir: Path) -> list[Path]:
    """Every checkpointing timestamp folder of an organisation:
    results/<system>/checkpointing/<model>/<YYYYMMDD_HHmmss>."""
    return sorted(p for p in org_dir.glob("results/*/checkpointing/*/*") if p.is_dir() and TIMESTAMP.match(p.name))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _leaf_entry(org_dir: Path, leaf: Path) -> dict:
    stamp_path = leaf / PROVENANCE_FILE
    stamped = _read_json(stamp_path)
    meta = next((_read_json(p) for p in sorted(leaf.glob("*_metadata.json"))), {})
    system, _, model = leaf.relative_to(org_dir).parts[1:4]
    pointer_path = leaf / code_image.POINTER_FILE
    pointer = pointer_path.read_text().strip() if pointer_path.is_file() else UNKNOWN
    return {"leaf": leaf.relative_to(org_dir).as_posix(), "benchmark": "checkpointing", "model": model,
            "command": "run", "accelerator": meta.get("accelerator") or UNKNOWN, "system": system,
            "rules_edition": stamped.get("rules_edition", UNKNOWN),
            "core_config": (stamped.get("core_config") or {}).get("hash", UNKNOWN),
            "code_image": pointer,
            "provenance": stamp_path.relative_to(org_dir).as_posix() if stamp_path.is_file() else "derived"}


def unreferenced_images(results: Path) -> list[Path]:
    """Pool images no run folder of any organisation points at (the checker's
    CHECK-03 fails them: left behind when run folders are removed)."""
    pointed = set()
    for org_dir in results.glob("*/*"):
        for leaf in run_leaves(org_dir):
            pointer = leaf / code_image.POINTER_FILE
            if pointer.is_file():
                pointed.add(f"code-{pointer.read_text().strip().partition(':')[2][:8]}")
    pool = results / code_image.POOL_DIR
    return sorted(p for p in pool.glob("code-*") if p.is_dir() and p.name not in pointed)


def write_manifest(results: Path, division: str, org: str, layout_version: int) -> Path:
    """<division>/<org>/submission.yaml from the tree as it is now (rewritten
    whole, so it lists exactly the run folders there are)."""
    org_dir = results / division / org
    runs = [_leaf_entry(org_dir, leaf) for leaf in run_leaves(org_dir)]
    stamps = [_read_json(org_dir / r["provenance"]) for r in runs if r["provenance"] != "derived"]
    systems = [{"name": y.stem, "description": f"systems/{y.name}",
                "pdf": f"systems/{y.stem}.pdf" if y.with_suffix(".pdf").is_file() else "missing"}
               for y in sorted((org_dir / "systems").glob("*.yaml"))]
    ours = md.version("dlio-ckpt-ext")
    manifest = {"schema": MANIFEST_SCHEMA, "orgname": org, "mode": division, "rules_edition": RULES_EDITION,
                "layout_version": layout_version, "generated_at": code_image.utc_now(),
                "generated_by": f"dlio-ckpt-submit {ours}",
                "tool_versions": sorted({s["tool"]["version"] for s in stamps}),
                "dlio_commits": sorted({s["dlio"]["commit"] for s in stamps} - {UNKNOWN}),
                "systems": systems, "runs": runs,
                "code_images": sorted({r["code_image"] for r in runs} - {UNKNOWN}),
                "provenance": {"rules_edition": "tool-constant", "runs": "walked"}}
    org_dir.mkdir(parents=True, exist_ok=True)
    path = org_dir / MANIFEST_FILE
    tmp = org_dir / f".{MANIFEST_FILE}.{os.getpid()}"
    tmp.write_text(yaml.safe_dump(manifest, sort_keys=False))
    os.replace(tmp, path)
    return path
