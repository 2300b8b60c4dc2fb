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


def test_on_a_file_system_a_claim_is_one_atomic_create_and_the_second_of_two_is_refused(tmp_path, monkeypatch):
    """A marker is created only where there is none (a hard link to its name): no settle and
    read back (SETTLE_S would fail this test with its sleep counted), and of two leases
    claiming one folder, the second is refused naming the first."""
    import pytest

    from dlio_ckpt_ext.errors import ConfigError
    from dlio_ckpt_ext.storage.posix import create_marker_file, read_marker_file, write_marker_file
    slept = []
    monkeypatch.setattr(ownership.time, "sleep", slept.append)
    marker = str(tmp_path / "owner.json")

    def folder() -> ownership.Folder:
        return ownership.Folder("workload.output.folder", str(tmp_path), lambda d: write_marker_file(marker, d),
                                lambda: read_marker_file(marker), lambda: ownership.os.unlink(marker),
                                lambda d: create_marker_file(marker, d))
    first, second = ownership.Lease(time.time()), ownership.Lease(time.time())
    assert first.claim(folder()) == [] and slept == []
    with pytest.raises(ConfigError, match="is using it; wait for it"):
        second.claim(folder())
    # the race the look cannot see: the marker appears between the second's read and its create
    reads = []
    raced = folder()
    raced.read = lambda: read_marker_file(marker) if reads.append(1) or len(reads) > 1 else None
    with pytest.raises(ConfigError, match="claimed it at the same moment"):
        second.claim(raced)
    assert slept == [] and [p.name for p in tmp_path.iterdir()] == ["owner.json"]  # no temporary file left
    first.release()
    assert not (tmp_path / "owner.json").exists()
