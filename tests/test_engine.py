"""Streaming engine + POSIX backend on real files."""
import hashlib
import os
import subprocess
import sys
import time

import pytest

from dlio_ckpt_ext.engine import BufferPool, ContentSpec, derive_seed, load_file, save_file, send_file
from dlio_ckpt_ext.engine import content as content_mod
from dlio_ckpt_ext.engine.buffers import PAGE, huge_page_bytes, thp_setting
from dlio_ckpt_ext.errors import StorageError, VerificationError
from dlio_ckpt_ext.engine.storage_interface import Backend, Writer
from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions
from memory_maps import anon_huge_pages, mapping_permissions

MiB = 1 << 20


def backend(root, mode="direct"):
    b = PosixBackend(str(root), PosixOptions(write_mode=mode, read_mode=mode))
    b.prepare("ckpt")
    return b


def fail_generation_at(monkeypatch, call: int = 3) -> None:
    """The content generator raises at its `call`-th chunk ("generator failed part-way")."""
    from dlio_ckpt_ext.engine import stream
    real = stream.generator

    class FailingGenerator:
        def __init__(self, *a, **kw):
            self.gen, self.calls = real(*a, **kw), 0

        def fill_chunk(self, view):
            self.calls += 1
            if self.calls == call:
                raise RuntimeError("generator failed part-way")
            return self.gen.fill_chunk(view)

    monkeypatch.setattr(stream, "generator", FailingGenerator)


def expected_bytes(spec, size):
    """The file's content generated in one go, independently of the pipeline."""
    gen = content_mod.generator(spec, size, chunk_size=size)
    buf = bytearray(size)
    assert gen.fill_chunk(buf) == size
    return bytes(buf)


@pytest.fixture
def pool():
    p = BufferPool(3, MiB)
    yield p
    p.close()


@pytest.mark.parametrize("mode", ["direct", "buffered"])
@pytest.mark.parametrize("size", [PAGE * 3 + 1, 2 * MiB + PAGE * 5 + 1, 5 * MiB, 1])
def test_save_writes_exact_bytes_and_load_verifies(workdir, pool, mode, size):
    b = backend(workdir, mode)
    spec = ContentSpec(derive_seed(0, "ckpt", 0, f"f{size}"))
    stats = save_file(b, "ckpt/f.pt", size, spec, pool)
    path = workdir / "ckpt" / "f.pt"
    assert path.stat().st_size == size
    assert path.read_bytes() == expected_bytes(spec, size)
    assert stats.nbytes == size and sum(c[1] for c in stats.chunks) == size
    loaded = load_file(b, "ckpt/f.pt", size, pool, content=spec)
    assert loaded.nbytes == size and loaded.fill_s > 0 and loaded.io_s > 0


def test_parallel_range_readers_verify_whole_file(workdir, pool):
    b = backend(workdir)
    spec = ContentSpec(derive_seed(1, "x"))
    size = 7 * MiB + 123
    save_file(b, "ckpt/f.pt", size, spec, pool)
    stats = load_file(b, "ckpt/f.pt", size, pool, content=spec, parallelism=2)
    assert sorted(c[0] for c in stats.chunks) == [i * MiB for i in range(8)]


def flip_byte(path, offset):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("offset", [0, MiB + 17, 3 * MiB - 1])
def test_verify_names_file_and_offset_of_a_flipped_byte(workdir, pool, offset):
    b = backend(workdir)
    spec = ContentSpec(derive_seed(2, "x"))
    save_file(b, "ckpt/f.pt", 3 * MiB, spec, pool)
    flip_byte(workdir / "ckpt" / "f.pt", offset)
    with pytest.raises(VerificationError, match=f"f.pt differs .* at byte offset {offset}$"):
        load_file(b, "ckpt/f.pt", 3 * MiB, pool, content=spec, parallelism=2)


@pytest.mark.parametrize("new_size", [3 * MiB - 1, 3 * MiB + 1])
def test_short_or_long_file_fails(workdir, pool, new_size):
    b = backend(workdir)
    spec = ContentSpec(derive_seed(3, "x"))
    save_file(b, "ckpt/f.pt", 3 * MiB, spec, pool)
    os.truncate(workdir / "ckpt" / "f.pt", new_size)
    with pytest.raises(VerificationError, match=f"f.pt has {new_size} bytes, expected {3 * MiB}"):
        load_file(b, "ckpt/f.pt", 3 * MiB, pool, content=spec)


def test_missing_file_fails_naming_it(workdir, pool):
    b = backend(workdir)
    with pytest.raises(StorageError, match="missing checkpoint file .*ckpt/nope.pt"):
        load_file(b, "ckpt/nope.pt", MiB, pool)


