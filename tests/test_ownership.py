"""A run's claim on its folders: released, its marker stays gone even when a
heartbeat was being written at that moment (a slow store on a loaded machine)."""
import threading
import time

from dlio_ckpt_ext.dlio import ownership


def test_a_heartbeat_in_flight_at_the_release_does_not_leave_the_marker_behind(monkeypatch):
    monkeypatch.setattr(ownership, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(ownership, "SETTLE_S", 0.0)
    store: dict[str, bytes] = {}
    writes, beating = [], threading.Event()

    def write(data: bytes) -> None:
        writes.append(data)
        if len(writes) > 1:  # a heartbeat: slow, as a busy store's PUT
            beating.set()
            time.sleep(0.3)
        store["marker"] = data

    folder = ownership.Folder("workload.output.folder", "/x", write, lambda: store.get("marker"),
                              lambda: store.pop("marker", None))
    lease = ownership.Lease(time.time())
    assert lease.claim(folder) == []
    assert beating.wait(10)  # a heartbeat is being written now
    lease.release()
    time.sleep(0.5)  # anything still in flight would have landed
    assert "marker" not in store and len(writes) == 2
