"""Evidence that the checkpoints and the results are on different file systems
(rules 4.4.2): a hard link from a file in the checkpoint folder into the
results folder fails with EXDEV exactly when it would cross file systems.
Written as fs_separation.json in each timestamp folder; object stores are
exempt (there is no file system to compare)."""
from __future__ import annotations

import errno
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Optional

from dlio_ckpt_ext.submission.code_image import utc_now

FILE = "fs_separation.json"


def local_path(storage_type: str, checkpoint_root: str) -> Optional[str]:
    """The checkpoint folder as a path, or None for an object store."""
    for scheme in ("direct://", "file://"):
        if checkpoint_root.startswith(scheme):
            return checkpoint_root[len(scheme):]
    if "://" in checkpoint_root or storage_type == "s3":
        return None
    return checkpoint_root


def existing(path: str) -> str:
    """`path`, or its nearest parent that exists."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def probe(checkpoints: str, results: str) -> dict:
    """Link a fresh file from `checkpoints` into `results` (folders that
    exist); any error but EXDEV means the question cannot be answered and is
    raised, naming both."""
    name = f".dlio-ckpt-fs-probe-{uuid.uuid4().hex}"
    src, dst = os.path.join(checkpoints, name), os.path.join(results, name + "-link")
    try:
        os.close(os.open(src, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        try:
            os.link(src, dst)
            same = True
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise OSError(exc.errno, f"cannot tell whether {checkpoints} and {results} share a file system: "
                                         f"{exc.strerror}") from exc
            same = False
    finally:
        for path in (src, dst):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    return {"version": 1, "method": "link_exdev", "data_or_chkpt_path": checkpoints, "results_path": results,
            "data_or_chkpt_realpath": os.path.realpath(checkpoints), "results_realpath": os.path.realpath(results),
            "same_filesystem": same, "probed_at": utc_now(),
            # the launcher probes before the ranks start, as mlpstorage's rank-0 gate does
            "probed_by_rank": 0, "probed_by_host": socket.gethostname()}


def write(folder: Path, evidence: dict) -> None:
    (folder / FILE).write_text(json.dumps(evidence, indent=2) + "\n")
