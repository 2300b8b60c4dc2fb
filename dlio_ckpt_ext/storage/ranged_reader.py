"""Ranged GETs of one object that know its planned size (S3, Azure, GCS alike)."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

from dlio_ckpt_ext.engine.storage_interface import Reader

_STAT_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="object-size")


class PlannedRangeReader(Reader):
    """Ranged GETs whose bytes are the client library's (lent: no copy). A
    size the caller knows (the plan's) costs no request: the GET that ends
    there asks for one byte more, so a shorter object ends a GET early and a
    longer one returns that byte (and only then is its size asked for, to say
    it). Otherwise the size is asked for in the background, so the first GETs
    do not wait a round trip for it; a missing object fails the first GET."""
    lends_memory = True

    def __init__(self, uri: str, size: Optional[int], get_range: Callable[[int, int], bytes],
                 stat: Callable[[], int], probe: bool = True) -> None:
        """probe=False: never ask for the byte past the planned end (a client that
        splits requests at its part size would send one more GET for it)."""
        self.uri, self.planned, self._get_range, self._stat = uri, size, get_range, stat
        self._probes = probe
        self._size: Future = Future()
        if size is None:
            self._size = _STAT_POOL.submit(stat)
        else:
            self._size.set_result(size)

    @property
    def size(self) -> int:
        return self._size.result()

    def read(self, offset: int, length: int) -> memoryview:
        probe = self._probes and self.planned is not None and offset + length == self.planned
        data = memoryview(self._get_range(offset, length + probe))
        if probe and len(data) > length:  # longer than planned: its real size, for the error
            self._size = _STAT_POOL.submit(self._stat)
            return data[:length]
        return data

    def readinto(self, offset: int, buf: memoryview, length: int) -> int:
        data = self.read(offset, length)
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self._size.cancel()
