"""Runs one real library's save into an S3 server through a recording front
(request_front.py) and writes its request manifest: what the server saw of
each request below the save's prefix (counts by kind, part and PUT sizes, GET
ranges, conditional writes, copies, the most in flight, every object's
requests with names normalised as record.py normalises them).

    python fidelity/record_requests.py --manifest fidelity/manifests/requests/dcp-s3torchconnector-w2.json \\
        --out /tmp/fid/x --prefix dcp --library s3torchconnector -- python fidelity/save_dcp.py --out /tmp/fid/x --world 2 --s3 s3://ckpt/dcp

The server is the one AWS_ENDPOINT_URL names (fidelity/run.sh starts a
SeaweedFS for the saves with `python -m dlio_ckpt_ext.tools.local_s3`); the
save runs with AWS_ENDPOINT_URL pointed at the front instead. The save script
writes OUT/info.json (the library, its version, the shape, the world size)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from record import normalise
from request_front import front_for, summary

BUCKET = "ckpt"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", required=True, help="the save's key prefix in bucket ckpt")
    ap.add_argument("--library", required=True, help="our storage_library naming the client the save goes through")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    front = front_for(os.environ["AWS_ENDPOINT_URL"])
    os.makedirs(args.out, exist_ok=True)
    res = subprocess.run(command, env={**os.environ, "AWS_ENDPOINT_URL": front.endpoint})
    front.stop()
    if res.returncode:
        print(f"the save failed (exit {res.returncode})", file=sys.stderr)
        return res.returncode
    with open(os.path.join(args.out, "info.json")) as f:
        info = json.load(f)
    requests = summary(front.records, f"/{BUCKET}/{args.prefix}/", normalise)
    manifest = {**info, "storage": "s3 (SeaweedFS, path style, through a recording front)",
                "storage_library": args.library, "requests": requests}
    os.makedirs(os.path.dirname(os.path.abspath(args.manifest)), exist_ok=True)
    with open(args.manifest, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"{args.manifest}: {requests['by_kind']}, most in flight {requests['max_in_flight']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
