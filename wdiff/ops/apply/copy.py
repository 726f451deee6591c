"""Copy mode: build the target in a hidden temp directory beside OUT, check
every tensor and file against the target digests and the base against the
base fingerprint, fsync, and only then rename the directory into place. A
crash or refusal leaves OUT as it was."""

from __future__ import annotations

import os

from ...errors import UsageError
from ...format.bundle import BundleReader, reading
from ...fsutil import fsync_dir, io_error, remove_tree, temp_name
from ...progress import SILENT, Reporter
from ...store import cache
from ...store.checkpoint import scan
from .checks import check_base_listing, verify_bundle
from .engine import build
from .result import ApplyResult


def apply_copy(bundle, base, out, *, threads: int, reporter: Reporter = SILENT) -> ApplyResult:
    """Rebuild the target of ``bundle`` from ``base`` into the new directory ``out``."""
    out = os.fspath(out)
    _check_out(out, base)
    with reading(bundle) as reader:
        A = check_base_listing(reader.index, base)
        headers = verify_bundle(reader, A, reporter=reporter)
        tmp = temp_name(os.path.abspath(out).rstrip("/"), "tmp")
        try:
            os.mkdir(tmp)
        except OSError as e:
            raise io_error(tmp, e) from None
        try:
            outputs = {i: os.path.join(tmp, f.path) for i, f in enumerate(reader.index.files)}
            written, produced = build(reader, A, headers, outputs, threads=threads, reporter=reporter)
            fsync_tree(tmp)
            if os.path.isdir(out):
                os.rmdir(out)  # empty, checked above; fails loudly if that changed
            os.rename(tmp, out)
            fsync_dir(os.path.dirname(os.path.abspath(out)))
        except OSError as e:
            remove_tree(tmp)
            raise io_error(out, e) from None
        except BaseException:
            remove_tree(tmp)
            raise
    cache.remember(scan(out, reuse=A), produced)  # the next step's base is hashed already
    reporter.done()
    return ApplyResult(
        output=out,
        bundle_id=reader.id,
        base_fingerprint=reader.index.base_fingerprint,
        target_fingerprint=reader.index.target_fingerprint,
        files=len(reader.index.files),
        bytes_written=written,
    )


def _check_out(out: str, base) -> None:
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