class SlowCheckingWriter(Writer):
    """Keeps what it is given and checks the buffer did not change while it
    held it: a producer refilling a buffer still being written would show."""

    def __init__(self):
        self.data = bytearray()
        self.changed = 0

    def write(self, data):
        before = hashlib.sha1(data).digest()
        time.sleep(0.01)
        if hashlib.sha1(data).digest() != before:
            self.changed += 1
        self.data += data

    def close(self):
        pass

    def abort(self):
        pass


class MemoryBackend(Backend):
    def __init__(self, writer):
        self.writer = writer

    def uri(self, path):
        return f"mem://{path}"

    def prepare(self, directory):
        pass

    def open_writer(self, path, size):
        return self.writer

    def open_reader(self, path, size=None):
        raise NotImplementedError

    def list_sizes(self, directory):
        return {}

    def delete_file(self, path):
        return False


def test_pool_never_hands_out_a_buffer_still_being_written(pool):
    writer = SlowCheckingWriter()
    spec = ContentSpec(derive_seed(4, "x"))
    size = 12 * MiB + 5
    stats = save_file(MemoryBackend(writer), "f", size, spec, pool)
    assert writer.changed == 0
    assert bytes(writer.data) == expected_bytes(spec, size)
    # the writer was the bottleneck, so the producer really waited for free buffers
    assert stats.wait_free_s > 0 and stats.chunks_io_bound == len(stats.chunks)


def test_file_seeds_never_reproduce_another_files_content():
    parts = [(0, "global_epoch1_step1", 0, "a.pt"), (0, "global_epoch1_step1", 1, "a.pt"),
             (0, "global_epoch1_step2", 0, "a.pt"), (0, "global_epoch1_step1", 0, "b.pt"),
             (1, "global_epoch1_step1", 0, "a.pt")]
    seeds = [derive_seed(*p) for p in parts]
    assert len(set(seeds)) == len(seeds)
    assert derive_seed(*parts[0]) == seeds[0]  # deterministic
    blobs = [expected_bytes(ContentSpec(s), 4 * MiB) for s in seeds]
    # no file equals another, nor another shifted by whole 1 MiB blocks
    for i, a in enumerate(blobs):
        for j, b in enumerate(blobs):
            if i != j:
                assert all(a[k * MiB:(k + 1) * MiB] not in b for k in range(4))


def test_content_is_seekable_at_block_offsets():
    spec = ContentSpec(derive_seed(5, "x"))
    whole = expected_bytes(spec, 6 * MiB)
    gen = content_mod.generator(spec, 2 * MiB, offset=3 * MiB, chunk_size=2 * MiB)
    part = bytearray(2 * MiB)
    gen.fill_chunk(part)
    assert bytes(part) == whole[3 * MiB:5 * MiB]


@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.parametrize("number_bytes", [0, 4])
def test_content_is_the_same_whatever_the_threads_and_the_cuts(threads, number_bytes):
    """A file's bytes are its seed's, however many threads generate them and however its fills
    are cut: a writer's 1 MiB chunks and a reader's whole-file request, from the start or from
    inside a block (dgen-py alone gives another last byte to a two-thread fill that spans blocks
    and ends inside one: a one-rank restore failed its verification on it)."""
    size = 5 * MiB + 1577
    spec = ContentSpec(derive_seed(9, "t"), number_bytes=number_bytes)
    whole = expected_bytes(spec, size)   # one thread, one fill
    for offset, cuts in ((0, [size]), (0, [MiB] * 5 + [1577]), (0, [1_000_000, 2 * MiB, size - 3_097_152]),
                         (MiB + 999, [size - MiB - 999]), (MiB + 999, [7, MiB, size - 2 * MiB - 1006])):
        gen = content_mod.generator(spec, size - offset, offset=offset, threads=threads, chunk_size=8 * MiB)
        got = bytearray()
        for n in cuts:
            part = bytearray(n)
            assert gen.fill_chunk(memoryview(part)) == n
            got += part
        assert bytes(got) == whole[offset:], (offset, cuts)


def test_dedup_and_compress_ratios_reach_dgen(workdir, pool):
    import zlib
    b = backend(workdir)
    plain, squeezed = ContentSpec(7), ContentSpec(7, compress_ratio=4)
    save_file(b, "ckpt/plain.pt", 4 * MiB, plain, pool)
    save_file(b, "ckpt/squeezed.pt", 4 * MiB, squeezed, pool)
    ratio = lambda p: len(p) / len(zlib.compress(p, 1))  # noqa: E731
    assert ratio((workdir / "ckpt/squeezed.pt").read_bytes()) > 2 * ratio((workdir / "ckpt/plain.pt").read_bytes())
    load_file(b, "ckpt/squeezed.pt", 4 * MiB, pool, content=squeezed)


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)])


