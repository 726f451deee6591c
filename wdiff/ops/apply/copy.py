"""Copy mode: build the target in a hidden temp directory beside OUT, check
every tensor and file against the target digests and the base against the
base fingerprint, fsync, and only then rename the directory into place. A
crash or refusal leaves OUT as it was."""

from __future__ import annotations

import os

from ...errors import BaseMismatchError, UsageError
from ...format.bundle import reading
from ...fsutil import (
    beside_lock_path, check_output, clear_dead_temps, fsync_dir, io_error, locked_beside, remove_tree, temp_name,
)
from ...progress import SILENT, Reporter
from ...store.checkpoint import is_file_arg
from ...store.ignore import DEFAULT_RULES, Rules
from .checks import check_base_listing, judge_base_mismatch, verify_bundle
from .engine import build_checked, remember_output
from .result import ApplyResult


def apply_copy(bundle, base, out, *, threads: int, reporter: Reporter = SILENT, rules: Rules = DEFAULT_RULES) -> ApplyResult:
    """Rebuild the target of ``bundle`` from ``base`` into the new directory ``out``."""
    out = os.fspath(out)
    check_output(out, [("the base checkpoint", base), ("the bundle", getattr(bundle, "path", bundle))])
    single = is_file_arg(base)  # a file in, a file out
    _check_out(out, base, single=single)
    with reading(bundle) as reader:
        if single and len(reader.index.files) != 1:
            raise UsageError(
                f"{base} is a single file, but the bundle's target has {len(reader.index.files)} files",
                hint="apply it to the checkpoint directory it was made from",
            )
        A = check_base_listing(reader.index, base, rules=rules)
        try:
            headers = verify_bundle(reader, A, reporter=reporter)
        except BaseMismatchError as e:  # a base header the bundle expects: another base, or a false claim
            raise judge_base_mismatch(e, reader.index, A, threads=threads) from None
        final = os.path.abspath(out).rstrip("/")
        # OUT's writers' lock: under it no live apply owns a temp of OUT, so
        # the partial copies killed ones left can go before this one starts
        with locked_beside(beside_lock_path(final), what=out):
            clear_dead_temps(final)
            _check_out(out, base, single=single)  # again, under the lock
            produced, written = _build(reader, A, headers, out, final, single, threads=threads, reporter=reporter)
    if not single:
        remember_output(out, reader.index, headers, produced)  # never fails: OUT is in place
    reporter.done()
    return ApplyResult(
        output=out,
        bundle_id=reader.id,
        base_fingerprint=reader.index.base_fingerprint,
        target_fingerprint=reader.index.target_fingerprint,
        files=len(reader.index.files),
        bytes_written=written,
    )


def _build(reader, A, headers, out: str, final: str, single: bool, *, threads: int, reporter: Reporter):
    """Build the target in a temp directory beside OUT, fsync it, rename it
    (or, for a single file, the file) into place: (produced, bytes written)."""
    tmp = temp_name(final, "tmp")
    try:
        os.mkdir(tmp)
    except OSError as e:
        raise io_error(tmp, e) from None
    try:
        outputs = {i: os.path.join(tmp, f.path) for i, f in enumerate(reader.index.files)}
        written, produced = build_checked(reader, A, headers, outputs, threads=threads, reporter=reporter)
        fsync_tree(tmp)
        if single:
            os.rename(outputs[0], out)  # the one file, verified; then its empty folder goes
            remove_tree(tmp)
        else:
            if os.path.isdir(out):
                os.rmdir(out)  # empty, checked above; fails loudly if that changed
            os.rename(tmp, out)
        fsync_dir(os.path.dirname(final))
    except OSError as e:
        remove_tree(tmp)
        raise io_error(out, e) from None
    except BaseException:
        remove_tree(tmp)
        raise
    return produced, written


def _check_out(out: str, base, *, single: bool = False) -> None:
    if single and os.path.lexists(out):
        raise UsageError(f"{out}: already exists", hint="the result of a single file is a new file: choose a new path")
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out) or os.listdir(out):
            raise UsageError(f"{out}: already exists and is not an empty directory", hint="choose a new output path")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise UsageError(f"{parent}: no such directory")
    if base is not None:
        b = os.path.abspath(os.fspath(base))
        o = os.path.abspath(out)
        if o == b or o.startswith(b + os.sep):
            raise UsageError("the output directory must not be inside the base checkpoint; use --in-place")


def fsync_tree(root: str) -> None:
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        fsync_dir(dirpath)
