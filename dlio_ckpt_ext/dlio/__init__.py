"""DLIO glue: the checkpoint mechanism, the checkpoint-only workflow for
DLIOs without one, the hydra callback that installs them, and the metrics."""
