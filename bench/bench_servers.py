"""The object server the benches measure through: a loopback SeaweedFS,
behind the emulated remote link when one is asked for."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from dlio_ckpt_ext.tools import local_s3
from dlio_ckpt_ext.tools.remote_link import LinkSpec


def link_of(text: str) -> Optional[LinkSpec]:
    """'10:40' (latency_ms:MB_per_s) -> the link; '' -> none."""
    return LinkSpec(*(float(x) for x in text.split(":"))) if text else None


def seaweedfs(data_dir: Path, link_text: str, bucket: str):
    """SeaweedFS started with `bucket`, this process's environment naming it; the server."""
    server = local_s3.start(data_dir, link=link_of(link_text))
    local_s3.create_bucket(server, bucket)
    os.environ.update(server.env())
    return server
