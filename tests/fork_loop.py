"""MLCommons' fork's checkpoint-only loop, replayed call for call on this
environment's DLIO (run as `mpirun -np N python fork_loop.py workload=...`),
so the calls it makes into our mechanism are tested where the fork is not
installed. What it replays is DLIOBenchmark of the fork's dlio_benchmark/main.py
(f16fe43; the same at f6796ed): initialize resolves the mechanism through DLIO's factory and reads its
checkpoint_size into its stats; _checkpoint_write sleeps, barriers, calls
save_checkpoint(epoch=1, step) and barriers again only with rank_sync;
_checkpoint counts the checkpoints with storage.walk_node(checkpoint_folder);
_checkpoint_read does the same with load_checkpoint; finalize calls finalize.
Rank 0 writes what it saw to fork_loop.json in the output folder."""
import json
import os
import time

from dlio_benchmark.checkpointing.checkpointing_factory import CheckpointingFactory
from dlio_benchmark.storage.storage_factory import StorageFactory
from dlio_benchmark.utils.config import ConfigArguments, LoadConfig
from dlio_benchmark.utils.utility import DLIOMPI


class ForkLoopBenchmark:
    def __init__(self, cfg) -> None:
        self.comm = DLIOMPI.get_instance().comm()
        self.args = ConfigArguments.get_instance()
        LoadConfig(self.args, cfg)
        c = cfg["checkpoint"]
        # what the fork's LoadConfig reads of the checkpoint section, beyond 2.0.0's
        self.args.checkpoint_rank_sync = bool(c.get("rank_sync", False))
        self.writes, self.reads = int(c["num_checkpoints_write"]), int(c["num_checkpoints_read"])
        self.pause = float(c.get("time_between_checkpoints", -1))
        self.args.my_rank, self.args.comm_size = self.comm.rank, self.comm.size
        self.storage = StorageFactory().get_storage(self.args.storage_type, self.args.storage_root,
                                                    self.args.framework)
        os.makedirs(self.args.output_folder, exist_ok=True)
        self.seen: dict = {"saves": [], "loads": []}

    def initialize(self) -> None:
        self.comm.barrier()
        self.args.derive_configurations()
        self.mechanism = CheckpointingFactory().get_mechanism(self.args.checkpoint_mechanism)
        self.seen["mechanism"] = type(self.mechanism).__name__
        self.seen["checkpoint_size"] = self.mechanism.checkpoint_size  # the fork's stats.checkpoint_size
        self.comm.barrier()

    def _phase(self, count: int, call, log: list) -> None:
        for step in range(1, count + 1):
            time.sleep(max(self.pause, 0) if self.pause >= 0 else 1)  # the fork's framework.compute
            self.comm.barrier()
            start = time.time()
            files = call(1, step)
            if self.args.checkpoint_rank_sync:
                self.comm.barrier()
            log.append({"step": step, "seconds": time.time() - start, "files": len(files or [])})

    def run(self) -> None:
        self._phase(self.writes, self.mechanism.save_checkpoint, self.seen["saves"])
        self.seen["walk_node"] = sorted(self.storage.walk_node(self.args.checkpoint_folder))
        if len(self.seen["walk_node"]) < self.reads:
            raise RuntimeError(f"{self.reads} checkpoints to read, {len(self.seen['walk_node'])} found")
        self._phase(self.reads, self.mechanism.load_checkpoint, self.seen["loads"])

    def finalize(self) -> None:
        self.comm.barrier()
        self.mechanism.finalize()
        if self.comm.rank == 0:
            with open(os.path.join(self.args.output_folder, "fork_loop.json"), "w") as fh:
                json.dump(self.seen, fh)


if __name__ == "__main__":
    # a DLIO whose config knows num_checkpoints_write runs its own loop: our
    # callback then leaves DLIOBenchmark alone, and the mechanism leaves the
    # [METRIC] lines to DLIO, as under the fork
    ConfigArguments.num_checkpoints_write = 0
    import dlio_benchmark.main as dlio_main
    dlio_main.DLIOBenchmark = ForkLoopBenchmark
    dlio_main.main()
