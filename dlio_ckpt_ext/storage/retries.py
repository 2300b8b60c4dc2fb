"""Throttled and retried requests, as this process's clients saw them.

A busy object store answers "not now" (S3's 503 SlowDown, Azure's 503
ServerBusy, GCS's 429) and the client waits and sends the request again: the
request succeeds, the bytes are right, and only the time shows it. At scale
throttling is the first thing a store does, so each client says it here as it
happens: the Azure SDK through its retry policy, GCS through our own retry
loops and its SDK's Retry callback, s3dlio through its debug log
(storage/s3dlio_log.py). One process-wide tally: a rank's requests are all its
own, and the session reads it around each checkpoint.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Callable, Optional, TypeVar

#: statuses a store throttles with
THROTTLE_STATUS = frozenset({429, 503})
#: statuses worth another attempt (GCS's and Azure's guidance: 408, 429 and 5xx but 501/505)
RETRY_STATUS = THROTTLE_STATUS | {408, 500, 502, 504}
#: throttled: answers saying "too busy"; retried: attempts sent again (any cause);
#: gave_up: requests that failed on their last attempt (the run then fails)
KEYS = ("throttled", "retried", "gave_up")


class RetryCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(KEYS, 0)

    def add(self, throttled: bool = False, retried: bool = False, gave_up: bool = False) -> None:
        with self._lock:
            self._counts["throttled"] += throttled
            self._counts["retried"] += retried
            self._counts["gave_up"] += gave_up

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


COUNTS = RetryCounts()


def since(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """The counts between two snapshots: None where the client could not
    count by the end; a start without counts is a start before any."""
    if after is None:
        return None
    return {k: after[k] - (before or {}).get(k, 0) for k in KEYS}


def backoff_s(attempt: int, first_s: float, limit_s: float = 32.0) -> float:
    """Exponential with full jitter, as the clouds' guidance has it: attempt 0 waits up to first_s."""
    return random.uniform(0.5, 1.0) * min(limit_s, first_s * 2 ** attempt)


R = TypeVar("R")


def send_with_retries(send: Callable[[], R], status: Callable[[R], int], attempts: int, first_backoff_s: float,
                      transient: tuple[type[BaseException], ...] = ()) -> R:
    """send() until its answer's status is not worth another attempt or the
    attempts are spent (the last answer is returned, the last error raised),
    each retry and throttle counted."""
    for attempt in range(attempts):
        last = attempt + 1 == attempts
        try:
            answer = send()
        except transient:
            COUNTS.add(retried=not last, gave_up=last)
            if last:
                raise
        else:
            code = status(answer)
            if code not in RETRY_STATUS:
                return answer
            COUNTS.add(throttled=code in THROTTLE_STATUS, retried=not last, gave_up=last)
            if last:
                return answer
            close = getattr(answer, "close", None)
            if close is not None:
                close()
        time.sleep(backoff_s(attempt, first_backoff_s))
    raise AssertionError("unreachable: the last attempt returns or raises")
