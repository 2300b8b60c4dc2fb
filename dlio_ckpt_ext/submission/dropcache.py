"""Drop this host's page cache (run once per host with mpirun between the
write and read phases of a submission). Needs root."""
from __future__ import annotations

import os
import socket
import sys


def drop_page_cache() -> str:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("3\n")
    return f"{socket.gethostname()}: page cache dropped"


if __name__ == "__main__":
    try:
        print(drop_page_cache(), flush=True)
    except OSError as exc:
        print(f"{socket.gethostname()}: cannot drop the page cache: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
