"""s3dlio's retries, read from its debug log.

s3dlio 0.10 has no retry counter, callback or interceptor; the AWS SDK under
it says each retry only in its tracing log, which s3dlio writes to the
process's fd 1 once `init_logging("debug")` was called (the level is for every
crate and set once per process). So a rank that counts its retries hands fd 1
to a pipe read by a thread here, which counts the SDK's retry lines, drops the
rest of the log, and passes anything else written to fd 1 on unchanged;
Python's own sys.stdout is moved to the real stdout first, so our and DLIO's
lines never wait on that thread. What the SDK says (aws-smithy-runtime's
standard retry strategy):

    attempt #1 failed with RetryIndicated(RetryableError { kind: ThrottlingError, ... }); retrying after 731ms
    not retrying because we are out of attempts attempts=3 max_attempts=3
    attempt #2 failed with ThrottlingError; not enough retry quota.

s3dlio's own get_range loop around the SDK (after the SDK gave up) logs
nothing of its own: its attempts count as the SDK's give-up.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import io
import os
import re
import sys
import threading
from typing import Optional

from dlio_ckpt_ext.storage.retries import COUNTS

#: a tracing line: "<RFC 3339 time> <LEVEL> ..."
_TRACING = re.compile(rb"^\S+Z\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s")
_RETRYING = b"; retrying after "
_THROTTLE = b"ThrottlingError"
_GAVE_UP = (b"not retrying because we are out of attempts", b"not enough retry quota")
#: room in the pipe for a burst of log lines while the reader waits for the GIL
PIPE_BYTES = 1 << 20
_SYNC = b"\x00ckpt-ext-sync "


def count_line(line: bytes) -> bool:
    """Tell COUNTS what a tracing line says; False if it is no tracing line."""
    if not _TRACING.match(line):
        return False
    if _RETRYING in line:
        COUNTS.add(throttled=_THROTTLE in line, retried=True)
    elif any(g in line for g in _GAVE_UP):
        COUNTS.add(throttled=_THROTTLE in line, gave_up=True)
    return True


class LogReader:
    """fd 1 -> a pipe read here; the real stdout kept for everything else."""

    def __init__(self) -> None:
        import s3dlio
        os.environ["NO_COLOR"] = "1"
        sys.stdout.flush()
        self.stdout_fd = os.dup(1)
        read_end, write_end = os.pipe()
        try:
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # the default 64 KiB; the reader keeps up with the log at any rate measured
        os.dup2(write_end, 1)
        os.close(write_end)
        sys.stdout = _text_like(sys.stdout, self.stdout_fd)
        self._read_end = read_end
        self.lines_seen = 0
        self._synced = threading.Condition()
        self._sync_sent = self._sync_seen = 0
        threading.Thread(target=self._read, name="s3dlio-log", daemon=True).start()
        # what others wrote to the old stdout (a logging handler made before us) reaches the real one before exit
        atexit.register(self._drain)
        s3dlio.init_logging("debug")

    def _drain(self) -> None:
        with contextlib.suppress(Exception):
            sys.__stdout__.flush()
            self.sync()

    def _read(self) -> None:
        rest, cut = b"", False
        while data := os.read(self._read_end, 1 << 16):
            *lines, rest = (rest + data).split(b"\n")
            passed = []
            for line in lines:
                if cut:  # the rest of a log line our marker landed in
                    cut = False
                    continue
                # (anywhere in the line: a log line over PIPE_BUF bytes is not written
                # atomically, and our marker may land inside it, ending it)
                at = line.find(_SYNC)
                if at >= 0:
                    with self._synced:
                        self._sync_seen = int(line[at + len(_SYNC):])
                        self._synced.notify_all()
                    line, cut = line[:at], at > 0
                    if not line:
                        continue
                if count_line(line):
                    self.lines_seen += 1
                else:
                    passed.append(line + b"\n")
            if passed:
                _write_all(self.stdout_fd, b"".join(passed))
        if rest:
            _write_all(self.stdout_fd, rest)

    def sync(self, timeout_s: float = 5.0) -> None:
        """Return once every line written to fd 1 before this call is counted."""
        with self._synced:
            self._sync_sent += 1
            ticket = self._sync_sent
        _write_all(1, _SYNC + str(ticket).encode() + b"\n")
        with self._synced:
            self._synced.wait_for(lambda: self._sync_seen >= ticket, timeout_s)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _text_like(old, fd: int):
    """A sys.stdout on fd, buffered as the old one was."""
    return io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
                            encoding=getattr(old, "encoding", None) or "utf-8",
                            errors=getattr(old, "errors", None) or "strict",
                            line_buffering=getattr(old, "line_buffering", False), write_through=False)


_READER: Optional[LogReader] = None
_LOCK = threading.Lock()


def start() -> LogReader:
    """Count s3dlio's retries in this process from now on (once; before s3dlio's first request)."""
    global _READER
    with _LOCK:
        if _READER is None:
            _READER = LogReader()
        return _READER


def counts() -> Optional[dict]:
    """The process's counts so far, every line written until now included;
    None unless start() was called and s3dlio's log has reached us (before
    this process's first request it has not; a process that set s3dlio's log
    up before us keeps it, and then nothing can be counted)."""
    if _READER is None:
        return None
    _READER.sync()
    return COUNTS.snapshot() if _READER.lines_seen else None
