"""One rank's checkpoints: the shard plan driven through the streaming engine onto
a storage backend (checkpointer), async mode's background persist (background),
and the memory a rank's settings commit it to, checked before anything runs (memory)."""
