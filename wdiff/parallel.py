"""A bounded, ordered parallel map over a thread pool.

numpy, xxhash and zstd release the GIL in their hot loops, so threads scale
on the work wdiff does. Results come back in input order, which keeps every
output independent of the thread count; at most ``window`` items are in
flight, which bounds memory by the working set, never by the input size.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

ENV_THREADS = "WDIFF_THREADS"


def default_threads() -> int:
    env = os.environ.get(ENV_THREADS)
    if env:
        try:
            n = int(env)
        except ValueError:
            from .errors import UsageError

            raise UsageError(f"{ENV_THREADS}={env!r} is not a number") from None
        if n >= 1:
            return min(n, 256)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, threads: int, window: int | None = None) -> Iterator[R]:
    """Yield ``fn(item)`` for each item, in order, computing up to ``window``
    ahead on ``threads`` threads. With one thread it runs inline."""
    if threads <= 1:
        for item in items:
            yield fn(item)
        return
    window = window or 2 * threads
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wdiff") as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
