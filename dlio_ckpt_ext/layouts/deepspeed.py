"""DeepSpeed's layout, sized as upstream DLIO sizes it, so a run of ours writes
exactly the bytes an upstream DLIO run would (and MLPerf Storage's CLOSED
runs): `global_epoch{e}_step{s}/zero_pp_rank_{dp}_mp_rank_{mp:02d}_{model,optim}_states.pt`
(ZeRO-1/2: the model states once per model-parallel rank, by data-parallel
rank 0; with pipeline stages one file per layer). Restores follow DeepSpeed's
loader and its universal checkpoint (docs/restores.md).

checkpoint.deepspeed_files=deepspeed writes the files DeepSpeed itself writes
instead, as a real save of DeepSpeed 0.19.8 left them (fidelity/manifests,
docs/fidelity.md): `global_step{s}/`, ZeRO-3 model states without weights,
the `bf16_` prefix of a bf16 run's optimizer files, and at the save root
`latest` and the two recovery scripts. OPEN only: CLOSED writes DLIO's."""
from __future__ import annotations

from typing import Optional

from dlio_ckpt_ext.recovery import discovery, saved_shape
from dlio_ckpt_ext.recovery.saved_shape import SavedShape
from dlio_ckpt_ext.shared_plans import load_plan, plan, universal_plan
from dlio_ckpt_ext.layouts.base import Layout
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob, ReadRange
from dlio_ckpt_ext.shared_plans.plan import ModelShape, Parallelism, RankPlan, ShardFile