def test_enospc_names_file_and_removes_partial_file(small_tmpfs, pool):
    b = backend(small_tmpfs, "buffered")  # tmpfs has no O_DIRECT
    with pytest.raises(StorageError, match=r"cannot write .*ckpt/big.pt: No space left on device"):
        save_file(b, "ckpt/big.pt", 8 * MiB, ContentSpec(1), pool)
    assert not (small_tmpfs / "ckpt" / "big.pt").exists()


def test_o_direct_unsupported_is_an_error_not_a_fallback(small_tmpfs, pool):
    try:
        os.close(os.open(small_tmpfs / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
        pytest.skip("this kernel's tmpfs accepts O_DIRECT")
    except OSError:
        pass
    b = backend(small_tmpfs, "direct")
    with pytest.raises(StorageError, match="O_DIRECT is not supported .*write_mode=buffered"):
        save_file(b, "ckpt/f.pt", MiB, ContentSpec(1), pool)


def test_permission_denied_names_the_file(tmp_path):
    """In a child that drops root (root ignores permission bits) after its imports."""
    target = tmp_path / "locked"
    target.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    code = (
        "import os\n"
        "from dlio_ckpt_ext.engine import BufferPool, ContentSpec, save_file\n"
        "from dlio_ckpt_ext.storage.posix import PosixBackend, PosixOptions\n"
        "if os.geteuid() == 0:\n"
        "    os.setgid(65534); os.setuid(65534)\n"
        f"b = PosixBackend({str(target)!r}, PosixOptions())\n"
        "save_file(b, 'f.pt', 4096, ContentSpec(1), BufferPool(2, 1 << 20))\n")
    if os.geteuid() != 0:
        os.chmod(target, 0o555)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert f"cannot create {target}/f.pt: Permission denied" in res.stderr


@pytest.mark.parametrize("mode", ["direct", "buffered"])
def test_empty_file_saves_and_loads(workdir, pool, mode):
    b = backend(workdir, mode)
    spec = ContentSpec(derive_seed(6, "empty"))
    assert save_file(b, "ckpt/empty.pt", 0, spec, pool).chunks == []
    assert (workdir / "ckpt" / "empty.pt").stat().st_size == 0
    assert load_file(b, "ckpt/empty.pt", 0, pool, content=spec, parallelism=2).chunks == []


def test_io_time_of_overlapping_requests_is_their_wall_time_not_their_sum():
    from dlio_ckpt_ext.engine.profile import busy_seconds as _busy_seconds
    assert _busy_seconds([(0.0, 1.0), (0.5, 1.5), (0.2, 0.4), (3.0, 4.0)]) == pytest.approx(2.5)
    assert _busy_seconds([]) == 0.0


def test_parallel_verified_reads_report_wall_io_time(workdir, pool):
    backend = PosixBackend(str(workdir), PosixOptions(read_mode="buffered", write_mode="buffered"))
    spec = ContentSpec(derive_seed(9, "par"))
    save_file(backend, "p.bin", 24 * MiB, spec, pool)
    stats = load_file(backend, "p.bin", 24 * MiB, pool, content=spec, parallelism=3)
    assert 0 < stats.io_s <= stats.elapsed  # 3 readers overlap: their summed time could exceed the wall
    assert sum(c[3] for c in stats.chunks) >= stats.io_s


def test_buffers_are_private_and_in_huge_pages_where_the_kernel_allows():
    if thp_setting() not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {thp_setting()!r} here")
    system_before, ours_before = anon_huge_pages(), huge_page_bytes()
    pool = BufferPool(4, 8 * MiB)
    try:
        assert {mapping_permissions(b) for b in pool.buffers} == {"rw-p"}  # private, not shmem
        slack = pool.depth * 2 * MiB  # an unaligned buffer loses at most its head and tail
        assert anon_huge_pages() - system_before >= pool.nbytes - slack
        assert huge_page_bytes() - ours_before >= pool.nbytes - slack
    finally:
        pool.close()
    assert huge_page_bytes() == ours_before  # closed buffers are no longer counted


def test_a_file_window_closes_oldest_first_and_on_failure_removes_every_open_file(tmp_path, pool):
    from dlio_ckpt_ext.engine import FileWindow, send_file
    b = backend(tmp_path)
    window = FileWindow(at_once=2)
    assert send_file(b, "a.pt", 3 * MiB, ContentSpec(1), pool, window=window) == []  # sent, still open
    closed = send_file(b, "b.pt", 2 * MiB, ContentSpec(2), pool, window=window)
    assert [s.name for s in closed] == ["a.pt"]
    assert (tmp_path / "a.pt").read_bytes() == expected_bytes(ContentSpec(1), 3 * MiB)
    with pytest.raises(StorageError, match="no_such_dir/c.pt"):
        send_file(b, "no_such_dir/c.pt", MiB, ContentSpec(3), pool, window=window)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["a.pt"]  # b, sent but open, removed too


class BarrierAbortWriter(Writer):
    """Aborts that finish only if both run at the same time."""

    def __init__(self, barrier):
        self.barrier, self.aborted = barrier, False

    def write(self, data):
        pass

    def close(self):
        pass

    def abort(self):
        self.barrier.wait(timeout=10)
        self.aborted = True


def test_open_files_are_aborted_side_by_side():
    # each S3 abort waits for its parts in flight, and mpirun's SIGKILL follows
    # its SIGTERM by ~0.25 s: one after the other they would not fit
    import threading
    from dlio_ckpt_ext.engine.stream import abort_together
    barrier = threading.Barrier(2)
    writers = [BarrierAbortWriter(barrier), BarrierAbortWriter(barrier)]
    abort_together(writers)
    assert [w.aborted for w in writers] == [True, True]


def test_aborting_a_file_twice_leaves_a_file_opened_since_alone(tmp_path):
    b = backend(tmp_path)
    writer = b.open_writer("ckpt/f.pt", MiB)
    writer.abort()
    with open(tmp_path / "other", "wb") as other:  # likely given the number just freed
        writer.abort()  # what a failed close followed by the file window's abort does
        other.write(b"still open")
    assert (tmp_path / "other").read_bytes() == b"still open"
    assert not (tmp_path / "ckpt" / "f.pt").exists()


def test_chunk_spans_come_from_the_thread_that_did_each_stage(tmp_path, pool):
    """A tracer stamps the calling thread: the engine must call it from there."""
    import threading
    b, spec, size = backend(tmp_path), ContentSpec(seed=derive_seed("spans")), 5 * MiB + 7
    seen = []

    # The thread objects themselves, not get_ident(): a producer that ends
    # before the next one starts hands its ident on (seen on a loaded CI machine).
    def sink(stage, path, index, offset, nbytes, start, end):
        seen.append((stage, path, index, offset, nbytes, threading.current_thread(), end - start))
    me = threading.current_thread()
    send_file(b, "ckpt/g.pt", size, spec, pool, spans=sink)
    fills = [s for s in seen if s[0] == "fill"]
    writes = [s for s in seen if s[0] == "write"]
    layout = [(i, i * MiB, min(MiB, size - i * MiB)) for i in range(6)]
    # a save's first chunk in a ramp (256 KiB, then twice the last to the chunk's edge), then chunks
    KiB = 1 << 10
    saved = [(0, 0, 256 * KiB), (0, 256 * KiB, 512 * KiB), (0, 768 * KiB, 256 * KiB)] + layout[1:]
    assert [(s[2], s[3], s[4]) for s in fills] == saved == [(s[2], s[3], s[4]) for s in writes]
    assert {s[5] for s in writes} == {me} and me not in {s[5] for s in fills}
    assert all(s[1] == "ckpt/g.pt" and s[6] >= 0 for s in seen)
    seen.clear()
    load_file(b, "ckpt/g.pt", size, pool, content=spec, parallelism=3, spans=sink)
    reads = sorted((s[3], s[4]) for s in seen if s[0] == "read")
    assert reads == [(o, n) for _, o, n in layout] and sum(n for _, n in reads) == size
    assert len({s[5] for s in seen if s[0] == "read"}) == 3 and me not in {s[5] for s in seen if s[0] == "read"}
    assert {s[5] for s in seen if s[0] == "verify"} == {me}


def test_a_ranged_read_ends_requests_at_its_cuts_as_well_as_the_grid(tmp_path, pool):
    """A loader's own request edges (runai's workers) inside a range: each cut ends a
    request there; the bytes are still verified."""
    b, spec, size = backend(tmp_path), ContentSpec(seed=derive_seed("cuts")), 5 * MiB + 7
    send_file(b, "ckpt/c.pt", size, spec, pool)
    seen = []
    start, end = MiB // 2, 4 * MiB + 3
    load_file(b, "ckpt/c.pt", size, pool, content=spec, parallelism=2, offset=start, length=end - start,
              cuts=(MiB + 4096, 2 * MiB, 3 * MiB + 12345, 9 * MiB), spans=lambda *s: seen.append(s))
    reads = sorted((s[3], s[3] + s[4]) for s in seen if s[0] == "read")
    assert reads == [(start, MiB), (MiB, MiB + 4096), (MiB + 4096, 2 * MiB), (2 * MiB, 3 * MiB),
                     (3 * MiB, 3 * MiB + 12345), (3 * MiB + 12345, 4 * MiB), (4 * MiB, end)]
