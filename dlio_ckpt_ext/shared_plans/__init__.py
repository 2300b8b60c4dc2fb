"""The arithmetic every layout shares: a model's shape and parallelism and a
rank's files (plan), a saved file's byte ranges and a loading job (load_plan),
the local tier's files and groups (tier_plan), and a Hugging Face publish's
shards (safetensors_plan). Pure functions of the config, no I/O: the layouts
(dlio_ckpt_ext/layouts/) build each framework's files from them."""
