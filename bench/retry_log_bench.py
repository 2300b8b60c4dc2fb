"""What counting s3dlio's retries from its debug log costs a rank (storage/s3dlio_log.py).

With the log on, the AWS SDK under s3dlio writes about 26 debug lines a request
(measured against SeaweedFS: 7,644 lines for 288 requests); the rank's reader
thread counts the retry lines and drops the rest. This feeds the reader that many
lines of a realistic length through the same pipe and prints the CPU a request's
lines cost (the writes into the pipe included; the SDK's own formatting is not),
and what that is per GiB at each request size.

  python bench/retry_log_bench.py [--requests 20000] [--lines 26]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--lines", type=int, default=26, help="log lines a request")
    args = ap.parse_args()
    from dlio_ckpt_ext.storage import s3dlio_log
    line = (b'2026-12-03T19:00:00.123456Z DEBUG S3.GetObject{rpc.service="S3" rpc.method="GetObject" '
            b'sdk_invocation_id=4821 rpc.system="aws-api"}:try_op: beginning attempt #1 ' + b"x" * 60 + b"\n")
    block = line * args.lines
    reader = s3dlio_log.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(args.requests):
        os.write(1, block)
    s3dlio_log.counts()
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    per_request = cpu / args.requests
    print(f"{reader.lines_seen} lines read and counted: {per_request * 1e6:.1f} us of CPU a request "
          f"({args.lines} lines of {len(line)} bytes)", file=sys.stderr)
    for mib in (2, 8, 16):
        print(f"  at {mib:2d} MiB a request: {per_request * 1024 / mib:.4f} CPU-s per GiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
