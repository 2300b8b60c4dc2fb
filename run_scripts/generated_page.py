"""The command line of a generated docs page: rewrite it, or with --check say
whether it is stale (exit 1), so a test can fail when a page and its source differ."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable


def page_main(doc: str, page: Path, render: Callable[[], str], argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {page.name} is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not page.exists() or page.read_text() != text:
            print(f"{page} is stale: run python {Path(sys.argv[0]).as_posix()}", file=sys.stderr)
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {page}")
    return 0
