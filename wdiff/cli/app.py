"""The Typer application: thin wrappers over the library. Each command parses
its options, calls one library function, and renders the result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import __version__
from ..errors import EXIT_CODE_TABLE, ExitCode, UsageError
from . import output as o
from .help import epilog
from .state import STATE

EXIT_STATUS = "\n".join(f"  {int(code):>3}  {text}" for code, text in EXIT_CODE_TABLE)

app = typer.Typer(
    name="wdiff",
    help=(
        "Diff, pack, ship and apply model checkpoint deltas: bit-exact, verified, streaming.\n\n"
        "wdiff finds what changed between two checkpoint directories (sharded safetensors "
        "plus companion files), packs only that into a small verified bundle, and rebuilds "
        "the new checkpoint bit for bit from the old one."
    ),
    epilog="Exit status (every command):\n\n\b\n" + EXIT_STATUS + "\n\nEnvironment: WDIFF_THREADS (worker threads), WDIFF_CACHE_DIR (manifest cache; none: off), WDIFF_DEBUG=1 (tracebacks), NO_COLOR.",
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80},
    no_args_is_help=True,
    add_completion=False,
)

# -- options shared by every command, defined once -------------------------------------

Json = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success.")]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail (repeatable).")]
Threads = Annotated[
    Optional[int],
    typer.Option("--threads", "-j", min=1, max=256, help="Worker threads [default: all cores, or WDIFF_THREADS]."),
]
Ckpt = Annotated[Path, typer.Argument(metavar="DIR", help="Checkpoint directory.", show_default=False)]
SignKey = Annotated[
    Optional[Path],
    typer.Option("--sign", metavar="KEY", help="Sign with this minisign secret key (see wdiff keygen).", show_default=False),
]
TrustedKeys = Annotated[
    Optional[list[Path]],
    typer.Option("--trusted-key", metavar="KEY.pub", help="Accept only what this public key signed (repeatable; default: WDIFF_TRUSTED_KEYS).", show_default=False),
]
RequireSig = Annotated[bool, typer.Option("--require-signature", help="Refuse anything unsigned (needs a trusted key).")]
Level = Annotated[
    int, typer.Option("--level", "-l", min=1, max=22, help="zstd level (1 is the fastest and, for weights, the smallest).")
]


def _setup(json_mode: bool, quiet: bool, verbose: int) -> o.Out:
    out = o.Out(quiet=quiet, verbose=verbose, json_mode=json_mode)
    STATE.out = out
    return out


def _version(value: bool) -> None:
    if value:
        typer.echo(f"wdiff {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


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
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Show what changed between two checkpoints, tensor by tensor.

    Tensors are matched by name, whatever shard holds them. Unchanged tensors
    are recognised from block digests alone; for modified ones wdiff counts
    changed blocks and elements and, for float types, reports the largest
    absolute change and the L2 norm of the change relative to A's. Companion
    files (config, tokenizer, ...) are compared whole.
    """
    from ..diffing import diff as run_diff

    out = _setup(json_mode, quiet, verbose)
    res = run_diff(a, b, threads=threads, reporter=o.TerminalReporter(out))
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
        line += f"; {t['files_changed']} companion file{'s' if t['files_changed'] != 1 else ''} differ"
    if res.identical:
        line = "identical: " + line
    return line


