"""wdiff: diff, pack, ship and apply model checkpoint deltas.

The public API::

    import wdiff
    result = wdiff.diff("ckptA", "ckptB")              # -> DiffResult
    packed = wdiff.pack("ckptA", "ckptB", "step.wdb")  # -> PackResult
    wdiff.apply("step.wdb", "ckptA", "ckptB-copy")     # -> ApplyResult
    wdiff.push("ckptB", "hf://acme/policy", base="ckptA", label="step-2")
    wdiff.pull("hf://acme/policy", "/models/policy")

Functions never print; they return frozen dataclasses with a ``to_json()``
and raise subclasses of :class:`wdiff.WdiffError`, each carrying its exit
code. Options are keyword-only. Heavy modules are imported on first use, so
``import wdiff`` stays light.

The package is built in layers, each a folder, imports flowing downwards
(the contract is in pyproject.toml and is checked by the test suite)::

    cli/, bench/   the command line; the benchmark
    ops/           the use cases: diff, pack, apply, squash, verify, push, pull, ...
    format/        the bundle format, chain index, signatures, journal, undo log
    remotes/       directory and Hub storage: moves bytes, knows no format
    store/         checkpoints: scanning, safetensors headers, digests, cache, I/O
    codec/         element-level encodings and their kernels (C and numpy)
    *.py           the ground floor: errors, paths, files, threads, defaults
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .defaults import DEFAULT_CHUNK, DEFAULT_LEVEL, DEFAULT_PART_SIZE, __version__
from .errors import ExitCode, WdiffError
from .progress import SILENT, Reporter

if TYPE_CHECKING:
    from .ops.apply import ApplyResult
    from .ops.diff import DiffResult
    from .ops.history import LogResult, StatusResult
    from .ops.inspect import BundleInfo
    from .ops.pack import PackResult
    from .ops.pull import PullResult
    from .ops.push import PushResult
    from .ops.verify import VerifyResult

__all__ = [
    "ExitCode",
    "Reporter",
    "WdiffError",
    "__version__",
    "apply",
    "commit",
    "diff",
    "gc",
    "inspect",
    "log",
    "pack",
    "pull",
    "push",
    "push_part",
    "squash",
    "squash_remote",
    "status",
    "verify",
]

PathLike = str | os.PathLike


def diff(
    a: PathLike,
    b: PathLike,
    *,
    threads: int | None = None,
    reporter: Reporter = SILENT,
    exclude: tuple[str, ...] | list[str] = (),
    include: tuple[str, ...] | list[str] = (),
) -> DiffResult:
    """Compare checkpoint ``a`` with checkpoint ``b``, tensor by tensor.

    Returns a :class:`~wdiff.ops.diff.DiffResult`: per tensor its status
    (unchanged, modified, added, removed, retyped), the changed blocks and
    elements, the largest change and the relative L2 norm of the change; per
    companion file whether it changed; and totals. ``threads`` defaults to
    every core (or ``WDIFF_THREADS``). Either side may be a single
    ``.safetensors`` file. Files matching the default trainer-state
    patterns, the checkpoint's ``.wdiffignore`` or ``exclude`` (gitignore
    syntax) are left out, unless a later ``include`` pattern matches.
    """
    from .ops.diff import diff as _diff

    return _diff(a, b, threads=threads, reporter=reporter, exclude=exclude, include=include)


def pack(
    a: PathLike | None,
    b: PathLike,
    out: PathLike,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    reporter: Reporter = SILENT,
    overwrite: bool = False,
    exclude: tuple[str, ...] | list[str] = (),
    include: tuple[str, ...] | list[str] = (),
    format_version: int | None = None,
) -> PackResult:
    """Write to ``out`` the bundle that turns checkpoint ``a`` into ``b``.

    With ``a=None`` the bundle is an anchor: ``b`` whole, needing no base.
    ``level`` is zstd's; ``chunk`` the bytes one record covers at most. The
    same inputs and options always give the same bytes, whatever
    ``threads``. An existing ``out`` is refused unless ``overwrite``; an
    ``out`` that is, or lies inside, ``a`` or ``b`` always is. ``exclude``
    and ``include`` are as for :func:`diff`. ``format_version`` is the
    newest bundle format version the bundle may use (default: the newest
    this wdiff writes; 1 or 2 for readers that predate codec v2, which also
    store changed companion files whole). Returns a
    :class:`~wdiff.ops.pack.PackResult`.
    """
    from .ops.pack import pack as _pack

    return _pack(a, b, out, level=level, threads=threads, chunk=chunk, reporter=reporter, overwrite=overwrite,
                 exclude=exclude, include=include, format_version=format_version)


def apply(
    bundle: PathLike,
    base: PathLike | None = None,
    out: PathLike | None = None,
    *,
    in_place: bool = False,
    abort: bool = False,
    trusted_keys: list | None = None,
    require_signature: bool = False,
    threads: int | None = None,
    reporter: Reporter = SILENT,
    exclude: tuple[str, ...] | list[str] = (),
    include: tuple[str, ...] | list[str] = (),
) -> ApplyResult:
    """Rebuild the target of ``bundle`` from checkpoint ``base``.

    Into the new directory ``out`` (it appears complete or not at all), or
    with ``in_place=True`` inside ``base`` itself, journaled so that an
    interrupted run is finished by the next one (``abort=True`` rolls it
    back). The base is checked against the bundle's base fingerprint and the
    result against the target's digests before anything replaces the base.
    With ``trusted_keys`` (paths of public keys, or ``WDIFF_TRUSTED_KEYS``),
    ``bundle.minisig`` must be a valid signature by one of them. Files of
    ``base`` that the ignore rules leave out (see :func:`diff`) are neither
    read, nor copied, nor removed.
    """
    from .ops.apply import apply as _apply

    return _apply(bundle, base, out, in_place=in_place, abort=abort, trusted_keys=trusted_keys,
                  require_signature=require_signature, threads=threads, reporter=reporter,
                  exclude=exclude, include=include)


def squash(
    bundles: list,
    base: PathLike | None = None,
    out: PathLike | None = None,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    reporter: Reporter = SILENT,
    overwrite: bool = False,
) -> PackResult:
    """Compose a run of ``bundles`` (each one's target the next one's base)
    into one bundle ``out`` from the first base to the last target, exactly.
    ``base`` is the first bundle's base checkpoint (None when it is an anchor).
    An existing ``out`` is refused unless ``overwrite``."""
    from .ops.squash import squash as _squash

    return _squash(bundles, base, out, level=level, threads=threads, reporter=reporter, overwrite=overwrite)


def verify(
    directory: PathLike,
    *,
    bundle: PathLike | None = None,
    remote: str | None = None,
    version: str | None = None,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> VerifyResult:
    """Read every byte of ``directory`` and check it against the target of
    ``bundle``, or against ``version`` (default: the head) of ``remote``.
    Returns a :class:`~wdiff.ops.verify.VerifyResult` naming what differs."""
    from .ops.verify import verify as _verify

    return _verify(directory, bundle=bundle, remote=remote, version=version, threads=threads, reporter=reporter)


def inspect(bundle: PathLike) -> BundleInfo:
    """Describe ``bundle`` (base, target, files, records per codec) after
    checking every digest in it."""
    from .ops.inspect import inspect as _inspect

    return _inspect(bundle)


def push(
    source: PathLike,
    remote: str,
    *,
    base: PathLike | None = None,
    anchor: bool = False,
    label: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    fork: bool = False,
    level: int = DEFAULT_LEVEL,
    sign_key: PathLike | None = None,
    token: str | None = None,
    private: bool = True,
    commit_message: str | None = None,
    adopt: bool = False,
    allow_opaque: bool = False,
    threads: int | None = None,
    anchor_every: int | None = None,
    anchor_when: float | None = None,
    exclude: tuple[str, ...] | list[str] = (),
    include: tuple[str, ...] | list[str] = (),
    reporter: Reporter = SILENT,
) -> PushResult:
    """Publish ``source`` on ``remote`` as the new head of its chain.

    ``source`` is a bundle file, or a checkpoint directory packed against
    ``base`` (or whole, with ``anchor=True``). A bundle whose base is not the
    head is refused unless ``fork=True`` and the remote has its base. With
    ``sign_key`` (a minisign secret key file) the bundle and the new chain
    index are signed, once the chain being extended has verified (an
    unsigned chain is signed for the first time only with ``adopt=True``);
    an unsigned push onto a signed chain is refused. A checkpoint directory
    that a loader could not open is refused unless ``allow_opaque=True``.
    Of two concurrent pushes one wins; the other raises
    :class:`~wdiff.errors.ConflictError`.

    On the Hub, a push creates what is missing: the repository (private
    unless ``private=False``), the branch named by ``@REV`` (from the
    default branch), and a model card when the repository has none.
    ``token`` is handed to huggingface_hub (default: ``HF_TOKEN`` or the
    stored login); ``commit_message`` replaces wdiff's own.

    For a directory pushed with ``base``, ``anchor_every=N`` also publishes
    it whole as an anchor (in the same chain write) every N pushes since the
    newest anchor, and ``anchor_when=FRACTION`` when catching up from the
    newest anchor would cost more than that fraction of its size.
    ``exclude`` and ``include`` choose the files of a directory as
    :func:`pack` does (trainer state is left out unless included).
    """
    from .ops.push import push as _push

    return _push(source, remote, base=base, anchor=anchor, label=label, part_size=part_size, fork=fork,
                 level=level, sign_key=sign_key, token=token, private=private, commit_message=commit_message,
                 adopt=adopt, allow_opaque=allow_opaque, threads=threads, anchor_every=anchor_every,
                 anchor_when=anchor_when, exclude=exclude, include=include, reporter=reporter)


def squash_remote(
    remote: str,
    *,
    start: str | None = None,
    to: str | None = None,
    base: PathLike | None = None,
    label: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    sign_key: PathLike | None = None,
    adopt: bool = False,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> PushResult:
    """Add to ``remote`` one bundle from version ``start`` (default: nothing,
    an anchor) to ``to`` (default: the head), composed from the bundles the
    chain already has, so that a late joiner downloads one bundle. Starting
    from a version needs that checkpoint as ``base``."""
    from .ops.push import squash_remote as _squash_remote

    return _squash_remote(remote, start=start, to=to, base=base, label=label, part_size=part_size,
                          sign_key=sign_key, adopt=adopt, threads=threads, reporter=reporter)


def pull(
    remote: str,
    directory: PathLike,
    *,
    to: str | None = None,
    trusted_keys: list | None = None,
    require_signature: bool = False,
    token: str | None = None,
    threads: int | None = None,
    max_age: float | None = None,
    force: bool = False,
    atomic: bool = False,
    keep: int | None = None,
    reporter: Reporter = SILENT,
) -> PullResult:
    """Bring ``directory`` to version ``to`` (default: the head) of ``remote``:
    the cheapest run of bundles from its version, or an anchor, downloaded,
    verified and applied in place. With ``trusted_keys`` (or
    ``WDIFF_TRUSTED_KEYS``) the chain index and every bundle must be signed
    by one of them, and the chain must not go back on what this directory
    or this user accepted before (rollback, another remote's chain); with
    ``max_age`` (seconds) it must have been published within that time.
    ``token`` is for a Hub remote (default: ``HF_TOKEN`` or the stored
    login). An interrupted download continues, on the next call, from the
    bytes it had. Untracked files (those the version ``directory`` records
    does not have) are kept; changed files of that version are refused
    (:class:`~wdiff.errors.LocalChangesError`) unless ``force``. ``atomic``:
    ``directory`` is a symbolic link, switched to a new directory built
    beside its target; ``keep`` (with ``atomic`` only; default 2): how many
    of the version directories that atomic pulls made for this link stay
    beside it, counting the one it points to (0: all), the oldest beyond
    that removed after the switch."""
    from .ops.pull import pull as _pull

    return _pull(remote, directory, to=to, trusted_keys=trusted_keys, require_signature=require_signature,
                 token=token, threads=threads, max_age=max_age, force=force, atomic=atomic, keep=keep,
                 reporter=reporter)


def status(
    directory: PathLike, remote: str, *, to: str | None = None, trusted_keys: list | None = None,
    require_signature: bool = False, max_age: float | None = None, threads: int | None = None,
    reporter: Reporter = SILENT,
) -> StatusResult:
    """Where ``directory`` stands against ``remote``: its version, whether the
    remote knows it, and how many bundles (and bytes) a pull to ``to``
    (default: the head) would fetch. With ``trusted_keys`` (or
    ``WDIFF_TRUSTED_KEYS``) the chain is checked as :func:`pull` checks it."""
    from .ops.history import status as _status

    return _status(directory, remote, to=to, trusted_keys=trusted_keys, require_signature=require_signature,
                   max_age=max_age, threads=threads, reporter=reporter)


def log(remote: str, *, trusted_keys: list | None = None, require_signature: bool = False,
        max_age: float | None = None, reporter: Reporter = SILENT) -> LogResult:
    """The versions on ``remote``, newest first, with the head. With
    ``trusted_keys`` (or ``WDIFF_TRUSTED_KEYS``) the chain is checked as
    :func:`pull` checks it."""
    from .ops.history import log as _log

    return _log(remote, trusted_keys=trusted_keys, require_signature=require_signature, max_age=max_age,
                reporter=reporter)


def gc(
    remote: str,
    *,
    keep_last: int,
    keep: list[str] | None = None,
    dry_run: bool = False,
    grace: float = 24 * 3600.0,
    sign_key: PathLike | None = None,
    token: str | None = None,
    work: str | None = None,
    threads: int | None = None,
    reporter: Reporter = SILENT,
):
    """Retention on ``remote``: keep the newest ``keep_last`` versions, the
    versions ``keep`` names (labels, fingerprints, HEAD~N) and the head, and
    drop every other entry of the chain; kept versions that would become
    unreachable get a squashed bundle first. In two phases: a new chain
    index (conditional: :class:`~wdiff.errors.ConflictError` when the chain
    moved) lists the objects it no longer names as garbage; only garbage
    that a gc listed at least ``grace`` seconds ago is deleted, so that a
    pull that read the old chain keeps working. ``dry_run`` changes nothing
    and says what would go. A signed chain needs ``sign_key`` (it is signed
    again). Returns a :class:`wdiff.ops.gc.GcResult`."""
    from .ops.gc import gc as _gc

    return _gc(remote, keep_last=keep_last, keep=keep, dry_run=dry_run, grace=grace, sign_key=sign_key,
               token=token, work=work, threads=threads, reporter=reporter)


def push_part(
    source: PathLike,
    remote: str,
    *,
    base: PathLike | None,
    only: list[str],
    stage: str,
    level: int = DEFAULT_LEVEL,
    sign_key: PathLike | None = None,
    token: str | None = None,
    threads: int | None = None,
    reporter: Reporter = SILENT,
):
    """One writer's part of a version many writers publish together: pack
    the files of ``source`` that ``only`` names (patterns as in
    .wdiffignore) against the files of ``base`` (the remote's head) they
    need (the same paths, and those holding the old bytes of their
    tensors), and store the bundle and its manifest under the remote's
    stage ``stage``; with ``sign_key`` (a minisign secret key file) the
    part is signed, as a commit that signs requires. Nothing becomes
    visible; :func:`commit` publishes the parts. A rerun stores the same
    part again. Returns a :class:`wdiff.ops.stage.StagedPart`."""
    from .ops.stage import push_part as _push_part

    return _push_part(source, remote, base=base, only=only, stage=stage, level=level, sign_key=sign_key,
                      token=token, threads=threads, reporter=reporter)


def commit(
    remote: str,
    *,
    stage: str,
    expect: int,
    label: str | None = None,
    sign_key: PathLike | None = None,
    trusted_keys: list[PathLike] | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    token: str | None = None,
    threads: int | None = None,
    reporter: Reporter = SILENT,
):
    """Publish the ``expect`` parts staged under ``stage`` as one version,
    atomically: with ``sign_key`` or trusted keys (``trusted_keys``, else
    WDIFF_TRUSTED_KEYS) each part must be signed by one of them (or by
    ``sign_key``), else :class:`~wdiff.errors.IntegrityError`; they must be
    of this remote and stage, cover disjoint files (two parts holding one
    file raise :class:`~wdiff.errors.BaseMismatchError`), their bases
    together must be the remote's head, and each must be intact; they are
    merged into one bundle (the one a single host would pack) and pushed
    with one conditional chain write, then the stage is deleted. A missing
    part raises :class:`~wdiff.errors.NotFoundError` and changes nothing.
    Returns a :class:`wdiff.ops.stage.CommitResult`."""
    from .ops.stage import commit as _commit

    return _commit(remote, stage=stage, expect=expect, label=label, sign_key=sign_key, trusted_keys=trusted_keys,
                   part_size=part_size, token=token, threads=threads, reporter=reporter)
