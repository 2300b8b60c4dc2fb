"""Abort a rank's open multipart uploads when the rank is killed.

After a Ctrl-C, mpirun (Open MPI 5 / PRRTE) sends every rank SIGTERM and
about 0.25 s later SIGKILL (measured: docs/object-storage.md). That is often too short for a
rank's own abort: s3dlio's abort first waits for the parts in flight (1.2-2 s
for two uploads of six 32 MiB parts on the loopback server), and a rank
blocked in an upload call runs its signal handler only when the call
returns. An upload left open keeps its parts, invisible and billed by real
stores, until someone aborts it.

So each rank that uploads starts this helper once, in a session of its own
that mpirun's kill does not reach, and tells it through a pipe which keys it
is about to upload ("open") and which uploads it completed or aborted
("done"). The helper blocks on the pipe (no CPU). When the pipe closes, the
rank has exited, normally or killed; for every key still open the helper
aborts the uploads left on it (boto3, the same calls as `dlio-ckpt-report
uploads --abort`, with the rank's environment). A dead rank starts no part,
so nothing races these aborts; a rank that exits normally leaves nothing
open and the helper just exits.

Run as a file (not `-m`), so that starting it imports nothing of the package.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from typing import IO, Optional


class UploadWatch:
    """The rank's side: one helper process per rank, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # aborts run side by side in threads
        self._pipe: Optional[IO[str]] = None
        self._started = False

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._pipe = _start()

    def opening(self, uri: str) -> None:
        """Before the upload of `uri` is created: after a kill, it is aborted."""
        self._tell("open", uri)

    def done(self, uri: str) -> None:
        """The upload of `uri` completed or was aborted by the rank itself."""
        self._tell("done", uri)

    def _tell(self, what: str, uri: str) -> None:
        with self._lock:
            self._start()
            if self._pipe is None:
                return
            try:
                self._pipe.write(f"{what} {uri}\n")
                self._pipe.flush()
            except OSError:  # the helper died: uploads go on, `dlio-ckpt-report uploads` remains
                self._pipe = None


def _start() -> Optional[IO[str]]:
    try:
        proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    except OSError:
        return None
    return proc.stdin


#: the rank's watch (one per process)
WATCH = UploadWatch()


def _abort_left_open(uri: str) -> None:
    from dlio_ckpt_ext.storage.uploads import abort_uploads, open_uploads
    key = uri[len("s3://"):].partition("/")[2]
    abort_uploads(uri, [u for u in open_uploads(uri) if u["key"] == key])


def main(lines: IO[str]) -> int:
    still_open: set[str] = set()
    for line in lines:  # ends when the rank exits, however it exits
        what, _, uri = line.rstrip("\n").partition(" ")
        (still_open.add if what == "open" else still_open.discard)(uri)
    failed = 0
    for uri in sorted(still_open):
        try:
            _abort_left_open(uri)
        except Exception:  # noqa: BLE001 - the others may still be aborted
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    del sys.path[0]  # this file's folder: its modules (base, posix, ...) are not top-level ones
    sys.exit(main(sys.stdin))
