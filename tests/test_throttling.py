"""A busy object store: a front answering a known share of the data requests
itself (throttle_front.py) before a real Azurite and fake-gcs-server; what
the clients counted must be what the front did, and every byte still right.
(S3 end to end, through DLIO and its results: test_throttling_run.py.)"""
import dataclasses
import os

import pytest

from cloud_servers import CONTAINER, KINDS, Objects, needs, start_server
from s3_server import retire
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, derive_seed, load_file, save_file
from dlio_ckpt_ext.storage import open_backend, retries
from s3_server import free_port
from throttle_front import ThrottleFront

MiB = 1 << 20
EVERY = 4


@pytest.fixture(scope="module", params=[pytest.param(k, marks=needs(k)) for k in KINDS])
def busy(request, tmp_path_factory):
    """The server behind a throttling front; the environment names the front.
    (fake-gcs-server names its upload sessions by the front's address too.)"""
    kind = request.param
    front_port = free_port()
    server = start_server(kind, tmp_path_factory.mktemp(f"{kind}-busy"), external_port=front_port)
    front = ThrottleFront(int(server.endpoint.rsplit(":", 1)[1]), EVERY, kind, port=front_port)
    saved = dict(os.environ)
    os.environ.update(dataclasses.replace(server, endpoint=front.endpoint).env())
    yield server, front
    os.environ.clear()
    os.environ.update(saved)
    front.stop()
    retire(server)


def test_every_throttled_request_is_counted_as_the_front_counted_and_the_bytes_are_right(busy):
    server, front = busy
    b = open_backend("s3", f"{server.kind}://{CONTAINER}/busy",
                     {"max_in_flight": 3, "max_attempts": 8, "retry_backoff_s": 0.02})
    pool = BufferPool(3, 4 * MiB)
    sizes = {f"step1/f{i}.pt": 9 * MiB + i for i in range(3)}
    specs = {p: ContentSpec(derive_seed(p, server.kind)) for p in sizes}
    before, front_before = b.retry_counts(), front.counts.throttled
    try:
        for p, size in sizes.items():
            save_file(b, p, size, specs[p], pool)
        for p, size in sizes.items():
            assert load_file(b, p, size, pool, content=specs[p], parallelism=2).nbytes == size
    finally:
        pool.close()
    throttled = front.counts.throttled - front_before
    # 3 files x 3 chunks uploaded, and read back: 18 data requests and their retries
    assert throttled >= 18 // EVERY and front.counts.throttled_puts and front.counts.throttled_gets
    assert retries.since(before, b.retry_counts()) == {"throttled": throttled, "retried": throttled, "gave_up": 0}
    assert Objects(server).sizes("busy/") == {f"busy/{p}": n for p, n in sizes.items()}
