"""MODEL LOAD: a serving stack's load of a publish, as a platform team reads it:
cold start, each replica's time (gathered into the global window:
results/windows.replica_times), bytes delivered and from storage against
the model's."""
from __future__ import annotations

from dlio_ckpt_ext.engine.profile import GiB
from dlio_ckpt_ext.results.windows import mean_std


#: what each model-load pattern emulates, for the results
LOADERS = {"safetensors": "vLLM's default loader (safetensors, mmap)", "runai": "runai-model-streamer",
           "fastsafetensors": "fastsafetensors (file per rank, broadcast)"}


def model_load_lines(plan: dict, windows: list[dict]) -> list[str]:
    """RESULTS' lines a platform team reads of a model load: cold start, the
    replicas' times, bytes delivered and from storage against the model's."""
    replicas = len(windows[0].get("replica_s", {})) or 1
    cold, cold_std = mean_std([w["duration_s"] for w in windows])
    slow = max(windows, key=lambda w: w.get("slowest_replica_s", 0))
    delivered = plan["bytes_read"]
    rate = mean_std([delivered / GiB / w["duration_s"] for w in windows if w["duration_s"] > 0])[0]
    measured = sorted({w["bytes"] for w in windows})
    return [f"MODEL LOAD: pattern={plan['pattern']} ({LOADERS.get(plan['pattern'], plan['pattern'])}), "
            f"{replicas} replica(s) of {plan['ranks'] // replicas} rank(s)",
            f"  {'cold start':28s} {cold:.4f} s (\u00b1{cold_std:.4f}): first rank's start to the last replica "
            f"holding its weights; slowest replica {slow.get('slowest_replica', 0)} "
            f"({slow.get('slowest_replica_s', slow['duration_s']):.4f} s, load {slow['step']})",
            f"  {'delivered':28s} {rate:.4f} GiB/s ({delivered} bytes a load into the ranks)",
            f"  {'from storage':28s} {plan['storage_bytes']} bytes a load, {plan['storage_amplification']:.3f}x the "
            f"model's {plan['checkpoint_bytes']}" + ("" if measured == [plan["storage_bytes"]]
                                                     else f"; MEASURED {', '.join(map(str, measured))}")
            + (f"; {plan['broadcast_bytes']} by broadcast" if plan["broadcast_bytes"] else ""),
            f"  {'readers per file':28s} from storage max {plan['storage_readers_per_file_max']}, mean "
            f"{plan['storage_readers_per_file_mean']:.2f} ({plan['files_read']} of {plan['checkpoint_files']} "
            f"files read; {plan['storage_requests']} requests of up to {plan['read_size'] / 2**20:g} MiB)"]
