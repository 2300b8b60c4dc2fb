"""A writer that lends its own block buffers to the generator and uploads
each filled block behind the caller, a bounded number at a time.

Azure's Put Block and GCS's resumable chunks take a whole request body; the
SDKs' own streaming writers copy every byte into a growing buffer (Azure's
upload_blob of a stream, GCS's BlobWriter) or, for s3dlio's az:// writer,
hold the whole object. Here the generator fills one of at most
`in_flight + 1` buffers in place (reserve), commit() hands it to an upload
thread, and reserve() blocks only while every buffer is still uploading: a
rank holds (in_flight + 1) x chunk bytes per open object, whatever its size,
and every byte is written once, by the generator. Buffers outlive their
object in the backend's SpareBuffers, so the next object's blocks reuse their
pages instead of faulting in new ones.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

from dlio_ckpt_ext.engine.storage_interface import Writer
from dlio_ckpt_ext.errors import StorageError


class SpareBuffers:
    """Block buffers of closed objects, kept for the next ones (one per backend)."""

    def __init__(self) -> None:
        self._spare: queue.SimpleQueue = queue.SimpleQueue()

    def take(self, n: int) -> bytearray:
        try:
            buf = self._spare.get_nowait()
        except queue.Empty:
            return bytearray(n)
        return buf if len(buf) >= n else bytearray(n)

    def give(self, bufs: list[bytearray]) -> None:
        for buf in bufs:
            self._spare.put(buf)


class LentBlockWriter(Writer):
    """Subclasses say how one block is sent (`send_block`, called with the
    block's index, its offset and its bytes), how the object is completed
    (`finish`, after every block was sent) and discarded (`discard`).
    `ordered`: blocks are sent one at a time, in order (GCS's resumable
    uploads); otherwise up to `in_flight` at once (Azure's blocks)."""
    zero_copy = True

    def __init__(self, uri: str, size: int, in_flight: int, ordered: bool, spare: SpareBuffers) -> None:
        self.uri, self.size, self._spare = uri, size, spare
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self._owned: list[bytearray] = []
        self._most = in_flight + 1
        self._pool = ThreadPoolExecutor(max_workers=1 if ordered else in_flight,
                                        thread_name_prefix="block-upload")
        self._pending: list[Future] = []
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._current: Optional[bytearray] = None
        self._offset, self._index = 0, 0

    # -- what subclasses provide
    def send_block(self, index: int, offset: int, data: memoryview) -> None:
        raise NotImplementedError

    def finish(self, blocks: int) -> None:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    # -- the Writer interface
    def reserve(self, n: int) -> memoryview:
        self._raise_failed()
        buf = self._take(n)
        self._current = buf
        return memoryview(buf)[:n]

    def commit(self, n: int) -> None:
        buf, self._current = self._current, None
        if buf is None:
            raise StorageError(f"upload of {self.uri}: commit without reserve")
        index, offset = self._index, self._offset
        self._index, self._offset = index + 1, offset + n
        if self._offset > self.size:
            self._free.put(buf)
            raise StorageError(f"upload of {self.uri}: {self._offset} bytes handed over, {self.size} planned")
        self._pending.append(self._pool.submit(self._send, buf, index, offset, n))
        self._pending = [f for f in self._pending if not f.done()]

    def write(self, data: memoryview) -> None:
        view = self.reserve(len(data))
        view[:] = data
        self.commit(len(data))

    def close(self) -> None:
        try:
            self._drain()
            self._raise_failed()
            if self._offset != self.size:
                raise StorageError(f"upload of {self.uri}: {self._offset} bytes written, {self.size} planned")
            self.finish(self._index)
        except BaseException:
            self.abort()
            raise
        finally:
            self._release()

    def abort(self) -> None:
        for f in self._pending:
            f.cancel()
        self._drain()
        self._release()
        try:
            self.discard()
        except Exception:  # noqa: BLE001 - best effort: the original error is what matters
            pass

    def _release(self) -> None:
        self._pool.shutdown(wait=False)
        self._spare.give(self._owned)
        self._owned = []

    # -- internals
    def _take(self, n: int) -> bytearray:
        while True:
            try:
                buf = self._free.get_nowait()
            except queue.Empty:
                if len(self._owned) < self._most:
                    self._owned.append(self._spare.take(n))
                    return self._owned[-1]
                buf = self._free.get()  # every buffer is uploading: wait for the storage
            self._raise_failed()
            if len(buf) >= n:
                return buf
            self._owned.remove(buf)  # a larger block than before (never with one chunk size)

    def _send(self, buf: bytearray, index: int, offset: int, n: int) -> None:
        try:
            if self._error is None:
                self.send_block(index, offset, memoryview(buf)[:n])
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's next call
            with self._lock:
                self._error = self._error or exc
        finally:
            self._free.put(buf)

    def _drain(self) -> None:
        for f in self._pending:
            if not f.cancelled():
                f.exception()
        self._pending = []

    def _raise_failed(self) -> None:
        if self._error is not None:
            err = self._error
            if isinstance(err, StorageError):
                raise err
            raise StorageError(f"cannot upload {self.uri}: {err}") from err

