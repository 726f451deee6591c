"""``wdiff export REMOTE OUT --layout hf-delta``: a wdiff chain's versions
as the field's delta layout, for SGLang's ``/pull_weights`` and NVIDIA
ModelExpress.

The versions are the chain's history, from an anchor (or ``--from``) to the
head (or ``--to``): each version's parent as first pushed, back to an
anchor. The first one exported is written full (``weight_v000000/``, a
plain checkpoint directory), each later one as a delta against the one
before it, or full where the layout cannot express the change.

Each version is built from two checkpoints that wdiff's own pull brought
to the two versions in a work area (so they are verified against the
chain's digests), written into a private folder, read back and checked
against the chain's digests of the new version, and only then made
visible (see output.py). The export is incremental and idempotent: each
version's ledger records which wdiff version it holds; a rerun continues
after the last one, never rewrites one, and refuses an output whose last
version is not on the chain's history.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass

from ...errors import BaseMismatchError, FormatError, IntegrityError, UsageError
from ...format import signature as signing
from ...format.chain import Chain
from ...fsutil import check_output, io_error, scratch_dir, temp_name
from ...sync import trust
from ...sync.fetch import read_verified
from ...sync.places import refuse_checkpoint_as_remote
from ...sync.pull.inplace import pull
from ...parallel import default_threads
from ...paths import printable
from ...progress import SILENT, Reporter
from ...remotes import open_remote, parse_remote
from ...statedir import StateDir
from ...store import manifest, version_record
from ...store.checkpoint import Checkpoint, scan
from ...store.hashing import hexd, short
from ...store.ignore import DEFAULT_RULES
from .layout import INDEX, LEDGER, LEDGER_DIR, Ledger, dir_name, version_text
from .output import open_output
from .verify import check_delta, check_full
from .writer import changed_tensors, delta_files, encode, encodings, write_delta, write_full

LAYOUTS = ("hf-delta",)


@dataclass(frozen=True)
class Exported:
    name: str  # weight_vNNNNNN
    fingerprint: bytes
    full: bool
    encoding: str | None
    tensors: int  # tensors a delta lists (0 for a full version)
    changed_bytes: int
    bytes: int  # written

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.name.removeprefix("weight_v"), "fingerprint": hexd(self.fingerprint),
                "full": self.full, "encoding": self.encoding, "tensors": self.tensors,
                "changed_bytes": self.changed_bytes, "bytes": self.bytes}


@dataclass(frozen=True)
class ExportResult:
    remote: str
    output: str
    layout: str
    before: int  # versions OUT held before
    written: tuple[Exported, ...]
    head: bytes | None  # the wdiff version OUT's last version holds now

    @property
    def up_to_date(self) -> bool:
        return not self.written

    def to_json(self) -> dict:
        return {"schema": "wdiff.export/1", "remote": self.remote, "output": self.output, "layout": self.layout,
                "before": self.before, "after": self.before + len(self.written), "up_to_date": self.up_to_date,
                "head": hexd(self.head) if self.head else None, "written": [w.to_json() for w in self.written]}


def history(chain: Chain, goal: bytes) -> list[bytes]:
    """The versions from an anchor to ``goal``: each one's parent as its
    first entry (its push) names it, back to an entry with none."""
    first: dict[bytes, object] = {}
    for e in chain.entries:
        first.setdefault(e.version, e)
    out, v = [goal], goal
    while first[v].parent is not None and first[v].parent in first:  # (a gc may have dropped what came before)
        v = first[v].parent
        if v in out:
            raise FormatError(f"the chain's history from {short(goal)} goes round in a loop")
        out.append(v)
    out.reverse()
    return out


def export(remote, out, *, layout: str = "hf-delta", start: str | None = None, to: str | None = None,
           work=None, trusted_keys: list | None = None, require_signature: bool = False, token: str | None = None,
           threads: int | None = None, reporter: Reporter = SILENT) -> ExportResult:
    """Write the versions of the chain at ``remote`` into ``out`` in the
    delta layout (see the module's doc). ``start``, ``to``: versions of
    the chain as pull names them (default: the history's anchor, the
    head); ``start`` is for the first export into ``out`` only. ``work``: a
    folder for the two checkpoints the versions are built from (kept, so a
    later export starts from them; default: a temporary one)."""
    if layout not in LAYOUTS:
        raise UsageError(f"no layout {printable(layout, 40)} (export writes: {', '.join(LAYOUTS)})")
    threads = threads or default_threads()
    remote = os.fspath(remote)
    refuse_checkpoint_as_remote(remote)
    spec = parse_remote(remote)
    inputs = [("the remote", spec["path"])] if spec["kind"] == "local" else []
    if work is not None:
        inputs.append(("the work folder", os.fspath(work)))
    if parse_remote(os.fspath(out))["kind"] == "local":
        check_output(os.fspath(out), inputs)
        if work is not None:
            check_output(os.fspath(work), [("the output", os.fspath(out))])
    store = open_remote(remote, token=token)
    keys = signing.required_keys(trusted_keys, require_signature)
    chain = read_verified(store, keys, records=trust.places(None), reporter=reporter).chain
    goal = chain.resolve(to)
    line = history(chain, goal)
    with open_output(out, token=token) as output:
        before = output.count()
        todo, last = _todo(chain, line, output, before, start, goal)
        written: list[Exported] = []
        if todo:
            with _work(work) as w:
                opts = dict(trusted_keys=trusted_keys, require_signature=require_signature, token=token,
                            threads=threads, force=True, reporter=reporter)
                _run(remote, output, todo, last, before, w, opts, written, threads, reporter)
    reporter.done()
    head = written[-1].fingerprint if written else last
    return ExportResult(store.url, output.url, layout, before, tuple(written), head)


def _todo(chain: Chain, line: list[bytes], output, before: int, start: str | None, goal: bytes):
    """The versions to write, and the one OUT's last version holds (None: OUT is empty)."""
    if before == 0:
        first = 0
        if start is not None:
            s = chain.resolve(start)
            if s not in line:
                raise UsageError(f"--from {printable(start, 80)} is not on the history of {short(goal)}")
            first = line.index(s)
        return line[first:], None
    last = output.ledger(before - 1).fingerprint  # (each ledger names its own folder's number)
    if start is not None and chain.resolve(start) != output.ledger(0).fingerprint:
        raise UsageError(f"{output.url} holds versions already: --from only chooses the first one exported",
                         hint="drop --from, or export into a new output")
    if last in line:
        return line[line.index(last) + 1:], last
    if last in chain.versions and goal in history(chain, last):
        return [], last  # OUT is past --to already
    raise BaseMismatchError(f"{output.url}: its last version ({dir_name(before - 1)}, {short(last)}) is not on the "
                            f"chain's history to {short(goal)}: the output follows another history",
                            hint="export into a new output (the chain was rolled back or forked)")


@contextlib.contextmanager
def _work(work):
    if work is None:
        with scratch_dir("export") as w:
            yield w
        return
    w = os.path.abspath(os.fspath(work))
    os.makedirs(w, exist_ok=True)
    yield w


def _record(directory: str) -> version_record.Record:
    with StateDir.open(directory) as state:
        rec = version_record.read(state)
    if rec is None:  # pragma: no cover - a pull always records its version
        raise FormatError(f"{directory}: no record of the version pulled")
    return rec


def _scanned(directory: str, rec: version_record.Record) -> Checkpoint:
    return scan(directory, rules=DEFAULT_RULES.tracking(rec.paths))


def _run(remote: str, output, todo: list[bytes], last: bytes | None, before: int, w: str, opts: dict,
         written: list, threads: int, reporter: Reporter) -> None:
    """``a`` holds the version before (the base of the next delta), ``b``
    is pulled one version ahead of it; once a version is written, ``a``
    takes ``b``'s changed files (checked against the chain's digests), so
    every pull is one bundle, never a squash of two."""
    a, b = os.path.join(w, "a"), os.path.join(w, "b")
    n = before
    prev = last
    if prev is not None:
        pull(remote, a, to=hexd(prev), **opts)
    for fp in todo:
        target = a if prev is None else b
        pull(remote, target, to=hexd(fp), **opts)
        rb = _record(target)
        B = _scanned(target, rb)
        ledger = Ledger(version_text(n), fp, prev)
        with output.staging(n, w) as folder:
            if prev is None:
                done = _full(output, n, folder, B, rb, Ledger(version_text(n), fp, None), threads)
            else:
                ra = _record(a)
                done = _delta(output, n, folder, _scanned(a, ra), B, ra, rb, ledger, w, threads)
                _advance(a, b, ra, rb, threads)
        written.append(done)
        prev = fp
        n += 1


def _advance(a: str, b: str, ra: version_record.Record, rb: version_record.Record, threads: int) -> None:
    """Bring ``a`` (at ``ra``) to ``b``'s version (``rb``) by copying the
    files that differ; those copies are hashed and must have ``rb``'s
    digests (the files that did not change were checked when ``a`` got
    them), and ``a``'s record says ``rb`` only then."""
    old = {r.path: (r.kind, r.size, r.digest) for r in ra.files}
    changed = {r.path for r in rb.files if old.get(r.path) != (r.kind, r.size, r.digest)}
    with StateDir.open(a) as state:
        version_record.forget(state)  # between two versions until the copies are checked
        for path in sorted(changed):
            dest = os.path.join(a, path)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = temp_name(dest)
            try:
                shutil.copyfile(os.path.join(b, path), tmp)
                os.replace(tmp, dest)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise io_error(dest, e) from None
        for path in sorted(ra.paths - rb.paths):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(a, path))
        ckpt = _scanned(a, rb)
        sub = Checkpoint(root=ckpt.root, files=tuple(f for f in ckpt.files if f.path in changed))
        got = {f.path: (f.kind, f.size, f.digest) for f in manifest.compute(sub, threads=threads).files}
        want = {r.path: (r.kind, r.size, r.digest) for r in rb.files if r.path in changed}
        if got != want or [f.path for f in ckpt.files] != [r.path for r in rb.files]:
            raise IntegrityError(f"{a}: the copy of {b}'s changed files is not its version (a disk error?)")
        version_record.write(state, rb)


