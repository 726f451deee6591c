"""Commands on checkpoints and bundles: diff, pack, apply."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..defaults import DEFAULT_LEVEL
from ..errors import ExitCode, UsageError
from . import argkinds, interrupts
from . import output as o
from .common import (
    Exclude,
    Include,
    Json,
    Level,
    Quiet,
    RequireSig,
    SignKey,
    Threads,
    TrustedKeys,
    Verbose,
    _setup,
    app,
    call,
)
from .help import epilog

# -- diff --------------------------------------------------------------------------------


@app.command(epilog=epilog("diff"))
def diff(
    a: Annotated[Path, typer.Argument(metavar="A", help="Old checkpoint directory.", show_default=False)],
    b: Annotated[Path, typer.Argument(metavar="B", help="New checkpoint directory.", show_default=False)],
    stat: Annotated[bool, typer.Option("--stat", help="Short form: one line per changed tensor, then totals.")] = False,
    exit_code: Annotated[
        bool, typer.Option("--exit-code", help="Exit 1 when the checkpoints differ, 0 when they do not.")
    ] = False,
    all_: Annotated[bool, typer.Option("--all", "-a", help="List unchanged tensors too.")] = False,
    exclude: Exclude = None,
    include: Include = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Show what changed between two checkpoints, tensor by tensor.

    Tensors are matched by name within their directory, whatever shard holds
    them; A and B may also be single .safetensors files. Trainer state
    (optimizer.pt, ...), .wdiffignore and --exclude patterns are left out,
    --include brings a file back. Unchanged tensors
    are recognised from block digests alone; for modified ones wdiff counts
    changed blocks and elements and, for float types, reports the largest
    absolute change and the L2 norm of the change relative to A's. Companion
    files (config, tokenizer, ...) are compared whole.
    """
    options = dict(locals())
    from ..ops.diff import diff as run_diff

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_diff(a, b)
    interrupts.arm(interrupts.read_only)
    res = call(run_diff, options, cli=("stat", "exit_code", "all_"), reporter=out.reporter())
    if out.json:
        out.document(res.to_json())
    elif stat:
        _diff_stat(out, res)
    else:
        _diff_table(out, res, all_ or verbose > 0)
    if exit_code and res.differs:
        raise typer.Exit(int(ExitCode.DIFFERENCES))


def _diff_table(out: o.Out, res, show_all: bool) -> None:
    out.result(f"a: {o.name(str(res.a))}  fingerprint {res.a_fingerprint.hex()[:16]}")
    out.result(f"b: {o.name(str(res.b))}  fingerprint {res.b_fingerprint.hex()[:16]}")
    rows = [["status", "tensor", "dtype", "shape", "blocks", "changed", "elements", "max|d|", "rel-L2"]]
    for t in res.tensors:
        if t.status == "unchanged" and not show_all:
            continue
        dtype = o.name(t.dtype if t.status != "retyped" else f"{t.old_dtype}->{t.dtype}", 40)
        shp = o.shape(t.shape) if t.status != "retyped" else f"{o.shape(t.old_shape)}->{o.shape(t.shape)}"
        if t.status in ("modified", "unchanged"):
            rows.append([
                t.status, o.name(t.name, 60), dtype, shp, f"{t.blocks_changed}/{t.blocks}",
                o.pct(t.fraction), o.count(t.changed), o.sci(t.max_abs), o.sci(t.rel_l2),
            ])
        else:
            rows.append([t.status, o.name(t.name, 60), dtype, shp, "", "", "", "", ""])
    if len(rows) > 1:
        out.result("")
        for line in o.table(rows, right={4, 5, 6, 7, 8}):
            out.result(line)
    if res.files:
        out.result("")
        for f in res.files:
            sizes = f"{o.size(f.old_size)} -> {o.size(f.new_size)}" if f.status == "changed" else o.size(f.new_size or f.old_size)
            out.result(f"{f.status:<9} file {o.name(f.path)}  ({sizes})")
    for path in res.metadata_changed:
        out.result(f"metadata  {o.name(path)}: __metadata__ changed")
    if res.layout_changed:
        out.result(f"layout    tensor files laid out differently ({res.a_tensor_files} -> {res.b_tensor_files} files); tensors matched by name")
    out.result("")
    out.result(_diff_summary(res))


