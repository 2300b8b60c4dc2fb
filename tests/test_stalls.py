"""A rank's stall watch: said while it lasts, again every limit, kept when over."""
import time

from dlio_ckpt_ext.dlio.stalls import StallWatch


def test_a_stall_is_said_while_it_lasts_and_kept_with_its_checkpoint_and_file():
    said = []
    watch = StallWatch(3, 0.2, lambda: "file s3://b/k, endpoint http://e", said.append)
    watch.begin("save", 7)
    watch.progress(1)
    t0 = time.monotonic()
    while len(said) < 2 and time.monotonic() - t0 < 30:  # two limits without a completed request
        time.sleep(0.01)
    watch.progress(1)
    watch.end()
    # said again each limit while it lasted (a loaded machine may let a third in before progress)
    assert len(said) >= 2 and all(line.startswith("[WARNING] rank 3: no save request has completed for ")
                                  and line.endswith("s (checkpoint 7, file s3://b/k, endpoint http://e); still "
                                                    "waiting") for line in said)
    [stall] = watch.stalls
    assert (stall["phase"], stall["step"], stall["file"]) == ("save", 7, "file s3://b/k, endpoint http://e")
    assert stall["duration_s"] >= 0.4


def test_steady_progress_and_the_time_between_checkpoints_are_no_stall():
    said = []
    watch = StallWatch(0, 0.2, lambda: "f", said.append)
    watch.begin("load", 1)
    for _ in range(6):
        time.sleep(0.05)
        watch.progress(1)
    watch.end()
    time.sleep(0.5)  # idle between checkpoints: nothing is waited for
    assert said == [] and watch.stalls == []


def test_waiting_at_a_barrier_is_no_stall_and_the_checkpoint_goes_on_after():
    said = []
    watch = StallWatch(0, 0.2, lambda: "f", said.append)
    watch.begin("save", 2)
    watch.end()        # DCP's commit barrier: the other ranks are slower
    time.sleep(0.5)
    watch.resume()
    time.sleep(0.3)    # the commit's own write then stalls
    watch.end()
    assert len(said) == 1 and "checkpoint 2" in said[0] and watch.stalls[0]["step"] == 2
