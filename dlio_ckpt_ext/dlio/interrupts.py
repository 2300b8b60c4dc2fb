"""SIGINT and SIGTERM turned into an exception in the main thread, and said at
once by a watch thread to the session of this process (a rank waiting in an
MPI barrier runs no Python handler before mpirun kills it)."""
from __future__ import annotations

import os
import signal
import threading

#: the session of this process, for DLIO's storage calls that must see the last
#: checkpoint persisted (listing the checkpoint folder before the reads)
_active = None  # a CheckpointSession


def active_session():
    """This process's CheckpointSession, or None."""
    return _active


def set_active(session) -> None:
    global _active
    _active = session


class Interrupted(BaseException):
    """SIGINT or SIGTERM (mpirun forwards Ctrl-C to every rank as SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame) -> None:
    # said before the exception unwinds: between checkpoints it may end the
    # interpreter before the watch thread is scheduled (seen on a loaded machine)
    if _active is not None:
        _active.say_signal(signum)
    raise Interrupted(signum)


def catch_interrupts() -> None:
    """Turn SIGINT and SIGTERM into an exception in the main thread, so the
    engine's cleanup (Writer.abort: no partial file, no open multipart upload)
    runs before the rank exits; the default SIGTERM action would skip it.
    A Python handler runs only once the main thread is back in Python, which a
    rank waiting in an MPI barrier never is before mpirun kills it: a watch
    thread is woken by the signal itself (signal.set_wakeup_fd) and tells the
    session at once, so a persist in the background is cancelled and said."""
    global _watching
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    if _watching:
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            for signum in os.read(r, 64):
                if _active is not None and signum in (signal.SIGINT, signal.SIGTERM):
                    _active.interrupted_in_background(signum)
    threading.Thread(target=watch, name="interrupt-watch", daemon=True).start()
    _watching = True


_watching = False
