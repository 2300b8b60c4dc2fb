"""End to end on a busy object store: mpirun + dlio_benchmark through a front
that answers every 7th data request itself (503 SlowDown before a real
SeaweedFS, 503 ServerBusy before Azurite). What each rank's client retried,
counted by the client itself (s3dlio from its SDK's log, Azure's SDK through
its retry policy), must be what the front did: in RESULTS, the record and the
rank stats."""
import dataclasses
import re

import pytest

from cloud_servers import CONTAINER, needs, start_server
from conftest import BUCKET
from dlio_run import run_dlio
from throttle_front import ThrottleFront

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


@pytest.mark.parametrize("store", ["s3", pytest.param("az", marks=needs("az"))])
def test_throttled_requests_are_counted_on_every_rank_as_the_front_counted(store, workdir, request):
    server = request.getfixturevalue("s3") if store == "s3" else start_server("az", workdir / "data")
    front = ThrottleFront(port_of(server.endpoint), every=7, store=store)
    if store == "s3":
        env, root, extra = {**server.env(), "AWS_ENDPOINT_URL": front.endpoint}, f"s3://{BUCKET}/busy", []
    else:  # Azure's SDK waits 15 s before its first retry by default
        env = dataclasses.replace(server, endpoint=front.endpoint).env()
        root, extra = f"az://{CONTAINER}/busy", ["++workload.storage.storage_options.retry_backoff_s=0.05"]
    try:
        run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root={root}",
                       "++workload.checkpoint.num_checkpoints_write=3", "++workload.checkpoint.num_checkpoints_read=3",
                       "++workload.streaming.verify=True", "++workload.storage.storage_options.max_attempts=6",
                       *extra, env=env, checkpoint_folder="busy")
    finally:
        front.stop()
        if store != "s3":
            server.stop()
    assert run.returncode == 0, run.output[-3000:]
    sent = front.counts
    assert sent.throttled_puts and sent.throttled_gets  # saves and verified loads both throttled
    record, stats = run.record(), run.rank_stats()
    by_phase = {p: record[p]["results"]["retries"] for p in ("save", "load")}
    assert sum(c["throttled"] for c in by_phase.values()) == sent.throttled
    assert all(c["retried"] == c["throttled"] and c["gave_up"] == 0 and c["ranks_counted"] == 2
               for c in by_phase.values())
    # each rank's own checkpoints add up to the same, and no rank saw a throttle outside them
    per_rank = [sum(w["retries"]["throttled"] for p in ("save", "load") for w in s["phases"][p]) for s in stats]
    assert sum(per_rank) == sent.throttled == sum(s["retries_total"]["throttled"] for s in stats)
    assert sorted(r for r, n in enumerate(per_rank) if n) == sorted(
        set(by_phase["save"]["throttled_ranks"]) | set(by_phase["load"]["throttled_ranks"]))
    said = [int(n) for n in re.findall(r"^  throttled requests +(\d+) \(retried \1, gave up 0\)", run.stdout, re.M)]
    assert said == [by_phase["save"]["throttled"], by_phase["load"]["throttled"]], run.stdout[-4000:]
    for phase, c in by_phase.items():
        windows = record[phase]["per_checkpoint"]
        assert sum(w["retries"]["throttled"] for w in windows) == c["throttled"]
        # each throttled checkpoint said as it ended, and warned in RESULTS
        for w in windows:
            throttled = w["retries"]["throttled"]
            assert (f"[INFO] checkpoint {phase} {w['step']}, every rank done: " in run.stdout) and \
                ((f"; {throttled} request(s) throttled" in run.stdout) if throttled else True)
            assert (f"[WARNING] checkpoint {phase} {w['step']}: {throttled} request(s) throttled"
                    in run.stdout) == bool(throttled)