def _diff_stat(out: o.Out, res) -> None:
    rows = []
    for t in res.tensors:
        if t.status == "unchanged":
            continue
        what = f"{o.pct(t.fraction)} changed" if t.status == "modified" else t.status
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
    level: Level = 1,
    sign: SignKey = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Write a bundle that turns checkpoint A into checkpoint B.

    Unchanged blocks are skipped by digest; changed tensors are encoded element
    by element (positions and the XOR of old and new values), the encoding
    chosen per chunk by density, and compressed with zstd. The bundle records
    the fingerprints of A and B and every digest apply needs to verify its
    work. The same inputs and options always give the same bytes. The file
    appears only when complete.
    """
    from ..packing import pack as run_pack

    out = _setup(json_mode, quiet, verbose)
    if anchor:
        if len(paths) != 1:
            raise UsageError("--anchor takes exactly one checkpoint directory (B)")
        a, b = None, paths[0]
    else:
        if len(paths) != 2:
            raise UsageError("pack takes two checkpoint directories, A and B (or --anchor B)")
        a, b = paths
    res = run_pack(a, b, output, level=level, threads=threads, reporter=o.TerminalReporter(out))
    if sign is not None:
        from ..signing import load_secret, sign_file
        from ..sync import bundle_comment

        sign_file(str(output), load_secret(str(sign)), bundle_comment(res.bundle_id, res.base_fingerprint, res.target_fingerprint))
    if out.json:
        out.document(res.to_json())
        return
    per = f", {res.bytes_per_changed:.2f} bytes per changed element" if res.bytes_per_changed else ""
    out.result(
        f"wrote {o.name(str(output))}: {o.size(res.bundle_bytes)} for a {o.size(res.target_bytes)} checkpoint "
        f"({res.ratio:,.1f}x smaller{per})"
    )
    out.result(f"  {res.tensors_changed} of {res.tensors} tensors changed, {o.count(res.changed_elements)} elements; "
               f"{res.files_stored} files stored whole")
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
    trusted_key: TrustedKeys = None,
    require_signature: RequireSig = False,
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
    or not at all. With --in-place, BASE is updated inside its own directory
    for checkpoints too large to copy: a journal and an undo log make the
    change finish, or roll back with --abort, after any interruption.
    """
    from ..applying import apply as run_apply

    out = _setup(json_mode, quiet, verbose)
    res = run_apply(bundle, base, output, in_place=in_place, abort=abort, trusted_keys=trusted_key,
                    require_signature=require_signature, threads=threads, reporter=o.TerminalReporter(out))
    if out.json:
        out.document(res.to_json())
        return
    if abort:
        out.result(f"rolled back {o.name(res.output)} to the base {res.target_fingerprint.hex()[:16]}")
        return
    how = "updated in place" if res.in_place else "wrote"
    again = " (finished an interrupted apply)" if res.resumed else ""
    out.result(f"{how} {o.name(res.output)}{again}: {res.files} files verified, target {res.target_fingerprint.hex()[:16]}")


# -- push ---------------------------------------------------------------------------------


Remote = Annotated[str, typer.Argument(metavar="REMOTE", help="A directory, file://PATH, hf://ORG/NAME[@REV], hf://datasets/ORG/NAME or hf://buckets/ORG/NAME[/PREFIX].", show_default=False)]


