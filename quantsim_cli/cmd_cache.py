"""``quantsim cache list|clear``: the on-disk cache of prepared models (`quantsim.prepare`)."""
from __future__ import annotations

import argparse
import datetime

from quantsim.prepare import cache_info, cache_root, clear_cache
from quantsim_cli.report import text_table

__all__ = ["run_cache", "human_bytes"]


def human_bytes(size: int) -> str:
    """``1.5 MB`` style sizes (powers of 1024)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def run_cache(args: argparse.Namespace) -> int:
    """The ``cache`` subcommand; returns the exit code."""
    root = cache_root(args.cache_dir)
    if args.action == "clear":
        removed = clear_cache(args.cache_dir)
        if not args.quiet:
            print(f"removed {removed} prepared model(s) from {root}")
        return 0
    entries = cache_info(args.cache_dir)
    if args.quiet:
        return 0
    total = sum(e.size_bytes for e in entries)
    print(f"{root}: {len(entries)} prepared model(s), {human_bytes(total)}")
    if entries:
        rows = [(e.key[:16], human_bytes(e.size_bytes),
                 datetime.datetime.fromtimestamp(e.mtime).strftime("%Y-%m-%d %H:%M")) for e in entries]
        print(text_table(("key", "size", "written"), rows))
    return 0
