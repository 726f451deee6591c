"""What a refused base is. The engine refuses a base at the first evidence
that it is not the bundle's (a file missing, a header, one tensor's
bytes), which names one file or tensor and no way out. Once it has refused,
this names what the directory is instead, by its fingerprint, beside the
bundle's base and target, and the next step: the bundle made from what the
directory holds, or the directory brought to the bundle's base first. A
directory already at the bundle's target is said to be so, whether the
apply was to write a copy (-o) or to update it in place."""

from __future__ import annotations

import os

from ...errors import BaseMismatchError, WdiffError
from ...format.bundle import BundleReader
from ...paths import printable
from ...store import manifest
from ...store.checkpoint import scan
from ...store.hashing import fingerprint, hexd
from ...store.ignore import Rules

EMPTY = fingerprint([])


def explain(e: BaseMismatchError, bundle, base, out, *, rules: Rules, threads: int) -> WdiffError:
    """The error to raise for ``e``, a refusal of ``base`` (a checkpoint
    directory or file) as the base of ``bundle`` (a path or an open
    reader), building ``out`` (None: in place). Hashes the base (the
    manifest cache may answer: this only chooses the words), on this
    refusal path only; ``e`` itself when the base cannot be read or is the
    bundle's base after all (then the engine's own judgement stands)."""
    if base is None:
        return e
    try:
        if isinstance(bundle, BundleReader):
            index, name = bundle.index, bundle.path
        else:
            with BundleReader(bundle) as r:
                index, name = r.index, os.fspath(bundle)
        ckpt = scan(base, rules=rules, keep=frozenset(f.path for f in index.base_files))
        have = manifest.compute(ckpt, threads=threads, use_cache=True).fingerprint if ckpt.files else EMPTY
    except (WdiffError, OSError):
        return e
    want, target = index.base_fingerprint, index.target_fingerprint
    b, n = printable(os.fspath(base)), printable(os.fspath(name))
    if have == target:
        if out is None:
            return e  # in place, a directory at the target is done: never refused (inplace.py)
        return BaseMismatchError(
            f"{b} is already at the bundle's target {hexd(target)[:16]}; nothing to do, "
            f"so {printable(os.fspath(out))} was not written",
            hint=f"{b} is the result: use it as it is, or copy it; `wdiff apply {n} {b} --in-place` "
                 "says the same and exits 0",
        )
    if have == want or want is None:
        return e
    first = "" if "fingerprint" in e.message else f" (first difference: {e.message})"
    return BaseMismatchError(
        f"{b} is not the bundle's base: it is {hexd(have)[:16]}, and {n} turns {hexd(want)[:16]} "
        f"into {hexd(target)[:16]}{first}",
        hint=f"apply the bundle made from {hexd(have)[:16]} instead (`wdiff info BUNDLE` shows a bundle's base), "
             f"or bring {b} to {hexd(want)[:16]} first: wdiff pull REMOTE {b} --to {hexd(want)[:16]}",
    )
