"""wdiff: diff, pack, ship and apply model checkpoint deltas.

The public API::

    import wdiff
    result = wdiff.diff("ckptA", "ckptB")          # -> DiffResult
    packed = wdiff.pack("ckptA", "ckptB", "step.wdb")  # -> PackResult
    wdiff.apply("step.wdb", "ckptA", "ckptB-copy")  # -> ApplyResult

Functions never print; they raise subclasses of :class:`wdiff.WdiffError`.
Heavy modules are imported on first use, so ``import wdiff`` stays light.
"""

from __future__ import annotations

from .errors import ExitCode, WdiffError

__version__ = "0.1.0"

__all__ = ["ExitCode", "WdiffError", "__version__", "apply", "diff", "pack", "inspect", "verify"]


def diff(a, b, **kwargs):
    """Compare two checkpoint directories. See :func:`wdiff.diffing.diff`."""
    from .diffing import diff as _diff

    return _diff(a, b, **kwargs)


def pack(a, b, out, **kwargs):
    """Write a bundle that turns ``a`` into ``b``. See :func:`wdiff.packing.pack`."""
    from .packing import pack as _pack

    return _pack(a, b, out, **kwargs)


def apply(bundle, base=None, out=None, **kwargs):
    """Rebuild the target of ``bundle`` from ``base``. See :func:`wdiff.applying.apply`."""
    from .applying import apply as _apply

    return _apply(bundle, base, out, **kwargs)
