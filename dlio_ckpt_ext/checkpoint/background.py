"""One checkpoint persisting at a time, in a background thread, the way
torch.distributed.checkpoint's async_save runs: a new checkpoint first waits
for the previous one to finish. Knows nothing of MPI or DLIO."""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional


class Cancelled(Exception):
    """The run is ending (Ctrl-C, a failure elsewhere): stop the upload now."""


def cancellable(progress: Optional[Callable[[int], None]], cancel: threading.Event) -> Callable[[int], None]:
    """A progress callback that raises Cancelled once `cancel` is set: the
    engine calls it after every chunk, so the writer then removes its partial
    file or open upload."""
    def update(nbytes: int) -> None:
        if cancel.is_set():
            raise Cancelled("the checkpoint was cancelled")
        if progress:
            progress(nbytes)
    return update


class BackgroundPersist:
    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        """on_error runs in the background thread when a persist fails: it must
        end the job (a peer would otherwise wait for this rank forever)."""
        self.on_error = on_error
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._cancel = threading.Event()
        #: the progress callback of the persisting writes (see cancellable)
        self.check = cancellable(None, self._cancel)

    def start(self, work: Callable[[], None], name: str) -> None:
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("a checkpoint is still persisting: wait() first")

        def run() -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - reported, then the job ends
                self._error = exc
                if not isinstance(exc, Cancelled):
                    self.on_error(exc)
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> tuple[bool, float]:
        """Block until the persist in flight (if any) is done: (was it still
        running, seconds waited). Raises the persist's error."""
        running = self.busy
        t0 = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
        waited = time.perf_counter() - t0
        if self._error is not None:
            raise self._error
        return running, waited

    def cancel(self, timeout: float = 30.0) -> None:
        self._cancel.set()
        if self._thread is not None:
            self._thread.join(timeout)
