"""``apply``: rebuild the target checkpoint from a base and a bundle, into a
new directory (copy.py) or inside the base itself (inplace.py). Both run the
same engine (engine.py) and the same checks (checks.py)."""

from __future__ import annotations

import os

from ...errors import BaseMismatchError, UsageError
from ...format import signature as signing
from ...format.bundle import BundleReader
from ...parallel import default_threads
from ...paths import PathLike
from ...progress import SILENT, Reporter
from ...store import ignore
from ..signing import open_signed_bundle
from .copy import apply_copy
from .inplace import apply_in_place
from .result import ApplyResult
from .wrongbase import explain

__all__ = ["ApplyResult", "apply"]


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
    """Rebuild the target of ``bundle`` from checkpoint ``base`` (None for an
    anchor).

    Into the new directory ``out`` (it appears complete or not at all), or
    with ``in_place=True`` inside ``base`` itself, journaled so that an
    interrupted run is finished by the next one (``abort=True`` rolls it
    back). The base is checked against the bundle's base fingerprint and the
    result against the target's digests before anything replaces the base.
    With trusted keys (``trusted_keys``, paths of public keys, else
    ``WDIFF_TRUSTED_KEYS``), ``bundle.minisig`` must be a valid signature of
    the bundle by one of them whose trusted comment names this bundle, its
    base and its target (``require_signature``: having no trusted key is
    then an error, not a licence to skip the check).
    Files of ``base`` that the ignore rules leave out (trainer state,
    .wdiffignore, ``exclude`` unless ``include``; see :func:`wdiff.diff`)
    are neither read, nor copied, nor removed. Returns an
    :class:`ApplyResult`.
    """
    threads = threads or default_threads()
    rules = ignore.rules(exclude, include)
    keys = signing.required_keys(trusted_keys, require_signature)
    if keys and not abort:
        # the signature is checked on an open file, which is then what is
        # applied: another file renamed over the path meanwhile is not
        bundle = open_signed_bundle(os.fspath(bundle), keys)
    try:
        return _apply(bundle, base, out, in_place=in_place, abort=abort, threads=threads, reporter=reporter,
                      rules=rules)
    except BaseMismatchError as e:
        if abort:
            raise
        # what the base is instead, and the next step (wrongbase.py)
        raise explain(e, bundle, base, None if in_place else out, rules=rules, threads=threads) from None
    finally:
        if isinstance(bundle, BundleReader):
            bundle.close()


def _apply(bundle, base, out, *, in_place: bool, abort: bool, threads: int, reporter: Reporter,
           rules: ignore.Rules) -> ApplyResult:
    if in_place:
        if out is not None:
            raise UsageError("give either an output directory or --in-place, not both")
        if base is None:
            raise UsageError("--in-place needs the checkpoint directory to update")
        if os.path.isfile(os.fspath(base)):
            raise UsageError(f"{os.fspath(base)}: --in-place updates a checkpoint directory, not a single file",
                             hint="write the new file with -o OUT")
        return apply_in_place(bundle, base, abort=abort, threads=threads, reporter=reporter, rules=rules)
    if abort:
        raise UsageError("--abort only makes sense with --in-place")
    if out is None:
        raise UsageError("give an output directory (-o OUT) or --in-place")
    return apply_copy(bundle, base, out, threads=threads, reporter=reporter, rules=rules)
