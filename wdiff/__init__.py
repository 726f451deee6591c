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
code. Options are keyword-only; ``threads`` (default: every core, or
``WDIFF_THREADS``) and ``reporter`` (a :class:`Reporter` that hears of the
progress; default: ``SILENT``) mean the same wherever they appear.

Each public function *is* the use case that does the work (``wdiff.pull is
wdiff.sync.pull.inplace.pull``): its signature and docstring are the reference. The
names are looked up in one table (:data:`_LAZY`) on first use, so ``import
wdiff`` stays light: it loads none of numpy, zstandard, the Hub client or the
command line until a function is reached.

The package is built in layers, each a folder, imports flowing downwards
(the contract is in pyproject.toml and is checked by the test suite)::

    cli/, bench/   the command line; the benchmark
    sync/          the remote use cases: push, pull, log, status, stage, gc, ...
    ops/           the local use cases: diff, pack, apply, squash, verify, ...
    format/        the bundle format, chain index, signatures, journal, undo log
    remotes/       directory and Hub storage: moves bytes, knows no format
    store/         checkpoints: scanning, safetensors headers, digests, cache, I/O
    codec/         element-level encodings and their kernels (C and numpy)
    *.py           the ground floor: errors, paths, files, threads, defaults
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .defaults import DEFAULT_CHUNK, DEFAULT_LEVEL, DEFAULT_PART_SIZE, __version__
from .errors import ExitCode, WdiffError
from .progress import SILENT, Reporter

#: every public name that is not defined above -> "module:attribute", the one
#: place that says where it lives; imported on first use by :func:`__getattr__`
_LAZY = {
    # the use cases
    "diff": "wdiff.ops.diff:diff",
    "pack": "wdiff.ops.pack:pack",
    "apply": "wdiff.ops.apply:apply",
    "squash": "wdiff.ops.squash:squash",
    "verify": "wdiff.sync.verify:verify",
    "inspect": "wdiff.ops.inspect:inspect",
    "push": "wdiff.sync.push:push",
    "squash_remote": "wdiff.sync.push:squash_remote",
    "pull": "wdiff.sync.pull:pull",
    "status": "wdiff.sync.history:status",
    "log": "wdiff.sync.history:log",
    "gc": "wdiff.sync.gc:gc",
    "push_part": "wdiff.sync.stage:push_part",
    "commit": "wdiff.sync.stage:commit",
    # what they return
    "DiffResult": "wdiff.ops.diff:DiffResult",
    "PackResult": "wdiff.ops.pack:PackResult",
    "ApplyResult": "wdiff.ops.apply:ApplyResult",
    "VerifyResult": "wdiff.ops.verify:VerifyResult",
    "BundleInfo": "wdiff.ops.inspect:BundleInfo",
    "PushResult": "wdiff.sync.push:PushResult",
    "PullResult": "wdiff.sync.pull:PullResult",
    "StatusResult": "wdiff.sync.history:StatusResult",
    "LogResult": "wdiff.sync.history:LogResult",
    "GcResult": "wdiff.sync.gc:GcResult",
    "StagedPart": "wdiff.sync.stage:StagedPart",
    "CommitResult": "wdiff.sync.stage:CommitResult",
    # what they take for a path
    "PathLike": "wdiff.paths:PathLike",
}

if TYPE_CHECKING:  # what type checkers and IDEs see: the real functions, with their signatures
    from .ops.apply import ApplyResult, apply
    from .ops.diff import DiffResult, diff
    from .ops.inspect import BundleInfo, inspect
    from .ops.pack import PackResult, pack
    from .ops.squash import squash
    from .ops.verify import VerifyResult
    from .paths import PathLike
    from .sync.gc import GcResult, gc
    from .sync.history import LogResult, StatusResult, log, status
    from .sync.pull import PullResult, pull
    from .sync.push import PushResult, push, squash_remote
    from .sync.stage import CommitResult, StagedPart, commit, push_part
    from .sync.verify import verify

# the names above and those of _LAZY (a test holds the two lists in step)
__all__ = [
    "DEFAULT_CHUNK", "DEFAULT_LEVEL", "DEFAULT_PART_SIZE", "SILENT", "ExitCode", "Reporter", "WdiffError",
    "__version__",
    "diff", "pack", "apply", "squash", "verify", "inspect", "push", "squash_remote", "pull", "status", "log",
    "gc", "push_part", "commit",
    "DiffResult", "PackResult", "ApplyResult", "VerifyResult", "BundleInfo", "PushResult", "PullResult",
    "StatusResult", "LogResult", "GcResult", "StagedPart", "CommitResult",
    "PathLike",
]


def __getattr__(name: str):
    """``wdiff.NAME`` for a name of :data:`_LAZY`: import its module, then
    keep the attribute here, so that the next lookup is a plain one."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'wdiff' has no attribute {name!r}")
    module, attr = where.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