def _full(output, n: int, folder: str, B: Checkpoint, rb: version_record.Record, ledger: Ledger,
          threads: int) -> Exported:
    if output.local:
        files = write_full(folder, B, ledger)
        check_full(folder, rb, ledger, threads=threads)
        output.commit(n, folder, files)
    else:  # uploaded from the pulled checkpoint itself, checked first; the ledger from the folder
        check_full(B.root, rb, None, threads=threads)
        os.makedirs(os.path.join(folder, LEDGER_DIR))
        with open(os.path.join(folder, LEDGER), "wb") as f:
            f.write(ledger.encode())
        # a full version's index goes up first: a reader that sees part of
        # the upload finds shards the index names missing (pull --layout
        # hf-delta refuses that), where without it the part would pass for
        # the whole; a delta's index, the layout's commit point, goes last
        order = sorted(B.files, key=lambda f: (f.path != INDEX, f.path))
        output.commit(n, folder, [f.path for f in order] + [LEDGER], {f.path: f.abspath for f in order})
    return Exported(dir_name(n), ledger.fingerprint, True, None, 0, 0, B.total_bytes)


def _delta(output, n: int, folder: str, A: Checkpoint, B: Checkpoint, ra, rb, ledger: Ledger, w: str,
           threads: int) -> Exported:
    files = delta_files(A, B, ra, rb)
    changed = changed_tensors(files, threads=threads) if files is not None else []
    if not changed:  # the layout cannot say what changed: the version goes whole
        return _full(output, n, folder, B, rb, Ledger(ledger.version, ledger.fingerprint, None), threads)
    best = None
    for enc in encodings(changed):
        spool = os.path.join(w, f"spool-{enc}")
        spans = encode(changed, enc, spool)
        size = sum(k for _, k in spans)
        if best is None or size < best[0]:
            if best is not None:
                os.unlink(best[3])
            best = (size, enc, spans, spool)
        else:
            os.unlink(spool)
    _, enc, spans, spool = best
    files_written = write_delta(folder, changed, enc, spool, spans, version=version_text(n),
                                base=version_text(n - 1), ledger=ledger)
    os.unlink(spool)
    check_delta(folder, A, ra, rb, ledger, version=version_text(n), base=version_text(n - 1),
                stage=os.path.join(w, "verify.bin"))
    size = sum(os.path.getsize(os.path.join(folder, p)) for p in files_written)
    output.commit(n, folder, files_written)
    return Exported(dir_name(n), ledger.fingerprint, False, enc, len(changed), sum(c.count for c in changed), size)
