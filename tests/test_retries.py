"""Throttles and retries as each client says them (storage/retries.py,
storage/s3dlio_log.py), and as the results say them (results/phases.py)."""
import os
import subprocess
import sys
import textwrap

import pytest

from dlio_ckpt_ext.results import phases, windows
from dlio_ckpt_ext.storage import retries
from dlio_ckpt_ext.storage.s3dlio_log import count_line

#: lines as aws-smithy-runtime's standard retry strategy writes them through s3dlio (NO_COLOR)
SPAN = ('2026-12-03T19:00:00.123456Z DEBUG S3.UploadPart{rpc.service="S3" rpc.method="UploadPart" '
        'sdk_invocation_id=4821 rpc.system="aws-api"}:try_op: ')
THROTTLED = SPAN + ("attempt #1 failed with RetryIndicated(RetryableError { kind: ThrottlingError, "
                    "retry_after: None }); retrying after 731.2ms")
TRANSIENT = SPAN + ("attempt #2 failed with RetryIndicated(RetryableError { kind: TransientError, "
                    "retry_after: None }); retrying after 1.2s")
OUT_OF_ATTEMPTS = SPAN + "not retrying because we are out of attempts attempts=3 max_attempts=3"
NO_QUOTA = SPAN + "attempt #2 failed with ThrottlingError; not enough retry quota."
ATTEMPT = SPAN + "beginning attempt #1"


def counted(action) -> dict:
    before = retries.COUNTS.snapshot()
    action()
    return retries.since(before, retries.COUNTS.snapshot())


def test_the_sdks_retry_lines_are_counted_and_nothing_else():
    lines = [THROTTLED, TRANSIENT, OUT_OF_ATTEMPTS, NO_QUOTA, ATTEMPT, "[INFO] checkpoint save 1 THROTTLED",
             "retrying after 3s: a line of someone else's"]
    seen = []
    got = counted(lambda: seen.extend(count_line(line.encode()) for line in lines))
    assert got == {"throttled": 2, "retried": 2, "gave_up": 2}
    assert seen == [True, True, True, True, True, False, False]  # only tracing lines are s3dlio's


class Answer:
    def __init__(self, status: int) -> None:
        self.status_code, self.closed = status, False

    def close(self) -> None:
        self.closed = True


def test_send_with_retries_counts_each_throttle_and_retry_and_returns_the_first_good_answer(monkeypatch):
    monkeypatch.setattr(retries.time, "sleep", lambda s: None)
    answers = [Answer(503), Answer(429), Answer(500), ConnectionError("reset"), Answer(206), Answer(503)]
    sent = []

    def send():
        sent.append(answers[len(sent)])
        if isinstance(sent[-1], Exception):
            raise sent[-1]
        return sent[-1]
    got = counted(lambda: sent.append(retries.send_with_retries(send, lambda a: a.status_code, 6, 0.01,
                                                                (ConnectionError,))))
    assert sent[-1] is answers[4] and len(sent) == 6  # five sent, the answer appended
    assert got == {"throttled": 2, "retried": 4, "gave_up": 0}
    assert all(a.closed for a in answers[:3]) and not answers[4].closed


def test_the_last_attempt_gives_up_with_its_answer_or_its_error(monkeypatch):
    monkeypatch.setattr(retries.time, "sleep", lambda s: None)
    last = []
    got = counted(lambda: last.append(retries.send_with_retries(lambda: Answer(503), lambda a: a.status_code, 2, 0)))
    assert last[0].status_code == 503 and got == {"throttled": 2, "retried": 1, "gave_up": 1}

    def refused():
        raise ConnectionError("refused")
    with pytest.raises(ConnectionError):
        retries.send_with_retries(refused, lambda a: 200, 3, 0, (ConnectionError,))
    # a 404 is an answer, not a reason to retry
    got = counted(lambda: retries.send_with_retries(lambda: Answer(404), lambda a: a.status_code, 3, 0))
    assert got == {"throttled": 0, "retried": 0, "gave_up": 0}


def test_backoff_doubles_from_the_first_wait_with_jitter_and_a_limit():
    for attempt in range(8):
        wait = retries.backoff_s(attempt, 0.5, limit_s=4)
        assert min(4, 0.5 * 2 ** attempt) / 2 <= wait <= min(4, 0.5 * 2 ** attempt)


def window(rank: int, host: str, throttled: int, retried: int, counted: bool = True) -> dict:
    return {"step": 2, "start": 0.0, "end": 1.0 + rank, "elapsed_s": 1.0, "bytes": 100, "rank": rank, "host": host,
            **dict.fromkeys(windows.USAGE_KEYS, 0),
            "retries": {"throttled": throttled, "retried": retried, "gave_up": 0} if counted else None}


def test_a_windows_throttling_is_summed_named_by_rank_and_host_and_warned():
    w = windows.global_window([window(0, "a", 3, 4), window(1, "a", 0, 1), window(2, "b", 2, 2),
                               window(3, "b", 0, 0, counted=False)])
    assert w["retries"] == {"throttled": 5, "retried": 7, "gave_up": 0, "ranks_counted": 3, "ranks": 4,
                            "throttled_ranks": [0, 2], "throttled_hosts": {"a": 3, "b": 2}}
    assert windows.window_line("save", w).endswith("; 5 request(s) throttled")
    [warning] = phases.throttle_warnings("save", [w])
    assert warning.startswith("[WARNING] checkpoint save 2: 5 request(s) throttled on rank(s) 0, 2; host(s) a 3, b 2")
    calm = windows.global_window([window(0, "a", 0, 0)])
    assert phases.throttle_warnings("save", [calm]) == [] and "throttled" not in windows.window_line("save", calm)
    phase = phases.phase_retries([calm, w])
    assert phase["throttled"] == 5 and phase["throttled_steps"] == [2] and phase["ranks_counted"] == 1
    assert phases.retry_lines(phase) == [
        "  throttled requests           5 (retried 7, gave up 0; counted on 1 of 4 ranks) on rank(s) 0, 2; "
        "host(s) a 3, b 2; in checkpoint(s) 2"]
    # a file system: no client to count, no line
    assert phases.phase_retries([windows.global_window([window(0, "a", 0, 0, counted=False)])]) is None


def test_the_log_reader_counts_what_reaches_fd_1_and_passes_everything_else_on(tmp_path):
    """In a process of its own (it takes fd 1): s3dlio's tracing lines are
    counted and dropped, other writers' lines reach the real stdout, and
    Python's own prints no longer pass through the pipe at all."""
    script = textwrap.dedent(f"""
        import os, sys
        from dlio_ckpt_ext.storage import s3dlio_log
        from dlio_ckpt_ext.storage.retries import COUNTS
        reader = s3dlio_log.start()
        print("python's own line", flush=True)
        os.write(1, {(THROTTLED + chr(10) + ATTEMPT + chr(10)).encode()!r})
        os.write(1, b"a C library's line\\n")
        os.write(1, {(OUT_OF_ATTEMPTS + chr(10)).encode()!r})
        # a log line longer than a pipe's atomic write, our marker landing inside it
        os.write(1, b"2026-12-03T19:00:00.123Z DEBUG " + b"y" * 5000)
        s3dlio_log.counts()
        os.write(1, b"z" * 100 + bytes([10]))
        print(s3dlio_log.counts(), reader.lines_seen, file=sys.stderr, flush=True)
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["python's own line", "a C library's line"]
    assert run.stderr.strip() == "{'throttled': 1, 'retried': 1, 'gave_up': 1} 4"
