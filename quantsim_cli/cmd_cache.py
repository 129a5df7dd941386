"""``quantsim cache list|clear|trim``: the on-disk cache of prepared models (`quantsim.prepare`)."""
from __future__ import annotations

import argparse
import datetime
import time

from quantsim import InvalidArgumentError
from quantsim.prepare import cache_info, cache_limit, cache_root, clear_cache, trim_cache
from quantsim_cli.report import text_table

__all__ = ["run_cache", "human_bytes", "human_age", "human_span"]


def human_bytes(size: int) -> str:
    """``1.5 MB`` style sizes (powers of 1024)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def human_span(seconds: float) -> str:
    """``3 min`` / ``30 h`` / ``4 d`` style durations (hours below two days, minutes below two hours)."""
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= (2 * span if span > 60 else span):
            return f"{seconds / span:.0f} {unit}"
    return f"{seconds:.0f} s"


def human_age(seconds: float) -> str:
    """``3 min ago`` style ages."""
    return "just now" if seconds < 60 else f"{human_span(seconds)} ago"


def run_cache(args: argparse.Namespace) -> int:
    """The ``cache`` subcommand; returns the exit code."""
    root = cache_root(args.cache_dir)
    if args.older_than is not None and args.action != "clear":
        raise InvalidArgumentError(f"--older-than applies to 'cache clear', not 'cache {args.action}'")
    if args.max_size is not None and args.action != "trim":
        raise InvalidArgumentError(f"--max-size applies to 'cache trim', not 'cache {args.action}'")
    if args.action == "clear":
        before = {e.key for e in cache_info(args.cache_dir) if e.in_use}
        removed = clear_cache(args.cache_dir, older_than=args.older_than)
        if not args.quiet:
            which = "" if args.older_than is None else f" unused for {human_span(args.older_than)} or more"
            busy = f"; {len(before)} in use kept" if before else ""
            print(f"removed {removed} prepared model(s){which} from {root}{busy}")
        return 0
    if args.action == "trim":
        limit = cache_limit(args.max_size)
        evicted = trim_cache(args.max_size, args.cache_dir)
        if not args.quiet:
            left = sum(e.size_bytes for e in cache_info(args.cache_dir))
            target = "unlimited" if limit is None else human_bytes(limit)
            print(f"evicted {len(evicted)} prepared model(s) from {root}; {human_bytes(left)} left (limit {target})")
        return 0
    entries = cache_info(args.cache_dir)
    if args.quiet:
        return 0
    total = sum(e.size_bytes for e in entries)
    limit = cache_limit()
    print(f"{root}: {len(entries)} prepared model(s), {human_bytes(total)} "
          f"(limit {'unlimited' if limit is None else human_bytes(limit)})")
    if entries:
        now = time.time()
        rows = [(e.key[:16], human_bytes(e.size_bytes), human_age(now - e.last_used),
                 datetime.datetime.fromtimestamp(e.mtime).strftime("%Y-%m-%d %H:%M"), "yes" if e.in_use else "")
                for e in reversed(entries)]  # most recently used first
        print(text_table(("key", "size", "last used", "written", "in use"), rows))
    return 0
