"""``verify``: check a checkpoint directory against what wdiff recorded for
it: the target of a bundle, or (given none) the record the last pull or
in-place apply left in it (``DIR/.wdiff/state.json``: the version, and the
size and digest of each of its files; files it does not list are not the
checkpoint's, and are not read). A version on a remote: wdiff.sync.verify.

Every file is hashed (the manifest cache is bypassed: a verification must
read the bytes) and compared file by file and tensor by tensor, so a failure
names what is wrong, not only that the fingerprint differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UsageError
from ..format.bundle import BundleReader
from ..parallel import default_threads
from ..paths import STATE_DIR, PathLike
from ..progress import SILENT, Reporter
from ..statedir import StateDir
from ..store import manifest, version_record
from ..store.checkpoint import KIND_TENSORS, scan
from ..store.hashing import hexd, tree
from ..store.ignore import DEFAULT_RULES

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
    """What :func:`verify` found: ``ok``, or the problems, file by file."""

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


def verify_bundle(directory: PathLike, bundle: PathLike, *, threads: int | None = None, reporter: Reporter = SILENT) -> VerifyResult:
    """Check ``directory`` against the target of ``bundle`` (a remote's
    version is wdiff.sync.verify's, which ends here too)."""
    with BundleReader(bundle) as r:
        expected_files = {f.path: f for f in r.index.files}
        expected = r.index.target_fingerprint
    return check(directory, expected, expected_files, os.fspath(bundle), threads=threads, reporter=reporter)


def verify_recorded(directory: PathLike, *, threads: int | None = None, reporter: Reporter = SILENT) -> VerifyResult:
    """Check ``directory`` against its own record of the version a pull or
    an in-place apply brought it to; files the record does not list are
    untracked, and not read."""
    directory = os.fspath(directory)
    recorded = _record(directory)
    return check(directory, recorded.version, {r.path: r for r in recorded.files},
                 os.path.join(directory, STATE_DIR, version_record.NAME), threads=threads, reporter=reporter,
                 rules=DEFAULT_RULES.tracking(recorded.paths))


def check(directory: PathLike, expected: bytes, expected_files: dict, source: str, *, threads: int | None = None,
          reporter: Reporter = SILENT, rules=None) -> VerifyResult:
    """Hash every byte of ``directory`` and hold it against ``expected``
    (a fingerprint) and ``expected_files`` (path -> the bundle index's file
    entry, or the record's row), naming each file and tensor that differs.
    ``rules``: which files are the checkpoint's (default: the scan's)."""
    threads = threads or default_threads()
    directory = os.fspath(directory)
    # a file the version lists is read whatever the ignore rules say (a
    # version pushed with --include optimizer.pt holds one): not "missing"
    keep = frozenset(expected_files)
    ckpt = scan(directory, keep=keep) if rules is None else scan(directory, rules=rules, keep=keep)
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


def _record(directory: str) -> version_record.Record:
    """DIR's record, read strictly (a planted one is refused, never obeyed);
    a usage error naming the other sources when there is none."""
    state = StateDir.open(directory, create=False) if os.path.isdir(directory) else None
    recorded = None
    if state is not None:
        with state:
            recorded = version_record.read(state)
    if recorded is None:
        if not os.path.isdir(directory):
            scan(directory)  # the error of a path that is not a checkpoint directory
        raise UsageError(
            f"{directory}: has no record of a pull or an in-place apply (.wdiff/state.json) to check it against",
            hint="give what it should be: --bundle BUNDLE (its target) or --remote REMOTE [--to VERSION]",
        )
    return recorded
