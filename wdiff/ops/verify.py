"""``verify``: check a checkpoint directory against what wdiff recorded for
it: the target of a bundle, a version on a remote, or (given neither) the
record the last pull or in-place apply left in it (``DIR/.wdiff/state.json``:
the version, and the size and digest of each of its files; files it does
not list are not the checkpoint's, and are not read).

Every file is hashed (the manifest cache is bypassed: a verification must
read the bytes) and compared file by file and tensor by tensor, so a failure
names what is wrong, not only that the fingerprint differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UsageError
from ..format.bundle import BundleReader
from ..fsutil import scratch_dir
from ..parallel import default_threads
from ..progress import SILENT, Reporter
from ..paths import STATE_DIR
from ..statedir import StateDir
from ..store import manifest, record
from ..store.checkpoint import KIND_TENSORS, scan
from ..store.ignore import DEFAULT_RULES
from ..store.hashing import hexd, tree

SCHEMA = "wdiff.verify/1"


@dataclass(frozen=True)
class Problem:
    path: str
    what: str  # "missing", "unexpected", "differs", "tensor differs"
    tensor: str | None = None

    def to_json(self) -> dict:
        return {"path": self.path, "problem": self.what, "tensor": self.tensor}


@dataclass(frozen=True)
class VerifyResult:
    directory: str
    expected: bytes
    actual: bytes
    source: str  # the bundle or remote the expectation came from
    problems: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        return self.expected == self.actual and not self.problems

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "directory": self.directory,
            "source": self.source,
            "expected": hexd(self.expected),
            "actual": hexd(self.actual),
            "ok": self.ok,
            "problems": [p.to_json() for p in self.problems],
        }


def verify(directory, *, bundle=None, remote=None, version: str | None = None,
           threads: int | None = None, reporter: Reporter = SILENT) -> VerifyResult:
    """Check ``directory`` against the target of ``bundle``, or against
    ``version`` (default: the head) of ``remote``; given neither, against
    the directory's own record of the version it was brought to."""
    if bundle is not None and remote is not None:
        raise UsageError("verify checks against a bundle or a remote, not both")
    if version is not None and remote is None:
        raise UsageError("--to names a version of the remote: it goes with --remote")
    threads = threads or default_threads()
    directory = os.fspath(directory)
    rules = DEFAULT_RULES
    if bundle is None and remote is None:
        recorded = _record(directory)
        expected_files = {r.path: r for r in recorded.files}
        expected = recorded.version
        rules = DEFAULT_RULES.tracking(recorded.paths)  # untracked files are not the checkpoint's
        source = os.path.join(directory, STATE_DIR, record.NAME)
    elif bundle is not None:
        with BundleReader(bundle) as r:
            expected_files = {f.path: f for f in r.index.files}
            expected = r.index.target_fingerprint
        source = os.fspath(bundle)
    else:
        from ..format.chain import Chain
        from ..remotes import open_remote
        from .fetch import read_chain

        store = open_remote(remote)
        chain: Chain = read_chain(store)
        expected = chain.resolve(version)
        expected_files = _files_of(store, chain, expected, reporter)
        source = store.url
    ckpt = scan(directory, rules=rules, keep=frozenset(expected_files)) if rules is not DEFAULT_RULES \
        else scan(directory)
    reporter.phase("verify", ckpt.total_bytes)
    m = manifest.compute(ckpt, threads=threads, reporter=reporter, use_cache=False)  # read every byte
    problems = []
    have = {d.path: (f, d) for f, d in zip(ckpt.files, m.files)}
    for path, want in expected_files.items():
        if path not in have:
            problems.append(Problem(path, "missing"))
            continue
        f, d = have[path]
        if d.digest == want.digest and d.kind == want.kind and d.size == want.size:
            continue
        if want.kind == KIND_TENSORS and d.kind == KIND_TENSORS and getattr(want, "tensor_digests", None):
            if d.header_digest != want.header_digest:
                problems.append(Problem(path, "header differs"))
            bad = [t.name for t, got, exp in zip(f.header.tensors, d.blocks, want.tensor_digests) if tree(got) != exp]
            problems.extend(Problem(path, "tensor differs", name) for name in bad)
            if not bad and d.header_digest == want.header_digest:
                problems.append(Problem(path, "differs"))
        else:
            problems.append(Problem(path, "differs"))
    problems.extend(Problem(p, "unexpected") for p in have if p not in expected_files)
    reporter.done()
    return VerifyResult(directory, expected, m.fingerprint, source, tuple(problems))


def _record(directory: str) -> record.Record:
    """DIR's record, read strictly (a planted one is refused, never obeyed);
    a usage error naming the other sources when there is none."""
    state = StateDir.open(directory, create=False) if os.path.isdir(directory) else None
    recorded = None
    if state is not None:
        with state:
            recorded = record.read(state)
    if recorded is None:
        if not os.path.isdir(directory):
            scan(directory)  # the error of a path that is not a checkpoint directory
        raise UsageError(
            f"{directory}: has no record of a pull or an in-place apply (.wdiff/state.json) to check it against",
            hint="give what it should be: --bundle BUNDLE (its target) or --remote REMOTE [--to VERSION]",
        )
    return recorded


def _files_of(store, chain, version: bytes, reporter: Reporter) -> dict:
    """The target file list of a version: from the index of a bundle that
    leads to it (the smallest one), fetched and checked like a pull does."""
    from .fetch import download

    entries = sorted((e for e in chain.entries if e.version == version), key=lambda e: e.size)
    if not entries:
        from ..errors import NotFoundError

        raise NotFoundError(f"{store.url}: no bundle leads to version {hexd(version)[:12]}")
    with scratch_dir("verify") as work:
        path, _ = download(store, entries[0], work, reporter)
        with BundleReader(path) as r:
            return {f.path: f for f in r.index.files}
