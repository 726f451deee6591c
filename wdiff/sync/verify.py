"""``verify`` with a remote: check a checkpoint directory against a version
of a remote, or against a bundle (wdiff.ops.verify, which does the check)."""

from __future__ import annotations

from ..errors import NotFoundError, UsageError
from ..format.bundle import BundleReader
from ..fsutil import scratch_dir
from ..ops.verify import VerifyResult, check, verify_bundle, verify_recorded
from ..paths import PathLike
from ..progress import SILENT, Reporter
from ..remotes import open_remote
from ..store.hashing import hexd
from .fetch import download, read_chain


def verify(directory: PathLike, *, bundle: PathLike | None = None, remote: str | None = None,
           version: str | None = None, threads: int | None = None, reporter: Reporter = SILENT) -> VerifyResult:
    """Read every byte of ``directory`` (the manifest cache is not trusted
    here) and check it against the target of ``bundle``, or against
    ``version`` (default: the head) of ``remote``; given neither, against
    the directory's own record of the version a pull or an in-place apply
    brought it to (files it does not list are not read). Returns a
    :class:`VerifyResult` naming what differs, is missing, or should not be
    there."""
    if bundle is not None and remote is not None:
        raise UsageError("verify checks against a bundle or a remote, not both")
    if version is not None and remote is None:
        raise UsageError("--to names a version of the remote: it goes with --remote")
    if bundle is None and remote is None:
        return verify_recorded(directory, threads=threads, reporter=reporter)
    if bundle is not None:
        return verify_bundle(directory, bundle, threads=threads, reporter=reporter)
    store = open_remote(remote)
    chain = read_chain(store)
    expected = chain.resolve(version)
    return check(directory, expected, _files_of(store, chain, expected, reporter), store.url,
                 threads=threads, reporter=reporter)


def _files_of(store, chain, version: bytes, reporter: Reporter) -> dict:
    """The target file list of a version: from the index of a bundle that
    leads to it (the smallest one), fetched and checked like a pull does."""
    entries = sorted((e for e in chain.entries if e.version == version), key=lambda e: e.size)
    if not entries:
        raise NotFoundError(f"{store.url}: no bundle leads to version {hexd(version)[:12]}")
    with scratch_dir("verify") as work:
        path, _ = download(store, entries[0], work, reporter)
        with BundleReader(path) as r:
            return {f.path: f for f in r.index.files}