def _diff_summary(res) -> str:
    t = res.totals
    parts = [f"{t[k]} {k}" for k in ("modified", "added", "removed", "retyped") if t[k]]
    head = ", ".join(parts) if parts else "no tensor changed"
    line = f"{head}; {t['unchanged']} unchanged of {t['tensors']} tensors"
    if t["compared_elements"]:
        line += f"; {o.count(t['changed_elements'])} of {o.count(t['compared_elements'])} elements changed ({o.pct(t['changed_fraction'])})"
    if t["files_changed"]:
        n = t["files_changed"]
        line += f"; {n} companion file{'s differ' if n != 1 else ' differs'}"
    if res.identical:
        line = "identical: " + line
    return line


def _diff_stat(out: o.Out, res) -> None:
    rows = []
    # the percentages right-aligned, as git's --stat aligns its counts
    width = max((len(o.pct(t.fraction)) for t in res.tensors if t.status == "modified"), default=0)
    for t in res.tensors:
        if t.status == "unchanged":
            continue
        what = f"{o.pct(t.fraction):>{width}} changed" if t.status == "modified" else t.status
        rows.append([o.name(t.name, 70), "|", what])
    for f in res.files:
        rows.append([o.name(f.path, 70), "|", f"file {f.status}"])
    for line in o.table(rows):
        out.result(" " + line)
    out.result(" " + _diff_summary(res))


# -- pack --------------------------------------------------------------------------------


