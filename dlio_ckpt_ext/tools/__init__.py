"""Tools for trying the benchmark without real remote storage: a throw-away local
S3 server (local_s3) and an emulated remote link in front of one (remote_link)."""