def _size_arg(text: str) -> int:
    try:
        return o.parse_size(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a size (examples: 20GB, 500MB)") from None


@app.command(epilog=epilog("push"))
def push(
    source: Annotated[Path, typer.Argument(metavar="BUNDLE|DIR", help="A bundle file, or a checkpoint directory to pack first.", show_default=False)],
    remote: Remote,
    base: Annotated[Optional[Path], typer.Option("--base", help="Pack DIR against this checkpoint (the remote's head) first.", show_default=False)] = None,
    anchor: Annotated[bool, typer.Option("--anchor", help="Push DIR whole, as an anchor new machines can start from.")] = False,
    label: Annotated[Optional[str], typer.Option("--label", help="A name for the version, such as the training step.", show_default=False)] = None,
    part_size: Annotated[str, typer.Option("--part-size", metavar="SIZE", help="Largest part file stored on the remote.")] = "20GB",
    fork: Annotated[bool, typer.Option("--fork", help="Allow a base that is an older version, not the head.")] = False,
    level: Level = 1,
    sign: SignKey = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Upload a version to a remote and make it the head of its chain.

    The bundle is verified, split into parts no larger than --part-size, and
    stored; then the chain index that lists it is written, so a reader never
    sees a version whose parts are missing. On a Hub repository both happen in
    one commit that fails if anyone else pushed meanwhile. A bundle whose base
    is not the head is refused. Pushing the same bundle again does nothing.
    """
    from ..sync import push as run_push

    out = _setup(json_mode, quiet, verbose)
    res = run_push(source, remote, base=base, anchor=anchor, label=label, part_size=_size_arg(part_size),
                   fork=fork, level=level, sign_key=sign, threads=threads, reporter=o.TerminalReporter(out))
    if out.json:
        out.document(res.to_json())
        return
    what = "anchor" if res.parent is None else f"delta from {res.parent.hex()[:12]}"
    verb = "pushed" if res.uploaded else "already on the remote:"
    lab = f" ({o.name(res.label, 80)})" if res.label else ""
    out.result(f"{verb} {res.version.hex()[:12]}{lab}, {what}: {o.size(res.bytes)} in {res.parts} part"
               f"{'s' if res.parts != 1 else ''} to {o.name(res.remote)}")


# -- pull ---------------------------------------------------------------------------------


@app.command(epilog=epilog("pull"))
def pull(
    remote: Remote,
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Checkpoint directory to update (created if missing).", show_default=False)],
    to: Annotated[Optional[str], typer.Option("--to", metavar="VERSION", help="A fingerprint (or prefix) or label [default: the head].", show_default=False)] = None,
    trusted_key: TrustedKeys = None,
    require_signature: RequireSig = False,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Bring a checkpoint directory to a version of a remote.

    wdiff fingerprints DIR, finds the smallest run of bundles from there to the
    wanted version (or from the nearest anchor when DIR is empty or holds a
    version the remote does not know), downloads and verifies every part
    (resuming after an interruption), squashes the run into one delta and
    applies it in place: no intermediate checkpoint is written. When DIR is
    already at the version nothing is downloaded. Two pulls into one DIR
    never both write: the second exits with status 8.
    """
    from ..sync import pull as run_pull

    out = _setup(json_mode, quiet, verbose)
    res = run_pull(remote, directory, to=to, trusted_keys=trusted_key, require_signature=require_signature,
                   threads=threads, reporter=o.TerminalReporter(out))
    if out.json:
        out.document(res.to_json())
        return
    if res.up_to_date:
        out.result(f"{o.name(res.directory)} is already at {res.after.hex()[:12]}")
        return
    start = "an anchor" if res.from_anchor else res.before.hex()[:12] if res.before else "empty"
    out.result(f"updated {o.name(res.directory)}: {start} -> {res.after.hex()[:12]} with {len(res.bundles)} bundle"
               f"{'s' if len(res.bundles) != 1 else ''}, {o.size(res.downloaded)} downloaded")


# -- log ----------------------------------------------------------------------------------


@app.command(epilog=epilog("log"))
def log(
    remote: Remote,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
) -> None:
    """List the versions on a remote, newest first.

    Each line is one bundle: the version it leads to, the version it starts
    from (or "anchor"), its label, size, parts and creation time. The head is
    marked with an asterisk.
    """
    from ..sync import log as run_log

    out = _setup(json_mode, quiet, verbose)
    res = run_log(remote)
    if out.json:
        out.document(res.to_json())
        return
    if not res.entries:
        out.result(f"{o.name(res.remote)}: no versions yet")
        return
    rows = [["", "version", "from", "label", "size", "parts", "created"]]
    for e in res.entries:
        rows.append([
            "*" if e.version == res.head else "", e.version.hex()[:12],
            "anchor" if e.anchor else e.parent.hex()[:12], o.name(e.label or "", 40),
            o.size(e.size), str(len(e.parts)), e.created,
        ])
    for line in o.table(rows, right={4, 5}):
        out.result(line)


# -- status -------------------------------------------------------------------------------


@app.command(epilog=epilog("status"))
def status(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Checkpoint directory.", show_default=False)],
    remote: Remote,
    to: Annotated[Optional[str], typer.Option("--to", metavar="VERSION", help="Compare with this version [default: the head].", show_default=False)] = None,
    exit_code: Annotated[bool, typer.Option("--exit-code", help="Exit 1 when DIR is not at the version.")] = False,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Say whether a checkpoint directory is at the head of a remote.

    Reports the directory's fingerprint, whether the remote knows it, and how
    many bundles (and bytes) a pull would fetch to reach the head or --to.
    """
    from ..sync import status as run_status

    out = _setup(json_mode, quiet, verbose)
    res = run_status(directory, remote, to=to, threads=threads, reporter=o.TerminalReporter(out))
    if out.json:
        out.document(res.to_json())
    elif res.up_to_date:
        out.result(f"{o.name(res.directory)} is up to date at {res.target.hex()[:12]}")
    elif res.behind < 0:
        out.result(f"{o.name(res.directory)} is at {res.current.hex()[:12]}; the remote cannot rebuild {res.target.hex()[:12]}")
    else:
        how = "from an anchor" if res.from_anchor else f"from {res.current.hex()[:12]}"
        out.result(f"{o.name(res.directory)} is {res.behind} bundle{'s' if res.behind != 1 else ''} behind "
                   f"{res.target.hex()[:12]} ({how}; {o.size(res.download)} to download)")
    if exit_code and not res.up_to_date:
        raise typer.Exit(int(ExitCode.DIFFERENCES))


# -- squash -------------------------------------------------------------------------------


@app.command(epilog=epilog("squash"))
def squash(
    bundles: Annotated[Optional[list[Path]], typer.Argument(metavar="[BUNDLE...]", help="Bundles, each one's base the previous one's target.", show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Bundle file to write (with BUNDLE...).", show_default=False)] = None,
    remote: Annotated[Optional[str], typer.Option("--remote", metavar="REMOTE", help="Squash a run of the remote's chain and add it there.", show_default=False)] = None,
    start: Annotated[Optional[str], typer.Option("--from", metavar="VERSION", help="With --remote: start here [default: nothing, making an anchor].", show_default=False)] = None,
    to: Annotated[Optional[str], typer.Option("--to", metavar="VERSION", help="With --remote: end here [default: the head].", show_default=False)] = None,
    base: Annotated[Optional[Path], typer.Option("--base", help="The checkpoint the run starts from (not needed from an anchor).", show_default=False)] = None,
    level: Level = 1,
    sign: SignKey = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Compose a run of bundles into one, from the first base to the last target.

    XOR deltas compose exactly: the result applies to the first bundle's base
    and rebuilds the last bundle's target bit for bit, checked against its
    digests. A run that starts with an anchor squashes into an anchor, which
    materialises the chain as a plain checkpoint at any version. With
    --remote, the run comes from the remote's chain and the squashed bundle is
    added to it, so a late joiner downloads one bundle instead of many; from
    nothing (the default) this makes a fresh anchor without any local
    checkpoint.
    """
    out = _setup(json_mode, quiet, verbose)
    reporter = o.TerminalReporter(out)
    if remote is not None:
        if bundles or output is not None:
            raise UsageError("give either BUNDLE... -o FILE or --remote, not both")
        from ..sync import squash_remote

        res = squash_remote(remote, start=start, to=to, base=base, sign_key=sign, threads=threads, reporter=reporter)
        if out.json:
            out.document(res.to_json())
            return
        what = "already one bundle" if not res.uploaded else f"added a {o.size(res.bytes)} bundle"
        origin = res.parent.hex()[:12] if res.parent else "nothing"
        out.result(f"{o.name(res.remote)}: {origin} -> {res.version.hex()[:12]}: {what}")
        return
    if not bundles or output is None:
        raise UsageError("squash takes BUNDLE... -o FILE, or --remote REMOTE")
    if start is not None or to is not None:
        raise UsageError("--from and --to go with --remote")
    from ..compose import squash as run_squash

    res = run_squash(bundles, base, output, level=level, threads=threads, reporter=reporter)
    if sign is not None:
        from ..signing import load_secret, sign_file
        from ..sync import bundle_comment

        sign_file(str(output), load_secret(str(sign)), bundle_comment(res.bundle_id, res.base_fingerprint, res.target_fingerprint))
    if out.json:
        out.document(res.to_json())
        return
    out.result(f"wrote {o.name(str(output))}: {len(bundles)} bundles as one, {o.size(res.bundle_bytes)} "
               f"({res.target_fingerprint.hex()[:12]} from {res.base_fingerprint.hex()[:12] if res.base_fingerprint else 'nothing'})")


# -- verify -------------------------------------------------------------------------------


@app.command(epilog=epilog("verify"))
def verify(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Checkpoint directory to check.", show_default=False)],
    bundle: Annotated[Optional[Path], typer.Option("--bundle", help="Check DIR against this bundle's target.", show_default=False)] = None,
    remote: Annotated[Optional[str], typer.Option("--remote", metavar="REMOTE", help="Check DIR against a version of this remote.", show_default=False)] = None,
    to: Annotated[Optional[str], typer.Option("--to", metavar="VERSION", help="With --remote: the version [default: the head].", show_default=False)] = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Check a checkpoint directory against what wdiff recorded for it.

    Reads every byte of DIR (the manifest cache is not trusted here) and
    compares it, file by file and tensor by tensor, with the target of a
    bundle or a version on a remote. Names what differs, is missing, or
    should not be there.
    """
    from ..errors import IntegrityError
    from ..verifying import verify as run_verify

    out = _setup(json_mode, quiet, verbose)
    res = run_verify(directory, bundle=bundle, remote=remote, version=to, threads=threads,
                     reporter=o.TerminalReporter(out))
    if out.json:
        out.document(res.to_json())
        if not res.ok:
            raise typer.Exit(int(ExitCode.INTEGRITY))
        return
    if res.ok:
        out.result(f"{o.name(str(directory))} is intact: {res.actual.hex()[:16]}, as {o.name(res.source)} records")
        return
    for p in res.problems[:50]:
        what = f"tensor {o.name(p.tensor, 80)} differs" if p.tensor else p.what
        out.warn(f"{o.name(p.path)}: {what}")
    raise IntegrityError(
        f"{directory}: {len(res.problems)} problem(s); fingerprint {res.actual.hex()[:16]}, expected {res.expected.hex()[:16]}"
    )


# -- keygen and sign -----------------------------------------------------------------------


@app.command(epilog=epilog("keygen"))
def keygen(
    key: Annotated[Path, typer.Argument(metavar="KEY", help="Secret key file to create; the public key goes to KEY.pub.", show_default=False)],
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
) -> None:
    """Make an Ed25519 key pair for signing bundles and chains.

    The files are in minisign's formats: KEY.pub checks signatures with
    `minisign -V` as well as with wdiff, and a key made by `minisign -G -W`
    signs with wdiff. The secret key is unencrypted (mode 0600), for
    unattended pushes; keep it as you would any credential.
    """
    from ..signing import generate

    out = _setup(json_mode, quiet, verbose)
    pub = generate(str(key))
    if out.json:
        out.document({"schema": "wdiff.keygen/1", "secret_key": str(key), "public_key": f"{key}.pub", "key_id": pub.id_hex})
        return
    out.result(f"wrote {o.name(str(key))} (secret) and {o.name(str(key))}.pub (public), key id {pub.id_hex}")


@app.command(epilog=epilog("sign"))
def sign(
    bundle: Annotated[Path, typer.Argument(metavar="BUNDLE", help="Bundle file to sign.", show_default=False)],
    key: Annotated[Path, typer.Option("--key", metavar="KEY", help="Minisign secret key.", show_default=False)],
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
) -> None:
    """Sign a bundle: write BUNDLE.minisig.

    The bundle is checked first; the signature covers its bytes (BLAKE2b-512,
    minisign's prehashed mode) and its trusted comment names the bundle, its
    base and its target. `wdiff apply --trusted-key KEY.pub` and
    `minisign -Vm BUNDLE -p KEY.pub` both check it.
    """
    from ..bundle import BundleReader
    from ..signing import load_secret, sign_file
    from ..sync import _verify_records, bundle_comment

    out = _setup(json_mode, quiet, verbose)
    secret = load_secret(str(key))
    with BundleReader(bundle) as r:
        _verify_records(r, o.TerminalReporter(out))
        comment = bundle_comment(r.id, r.index.base_fingerprint, r.index.target_fingerprint)
    sig = sign_file(str(bundle), secret, comment)
    if out.json:
        out.document({"schema": "wdiff.sign/1", "bundle": str(bundle), "signature": sig, "key_id": secret.public_key.id_hex})
        return
    out.result(f"wrote {o.name(sig)} (key {secret.public_key.id_hex})")


# -- info --------------------------------------------------------------------------------


@app.command(epilog=epilog("info"))
def info(
    bundle: Annotated[Path, typer.Argument(metavar="BUNDLE", help="Bundle file.", show_default=False)],
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
) -> None:
    """Describe a bundle and check every digest in it.

    Reads the whole bundle, verifies the digest of every record, and prints
    what it holds: base and target fingerprints, target files, and the
    encodings used, with their sizes.
    """
    from ..inspecting import inspect as run_inspect

    out = _setup(json_mode, quiet, verbose)
    res = run_inspect(bundle)
    if out.json:
        out.document(res.to_json())
        return
    base = res.base_fingerprint.hex() if res.base_fingerprint else "none (anchor: builds from nothing)"
    out.result(f"bundle   {o.name(str(bundle))}  ({o.size(res.bundle_bytes)}, format {res.version}, {o.name(res.writer, 80)})")
    out.result(f"id       {res.bundle_id.hex()}")
    out.result(f"base     {base}")
    out.result(f"target   {res.target_fingerprint.hex()}  ({len(res.files)} files, {o.size(res.target_bytes)})")
    rows = [["records", "kind", "bytes", "changed elements"]]
    for kind, c in res.records.items():
        rows.append([o.count(c["records"]), kind, o.size(c["bytes"]), o.count(c["changed"]) if c["changed"] else ""])
    for line in o.table(rows, right={0, 2, 3}):
        out.result("  " + line)
    if out.verbose:
        for f in res.files:
            out.result(f"  {f['source']:<6} {f['kind']:<11} {o.size(f['size']):>10}  {o.name(f['path'])}")
    out.result("all digests verified")


# -- demo --------------------------------------------------------------------------------


@app.command(epilog=epilog("demo"))
def demo(
    directory: Annotated[
        Optional[Path], typer.Argument(metavar="[DIR]", help="Work here and keep the files (default: a temporary directory).", show_default=False)
    ] = None,
    size_mb: Annotated[int, typer.Option("--size-mb", min=1, max=4096, help="Size of the sample checkpoint in MB.")] = 8,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Run the whole job on built-in sample data and verify every result.

    Makes a small bf16 checkpoint in two shards with companion files, and a
    second version as one RL step makes it: about 1% of elements changed at
    random, one frozen tensor, one tensor added. Then diffs them, packs the
    delta, pushes an anchor and the delta to a local directory remote, pulls
    into an empty directory, applies the delta to the base, checks both
    results byte for byte, and prints sizes and the compression ratio.
    """
    from ..demo import run_demo

    out = _setup(json_mode, quiet, verbose)
    res = run_demo(directory, size_mb=size_mb, threads=threads, log=None if out.json else out.result)
    if out.json:
        out.document(res)


# -- generate (for maintainers; hidden) ------------------------------------------------------


@app.command(hidden=True)
def generate(
    root: Annotated[Path, typer.Argument(metavar="[ROOT]", help="Project root.", show_default=False)] = Path("."),
    check: Annotated[bool, typer.Option("--check", help="Only report files that would change; exit 1 if any.")] = False,
) -> None:
    """Write the man pages and shell completions generated from this command line."""
    from .generate import check as run_check
    from .generate import write

    if check:
        drift = run_check(str(root))
        for rel in drift:
            typer.echo(f"out of date: {rel}")
        if drift:
            raise typer.Exit(int(ExitCode.DIFFERENCES))
        return
    for rel in write(str(root)):
        typer.echo(f"wrote {rel}")