@app.command(epilog=epilog("pack"))
def pack(
    paths: Annotated[
        list[Path],
        typer.Argument(metavar="A B", help="Base and target checkpoint directories (only B with --anchor).", show_default=False),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Bundle file to write.", show_default=False)],
    anchor: Annotated[bool, typer.Option("--anchor", help="Pack B whole, as a bundle that needs no base.")] = False,
    overwrite: Annotated[bool, typer.Option("--force", "-f", help="Replace the bundle file if it exists.")] = False,
    level: Level = DEFAULT_LEVEL,
    sign_key: SignKey = None,
    exclude: Exclude = None,
    include: Include = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
    format_version: Annotated[
        int | None,
        typer.Option("--format", metavar="N", help="Write at most bundle format version N (1 to 3; default: the newest). "
                     "A bundle has the lowest version its contents need.", show_default=False),
    ] = None,
) -> None:
    """Write a bundle that turns checkpoint A into checkpoint B.

    Unchanged blocks are skipped by digest; changed tensors are encoded element
    by element (positions and the XOR of old and new values, or, where that is
    smaller, their modular difference with positions coded per exponent of the
    base value: bundle format 3), the encoding chosen per chunk, and
    compressed with zstd. The bundle records
    the fingerprints of A and B and every digest apply needs to verify its
    work. The same inputs and options always give the same bytes. The file
    appears only when complete.
    """
    options = dict(locals())
    from ..ops.pack import pack as run_pack

    out = _setup(json_mode, quiet, verbose)
    interrupts.arm(interrupts.written, output)
    if anchor:
        if len(paths) != 1:
            raise UsageError("--anchor takes exactly one checkpoint directory (B)")
        a, b = None, paths[0]
    else:
        if len(paths) != 2:
            raise UsageError("pack takes two checkpoint directories, A and B (or --anchor B)")
        a, b = paths
    argkinds.check_diff(*(p for p in (a, b) if p is not None), command="pack")
    argkinds.check_pack_output(output)
    res = call(run_pack, options, cli=("paths", "anchor", "output", "sign_key"), a=a, b=b, out=output,
               reporter=out.reporter())
    if sign_key is not None:
        from ..ops.signing import sign_bundle

        sign_bundle(output, sign_key, verify=False)  # just written and verified
    if out.json:
        out.document(res.to_json())
        return
    per = f", {res.bytes_per_changed:.2f} bytes per changed element" if res.bytes_per_changed else ""
    out.result(
        f"wrote {o.name(str(output))}: {o.size(res.bundle_bytes)} for a {o.size(res.target_bytes)} checkpoint "
        f"({res.ratio:,.1f}x smaller{per})"
    )
    out.result(f"  {res.tensors_changed} of {res.tensors} tensors changed, {o.count(res.changed_elements)} elements; "
               f"{res.files_stored} file{'s' if res.files_stored != 1 else ''} stored {_stored_how(res)}")
    if out.verbose:
        for name, c in res.codecs.items():
            out.result(f"  {name:<7} {c.records:>7} records {o.size(c.bytes):>10}  {o.count(c.changed)} elements")
    base = res.base_fingerprint.hex()[:16] if res.base_fingerprint else "(none: anchor)"
    out.result(f"  base {base}  target {res.target_fingerprint.hex()[:16]}  bundle {res.bundle_id.hex()[:16]}")


# -- apply -------------------------------------------------------------------------------


@app.command(epilog=epilog("apply"))
def apply(
    bundle: Annotated[Path, typer.Argument(metavar="BUNDLE", help="Bundle file.", show_default=False)],
    base: Annotated[
        Optional[Path], typer.Argument(metavar="BASE", help="Base checkpoint directory (omit for an anchor).", show_default=False)
    ] = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="New directory to create (must not exist, or be empty).", show_default=False)
    ] = None,
    in_place: Annotated[bool, typer.Option("--in-place", help="Update BASE itself (journaled, resumable).")] = False,
    abort: Annotated[bool, typer.Option("--abort", help="With --in-place: roll back an interrupted apply.")] = False,
    trusted_keys: TrustedKeys = None,
    require_signature: RequireSig = False,
    exclude: Exclude = None,
    include: Include = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Rebuild the target checkpoint of BUNDLE from BASE.

    wdiff checks the bundle's digests and that BASE is the bundle's base (by
    fingerprint) and refuses anything else. With -o the target is built in a
    hidden temporary directory beside OUT, verified tensor by tensor against
    the target digests, synced, and renamed into place: OUT appears complete
    or not at all (the next apply to OUT removes what a killed one left, and
    two at once are refused). With --in-place, BASE is updated inside its own directory
    for checkpoints too large to copy: a journal and an undo log make the
    change finish, or roll back with --abort, after any interruption.
    """
    options = dict(locals())
    from ..ops.apply import apply as run_apply

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_apply(bundle, base)
    interrupts.arm(interrupts.apply, bundle, base, output, in_place=in_place, abort=abort)
    res = call(run_apply, options, cli=("output",), out=output, reporter=out.reporter())
    if out.json:
        out.document(res.to_json())
        return
    if abort:
        out.result(f"rolled back {o.name(res.output)} to the base {res.target_fingerprint.hex()[:16]}")
        return
    if res.already:
        out.result(f"{o.name(res.output)} is already at the target {res.target_fingerprint.hex()[:16]}; nothing to do")
        return
    how = "updated in place" if res.in_place else "wrote"
    again = " (finished an interrupted apply)" if res.resumed else ""
    out.result(f"{how} {o.name(res.output)}{again}: {res.files} file{'s' if res.files != 1 else ''} verified, target {res.target_fingerprint.hex()[:16]}")


def _stored_how(res) -> str:
    """How pack stored the files it stored: whole, unless some companion
    file went as byte-level deltas (DELTA records, format version 3)."""
    return "whole or as byte deltas" if any(k.startswith("file-") for k in res.codecs) else "whole"