def layer_elements(m: ModelShape, layer: int, tp: int, shard: int) -> int:
    """Elements of one pipeline position (plan.layer_range's numbering) on one
    tensor-parallel rank, split `shard` ways: upstream DLIO's formula."""
    h, f = m.hidden_size, m.ffn_hidden_size
    if layer in (0, m.num_layers + 1):  # embedding, lm_head
        return h * m.vocab_size // tp // shard
    if layer == m.num_layers + 2:  # final norm
        return h // shard
    dkv = (h // m.num_attention_heads) * m.num_kv_heads
    return (h // shard + h * (h + 2 * dkv) // tp // shard + h * h // tp // shard
            + h // shard + 2 * h * f // tp // shard + h * f // tp // shard)


#: the recovery scripts DeepSpeed 0.19.8 copies to the save root at every save, and their sizes
RECOVERY_SCRIPTS = (("zero_to_fp32.py", 38580), ("zero_to_torch.py", 2490))
#: a ZeRO-3 rank's *_model_states.pt holds no weights (every parameter a (0,)-shaped
#: tensor): the module's structure and bookkeeping, about this many bytes a parameter
#: tensor (11,177 B for the 21 tensors of our 2-layer test model, DeepSpeed 0.19.8)
ZERO3_MODEL_STATES_PER_TENSOR = 532


class DeepSpeed(Layout):
    name = "deepspeed"
    framework = "DeepSpeed"
    reshards = "ds_to_universal's conversion, then DeepSpeed's universal checkpoint load"
    mlperf_closed = True
    names_epoch = True
    has_framework_files = True
    durability = "no fsync, no rename: its save returns once the bytes are in the page cache"

    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        return f"global_epoch{epoch}_step{step}"

    def variant(self, p: Parallelism) -> Layout:
        return FILES if p.framework_files else self

    def plan_rank(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        tp, pp = p.tensor, p.pipeline
        mp = tp * pp
        dp = p.data if p.mode == "subset" else world // mp
        pp_rank, tp_rank = (rank // tp) % pp, rank % tp
        dp_rank, mp_rank = rank // mp, rank % mp
        mbytes = plan.dtype_bytes("model.model_datatype", m.model_datatype)
        obytes = plan.dtype_bytes("model.optimizer_datatype", m.optimizer_datatype)
        shard = dp if p.zero_stage == 3 else 1
        prefix = f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}"

        files: list[ShardFile] = []
        # Without ZeRO only the first data-parallel replica checkpoints anything.
        if p.zero_stage == 0 and rank >= mp:
            return RankPlan(rank, dp_rank, mp_rank, pp_rank, tp_rank, ())
        start, end = plan.layer_range(pp_rank, pp, m.num_layers)
        layers = range(start, end + 1)
        if p.zero_stage in (1, 2):
            if dp_rank == 0:
                if pp > 1:
                    files += [ShardFile(f"layer_{i:02d}-model_{mp_rank:02d}-model_states.pt",
                                        layer_elements(m, i, tp, 1) * mbytes, "model") for i in layers]
                else:
                    size = sum(layer_elements(m, i, tp, 1) for i in layers) * mbytes
                    files.append(ShardFile(f"mp_rank_{mp_rank:02d}_model_states.pt", size, "model"))
        else:
            size = self.zero3_model_states(m, sum(layer_elements(m, i, tp, shard) for i in layers) * mbytes)
            files.append(ShardFile(f"{prefix}_model_states.pt", size, "model"))

        n = plan.num_parameters(m) // (dp * mp if p.zero_stage > 0 else mp)
        if n > 0:
            # Adam: parameters, momentum, variance, each with 5*h of bookkeeping.
            files.append(ShardFile(f"{self.optimizer_prefix(m)}{prefix}_optim_states.pt",
                                   (3 * n + 15 * m.hidden_size) * obytes, "optimizer"))
        return RankPlan(rank, dp_rank, mp_rank, pp_rank, tp_rank, tuple(files))

    def saved_shape(self, look: discovery.Look, name: str) -> Optional[SavedShape]:
        # DeepSpeed globs the tag's zero_pp_rank files and refuses a DP size not its own
        names = look.listed[name] if name in look.listed else look.list(name)
        return saved_shape.from_deepspeed_names(names)

    def zero3_model_states(self, m: ModelShape, weights: int) -> int:
        """A ZeRO-3 rank's model states file, given the bytes of its weight shard:
        upstream DLIO writes the shard there."""
        return weights

    def optimizer_prefix(self, m: ModelShape) -> str:
        return ""

    def framework_reads(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        rest = self._universal if self.converts(p, job) else self._optimizer
        return self._model_states(m, p, job, rank) + rest(m, p, job, rank)

    def _model_states(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        """The model-states files DeepSpeed's _load_checkpoint reads on `rank`.
        Without pipeline stages: the sorted glob of its family's model-states files
        (_get_all_ckpt_names) goes to SDLoaderFactory, whose check_ckpt_list loads
        the first, model-parallel rank 0's, whole before load() reads this rank's
        own: two files (the same one twice on model-parallel rank 0). ZeRO-0/1/2:
        the files data-parallel rank 0 wrote, so every replica reads them; ZeRO-3:
        its own data-parallel rank's (at another world size universal loading
        reads data-parallel rank 0's). With pipeline stages every replica loads
        every layer file of its stage (PipelineModule.load_state_dir)."""
        mp = p.tensor * p.pipeline
        mp_rank, dp_rank = rank % mp, rank // mp
        if p.pipeline > 1:
            return [load_plan.whole(f, mp_rank) for f in self.saved(m, p, job, mp_rank).files if f.kind == "model"]
        dp_writer = dp_rank * mp if p.zero_stage == 3 and not job.resharded else 0
        out = []
        for writer in (dp_writer, dp_writer + mp_rank):
            out += [load_plan.whole(f, writer) for f in self.saved(m, p, job, writer).files if f.kind == "model"]
        return out

    def _optimizer(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        """The optimizer partitions `rank` reads at the saved world size: its own
        (_get_all_zero_checkpoint_state_dicts loads only the rank's own unless
        elastic_checkpoint is set; ZeRO-0 keeps them with the first replica's
        model states)."""
        writers = [rank % (p.tensor * p.pipeline)] if p.zero_stage == 0 else [rank]
        return [load_plan.whole(f, w) for w in writers for f in self.saved(m, p, job, w).files
                if f.kind == "optimizer"]

    # -- at another world size: the universal checkpoint --------------------------
    def converts(self, p: Parallelism, job: LoadJob) -> bool:
        # _load_zero_checkpoint refuses any other data-parallel size ("not currently supported")
        return job.resharded and job.pattern == "framework" and p.zero_stage > 0 and p.mode != "subset"

    def load_dir(self, p: Parallelism, job: LoadJob, directory: str) -> str:
        return universal_plan.universal_dir(directory) if self.converts(p, job) else directory

    def read_files(self, m: ModelShape, p: Parallelism, job: LoadJob) -> dict[str, int]:
        if not self.converts(p, job):
            return super().read_files(m, p, job)
        # the universal checkpoint: the model states copied, zero/ one folder a parameter
        files = {f.name: f.size for s in range(job.saved_ranks) for f in self.saved(m, p, job, s).files
                 if f.kind == "model"}
        files[universal_plan.optimizer_state_file().name] = universal_plan.OPTIMIZER_STATE_BYTES
        for x in universal_plan.params(m, p.tensor):
            files.update((f.name, f.size) for f in universal_plan.merged_files(m, p, x))
        return files

    def _universal(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        """The universal load on `rank` (universal_checkpoint.load_hp_checkpoint_state):
        zero/optimizer_state.pt, then each parameter it holds a slice of, every
        file of its folder whole (the folder's listing is the loader's, made apart)."""
        # the conversion wrote them all as rank 0's content
        out = [load_plan.whole(universal_plan.optimizer_state_file(), 0)]
        for x in universal_plan.held(m, p, job.ranks, rank):
            out += [load_plan.whole(f, 0) for f in universal_plan.merged_files(m, p, x)]
        return out

class DeepSpeedFiles(DeepSpeed):
    """The files a DeepSpeed 0.19.8 save itself writes (checkpoint.deepspeed_files=deepspeed)."""
    framework = "DeepSpeed (its own files)"
    mlperf_closed = False
    names_epoch = False
    #: rank 0 writes `latest` once every rank's files are down (save_checkpoint's barrier)
    committed = True

    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        return f"global_step{step}"  # DeepSpeed's default tag

    def tracker(self, step: int) -> tuple[str, bytes]:
        return "latest", self.checkpoint_dir(step).encode()

    def find_latest(self, look: discovery.Look, expected: discovery.Expected) -> discovery.Latest:
        # load_checkpoint(tag=None) reads `latest` on every rank
        # then the tag's mp_rank_* model files globbed
        return discovery.by_tracker(self, look, "latest", self._tagged_step, expected, lambda look, tag: look.list(tag))

    def _tagged_step(self, text: bytes) -> Optional[int]:
        found = self.step_of(text.decode(errors="replace").strip())
        return found[0] if found else None

    def root_files(self, step: int) -> tuple[tuple[str, bytes], ...]:
        return (self.tracker(step),) + tuple((name, _stand_in(name, size)) for name, size in RECOVERY_SCRIPTS)

    def zero3_model_states(self, m: ModelShape, weights: int) -> int:
        return ZERO3_MODEL_STATES_PER_TENSOR * len(plan.dcp_tensors(m))

    def optimizer_prefix(self, m: ModelShape) -> str:
        return "bf16_" if m.model_datatype == "bf16" else ""


def _stand_in(name: str, size: int) -> bytes:
    """A file of the script's size that says what it stands for."""
    head = f"# {name}: DeepSpeed's recovery script, written at its size by dlio-ckpt-ext\n".encode()
    return head + b"#" * (size - len(head) - 1) + b"\n"


LAYOUT = DeepSpeed()
FILES = DeepSpeedFiles()
