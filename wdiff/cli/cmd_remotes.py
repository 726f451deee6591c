"""Commands on remotes: push, pull, log, status, squash."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..defaults import DEFAULT_LEVEL, DEFAULT_PART_SIZE
from ..errors import ExitCode, UsageError
from . import argkinds, interrupts
from . import output as o
from .common import (
    Exclude,
    Include,
    Json,
    Level,
    MaxAge,
    Quiet,
    Remote,
    RequireSig,
    SignKey,
    Threads,
    TrustedKeys,
    Verbose,
    _age_arg,
    _setup,
    _size_arg,
    app,
    call,
)
from .help import epilog

# -- push ---------------------------------------------------------------------------------

HubToken = Annotated[Optional[str], typer.Option("--token", metavar="TOKEN", help="Hugging Face token for a Hub remote [default: HF_TOKEN, or the stored `hf auth login`]; prefer HF_TOKEN, which no process listing shows.", show_default=False)]


@app.command(epilog=epilog("push"))
def push(
    source: Annotated[Path, typer.Argument(metavar="BUNDLE|DIR", help="A bundle file, or a checkpoint directory to pack first.", show_default=False)],
    remote: Remote,
    base: Annotated[Optional[Path], typer.Option("--base", help="Pack DIR against this checkpoint (the remote's head) first.", show_default=False)] = None,
    anchor: Annotated[bool, typer.Option("--anchor", help="Push DIR whole, as an anchor new machines can start from.")] = False,
    label: Annotated[Optional[str], typer.Option("--label", help="A name for the version, such as the training step.", show_default=False)] = None,
    part_size: Annotated[str, typer.Option("--part-size", metavar="SIZE", help="Largest part file stored on the remote.")] = f"{DEFAULT_PART_SIZE // 1000**3}GB",
    fork: Annotated[bool, typer.Option("--fork", help="Allow a base that is an older version, not the head.")] = False,
    level: Level = DEFAULT_LEVEL,
    sign_key: SignKey = None,
    public: Annotated[bool, typer.Option("--public", help="A Hub repository or bucket this push creates is public [default: private].")] = False,
    commit_message: Annotated[Optional[str], typer.Option("--commit-message", metavar="TEXT", help="Message of the Hub commit [default: wdiff push VERSION (LABEL)].", show_default=False)] = None,
    token: HubToken = None,
    adopt: Annotated[bool, typer.Option("--adopt", help="With --sign: sign a remote whose chain is not signed yet (after checking it).")] = False,
    allow_opaque: Annotated[bool, typer.Option("--allow-opaque", help="Push DIR even if a loader could not open it (a safetensors file that does not parse, an index that does not match).")] = False,
    anchor_every: Annotated[Optional[int], typer.Option("--anchor-every", metavar="N", help="With --base: also publish DIR whole as an anchor every N pushes (counting from the newest anchor).", show_default=False)] = None,
    anchor_when: Annotated[Optional[float], typer.Option("--anchor-when", metavar="FRACTION", help="With --base: also publish an anchor when catching up from the newest anchor would cost more than FRACTION of its size.", show_default=False)] = None,
    stage: Annotated[Optional[str], typer.Option("--stage", metavar="NAME", help="Store a part of a version (the files --only names) under the remote's stage NAME, not yet visible; `wdiff commit` publishes the parts as one version.", show_default=False)] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar="PATTERN", help="With --stage: the files this writer holds (a pattern as in .wdiffignore; repeatable).", show_default=False)] = None,
    exclude: Exclude = None,
    include: Include = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Upload a version to a remote and make it the head of its chain.

    The bundle is verified, split into parts no larger than --part-size, and
    stored; then the chain index that lists it is written, so a reader never
    sees a version whose parts are missing. On a Hub repository the parts go
    in one commit and the chain, naming that commit, in the next; either fails
    if anyone else pushed meanwhile. A bundle whose base is not the head is
    refused. Pushing the same bundle again does nothing.

    A first push to the Hub creates the repository, private unless --public
    (and says so), with a model card (README.md) that says how to pull it,
    unless the repository has one already. hf://ORG/NAME@BRANCH creates the
    branch from the default branch when it does not exist, and
    hf://ORG/NAME@BRANCH/FOLDER keeps the chain in FOLDER instead of wdiff/.

    --anchor-every N and --anchor-when FRACTION keep the chain cheap for new
    machines: when either says so, DIR is also packed whole and that anchor
    is published with the delta, in the same chain write (pullers that are
    one version behind still download the delta).

    Many writers, one version: each host runs push DIR REMOTE --base PREV
    --only PATTERN --stage NAME [--sign KEY] for the files it holds, then one
    host runs wdiff commit REMOTE --stage NAME --expect N. A writer packs its
    files against the files of PREV they need (the same paths, and any file
    of PREV holding the old bytes of a tensor that moved between shards);
    --sign signs the part, which a commit that signs or has trusted keys
    requires.
    """
    options = dict(locals())
    from ..sync.push import push as run_push

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_push(source, remote, base)
    interrupts.arm(interrupts.remote_write, remote, what="the push adds its version")
    if stage is not None or only:
        if stage is None or anchor or fork or label or anchor_every or anchor_when or exclude or include:
            raise UsageError("--only goes with --stage; a staged part takes DIR, --base, --only and --sign only "
                             "(label the version at wdiff commit; --only names its files)")
        from ..sync.stage import push_part

        # (a staged part's version is labelled, published and signed by the commit)
        interrupts.arm(interrupts.staged, remote, stage)
        part = call(push_part, options, cli=_NOT_STAGED, only=only or [], reporter=out.reporter())
        if out.json:
            out.document(part.to_json())
            return
        out.result(f"staged {o.size(part.bytes)} ({part.files} file{'s' if part.files != 1 else ''}) in stage "
                   f"{o.name(part.stage)} of {o.name(part.remote)}{', signed' if part.signed else ''}: "
                   "not visible until `wdiff commit`")
        return
    res = call(run_push, options, cli=("public", "stage", "only"), part_size=_size_arg(part_size), private=not public,
               reporter=out.reporter())
    if out.json:
        out.document(res.to_json())
        return
    what = "anchor" if res.parent is None else f"delta from {res.parent.hex()[:12]}"
    verb = "pushed" if res.uploaded else "already on the remote:"
    lab = f" ({o.name(res.label, 80)})" if res.label else ""
    out.result(f"{verb} {res.version.hex()[:12]}{lab}, {what}: {o.size(res.bytes)} in {res.parts} part"
               f"{'s' if res.parts != 1 else ''} to {o.name(res.remote)}"
               + (f", with an anchor ({res.anchored.hex()[:12]})" if res.anchored else ""))


#: options of push that a staged part (push --stage) does not take
_NOT_STAGED = ("anchor", "label", "part_size", "fork", "public", "commit_message", "adopt", "allow_opaque",
               "anchor_every", "anchor_when", "exclude", "include")


# -- pull ---------------------------------------------------------------------------------


@app.command(epilog=epilog("pull"))
def pull(
    remote: Remote,
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Checkpoint directory to update (created if missing).", show_default=False)],
    to: Annotated[Optional[str], typer.Option("--to", metavar="VERSION", help="A fingerprint (or prefix), a label, or HEAD~N (N pushes before the head) [default: the head].", show_default=False)] = None,
    trusted_keys: TrustedKeys = None,
    require_signature: RequireSig = False,
    token: HubToken = None,
    max_age: MaxAge = None,
    force: Annotated[bool, typer.Option("--force", help="Discard local changes to the checkpoint's own files (restored from the remote); files that are not part of it are kept. A DIR with no record, at a version the remote does not know, is replaced (its .git/ and .cache/ are kept).")] = False,
    atomic: Annotated[bool, typer.Option("--atomic", help="DIR is a symbolic link: build the new version beside its target, then switch the link to it in one rename.")] = False,
    keep: Annotated[Optional[int], typer.Option("--keep", metavar="N", min=0, help="With --atomic: how many version directories that --atomic made for this link stay beside it, counting the one it points to; the oldest beyond N are removed after the switch. 0 keeps all. [default: 2]", show_default=False)] = None,
    layout: Annotated[str, typer.Option("--layout", metavar="LAYOUT", help="wdiff: REMOTE is a wdiff remote. hf-delta: REMOTE (a directory or an object store) holds weight_vNNNNNN/ folders of the delta layout slime writes; --to names one (4, 000004), each delta is checked against its checksums and base_version (see the hf-delta guide).")] = "wdiff",
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Bring a checkpoint directory to a version of a remote.

    wdiff fingerprints DIR, finds the smallest run of bundles from there to the
    wanted version (or from the nearest anchor when DIR is empty or holds a
    version the remote does not know), downloads and verifies every part
    (resuming after an interruption from the bytes it had), squashes the run into one delta and
    applies it in place: no intermediate checkpoint is written. When DIR is
    already at the version nothing is downloaded. Two pulls into one DIR
    never both write: the second exits with status 8.

    DIR keeps a record (DIR/.wdiff/state.json) of the version it was brought
    to. Files that version does not have (notes, eval results, .git/,
    .cache/) are untracked: kept and never read. A file of that version that
    was changed here makes the pull refuse (status 5) and name it; --force
    restores it, from the deltas when they carry it, else from an anchor. A
    DIR with no record at a version the remote does not know is refused too
    (status 5), and replaced with --force. A
    symbolic link DIR is followed and its target updated; with --atomic the
    new version is built beside the target and the link switched to it.
    Then the oldest version directories that --atomic made for this link
    are removed beyond --keep N (default 2: the one the link points to and
    the one before it, for a rollback; 0 keeps all); a directory it did not
    make (the one the link first pointed to, one you renamed) or one
    holding files you added or changed is never removed.

    -v says where DIR stands, the plan (which bundles, their sizes, from
    where), the disk it needs and has, and where the time went; -vv each
    part too (on stderr: stdout keeps the result). Interrupted (Ctrl-C), a
    pull says what it kept: the same command resumes its downloads, or
    finishes the update it had begun in DIR.
    """
    options = dict(locals())
    out = _setup(json_mode, quiet, verbose)
    if layout == "hf-delta":
        if trusted_keys or require_signature or max_age or atomic or keep is not None:
            raise UsageError("--layout hf-delta takes --to, --force and --token: the layout has no signatures, "
                             "and --atomic is for wdiff remotes")
        from ..interop.hfdelta.pull import pull_hfdelta
        from .cmd_interop import render_hfpull

        render_hfpull(out, pull_hfdelta(remote, directory, to=to, force=force, token=token, threads=threads,
                                        reporter=out.reporter()))
        return
    if layout != "wdiff":
        raise UsageError(f"no layout {layout!r} (pull reads: wdiff, hf-delta)")
    from ..sync.pull import pull as run_pull

    argkinds.check_pull(remote, directory)
    interrupts.arm(interrupts.pull, remote, directory, atomic=atomic)
    reporter = out.reporter(timings=True)
    with argkinds.versions_of(remote):
        res = call(run_pull, options, cli=("layout",), max_age=_age_arg(max_age), reporter=reporter)
    reporter.summary()
    if out.json:
        out.document(res.to_json())
        return
    for path in res.restored:
        out.warn(f"discarded the local changes to {o.name(path)}")
    shown = o.name(str(directory))  # as given, as status names it (res.directory is absolute)
    v = res.labels
    if res.finished:
        what = "rollback" if res.finished == "rollback" else "apply"
        done = "" if res.bundles else f": {shown} is at {o.version(res.after, v)}"
        out.result(f"finished the interrupted {what}{done}")
    if res.link and not res.up_to_date:
        out.result(f"switched {shown} to {o.name(res.directory)}: "
                   f"{o.version(res.before, v, none='an anchor')} -> {o.version(res.after, v)} with "
                   f"{len(res.bundles)} bundle{'s' if len(res.bundles) != 1 else ''}, {o.size(res.downloaded)} downloaded")
    elif res.up_to_date:
        out.result(f"{shown} is already at {o.version(res.after, v)}")
    for path in res.removed:  # --atomic: beyond --keep
        out.result(f"removed the old version {o.name(path)}")
    if res.link or res.up_to_date or not res.bundles:
        return
    start = "an anchor" if res.from_anchor else o.version(res.before, v, none="empty")
    how = "undoing" if res.stepped_back else "with"
    out.result(f"updated {shown}: {start} -> {o.version(res.after, v)} {how} {len(res.bundles)} bundle"
               f"{'s' if len(res.bundles) != 1 else ''}, {o.size(res.downloaded)} downloaded")


# -- log ----------------------------------------------------------------------------------


@app.command(epilog=epilog("log"))
def log(
    remote: Remote,
    trusted_keys: TrustedKeys = None,
    require_signature: RequireSig = False,
    max_age: MaxAge = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
) -> None:
    """List the versions on a remote, newest first.

    Each line is one bundle: the version it leads to, the version it starts
    from (or "anchor"), its label, size, parts and creation time. The head is
    marked with an asterisk.
    """
    options = dict(locals())
    from ..sync.history import log as run_log

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_remote("log", remote)
    interrupts.arm(interrupts.read_only)
    res = call(run_log, options, max_age=_age_arg(max_age), reporter=out.reporter())
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
    trusted_keys: TrustedKeys = None,
    require_signature: RequireSig = False,
    max_age: MaxAge = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Say whether a checkpoint directory is at the head of a remote.

    Reports the directory's fingerprint, whether the remote knows it, and how
    many bundles (and bytes) a pull would fetch to reach the head or --to; a
    directory at a later version than --to is reported as ahead of it, and
    one that does not exist as such (with what a pull would fetch to create it).
    """
    options = dict(locals())
    from ..sync.history import status as run_status

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_status(directory, remote)
    interrupts.arm(interrupts.read_only)
    with argkinds.versions_of(remote):
        res = call(run_status, options, cli=("exit_code",), max_age=_age_arg(max_age), reporter=out.reporter())
    v = res.labels
    cur, tgt = o.version(res.current, v), o.version(res.target, v)
    if out.json:
        out.document(res.to_json())
    elif res.up_to_date:
        out.result(f"{o.name(res.directory)} is up to date at {tgt}")
    elif res.changed:
        n = len(res.changed)
        names = ", ".join(o.name(p) for p in res.changed[:5]) + (f" and {n - 5} more" if n > 5 else "")
        where = "the target" if res.current == res.target else f"behind {tgt}"
        how = " from an anchor" if res.from_anchor else ""
        out.result(f"{o.name(res.directory)} is at {cur}, {where}, with local changes to "
                   f"{n} file{'s' if n != 1 else ''}: {names}; `wdiff pull` refuses to discard them "
                   f"(--force restores them{how}; {o.size(res.download)} to download)")
    elif not res.exists:
        out.result(f"{o.name(res.directory)} does not exist; `wdiff pull` would create it at {tgt} "
                   f"from an anchor ({res.behind} bundle{'s' if res.behind != 1 else ''}, {o.size(res.download)} to download)")
    elif res.ahead:
        back = f"a pull back there fetches {o.size(res.download)}" + (" (from an anchor)" if res.from_anchor else "")
        out.result(f"{o.name(res.directory)} is {res.ahead} version{'s' if res.ahead != 1 else ''} ahead of "
                   f"{tgt}, at {cur} ({back})")
    elif res.behind < 0:
        out.result(f"{o.name(res.directory)} is at {cur}; the remote cannot rebuild {tgt}")
    elif not res.known:
        out.result(f"{o.name(res.directory)} holds a version the remote does not know ({cur}); "
                   f"`wdiff pull` refuses to replace it, --force rebuilds it at {tgt} from an anchor "
                   f"({res.behind} bundle{'s' if res.behind != 1 else ''}, {o.size(res.download)} to download)")
    else:
        how = "from an anchor" if res.from_anchor else f"from {cur}"
        out.result(f"{o.name(res.directory)} is {res.behind} bundle{'s' if res.behind != 1 else ''} behind "
                   f"{tgt}: {how}, {o.size(res.download)} to download")
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
    overwrite: Annotated[bool, typer.Option("--force", "-f", help="Replace the bundle file (-o) if it exists.")] = False,
    level: Level = DEFAULT_LEVEL,
    sign_key: SignKey = None,
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
    options = dict(locals())
    out = _setup(json_mode, quiet, verbose)
    reporter = out.reporter()
    if remote is not None:
        if bundles or output is not None:
            raise UsageError("give either BUNDLE... -o FILE or --remote, not both")
        from ..sync.push import squash_remote

        # (--level: a squash on the remote writes at the default level)
        argkinds.check_remote("squash --remote", remote)
        argkinds.check_squash((), base)
        interrupts.arm(interrupts.remote_write, remote, what="the squash adds its bundle")
        with argkinds.versions_of(remote):
            res = call(squash_remote, options, cli=("bundles", "output", "overwrite", "level"), reporter=reporter)
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
    from ..ops.squash import squash as run_squash

    argkinds.check_squash(bundles, base)
    interrupts.arm(interrupts.written, output)

    res = call(run_squash, options, cli=("output", "remote", "start", "to", "sign_key"), out=output, reporter=reporter)
    if sign_key is not None:
        from ..ops.signing import sign_bundle

        sign_bundle(output, sign_key, verify=False)  # just written and verified
    if out.json:
        out.document(res.to_json())
        return
    out.result(f"wrote {o.name(str(output))}: {len(bundles)} bundles as one, {o.size(res.bundle_bytes)} "
               f"({res.target_fingerprint.hex()[:12]} from {res.base_fingerprint.hex()[:12] if res.base_fingerprint else 'nothing'})")


# -- gc -----------------------------------------------------------------------------------


def _grace_arg(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0s", "0m", "0h", "0d") else _age_arg(text)


@app.command(epilog=epilog("gc"))
def gc(
    remote: Remote,
    keep_last: Annotated[int, typer.Option("--keep-last", metavar="N", help="Keep the N newest versions (in push order); the head is always kept.", show_default=False)],
    keep: Annotated[Optional[list[str]], typer.Option("--keep", metavar="VERSION", help="Also keep this version: a label, a fingerprint (or prefix) or HEAD~N (repeatable).", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", "-n", help="Say what would go and how many bytes it frees; change nothing.")] = False,
    grace: Annotated[str, typer.Option("--grace", metavar="AGE", help="Delete an unreferenced object only once an earlier gc listed it this long ago (0: at once, only when no pull is running).")] = "24h",
    sign_key: SignKey = None,
    token: HubToken = None,
    work: Annotated[Optional[Path], typer.Option("--work", metavar="DIR", help="Where a kept checkpoint is rebuilt when a new delta must be squashed from it [default: a temporary directory].", show_default=False)] = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Remove the versions a remote no longer needs to keep, and their objects.

    Keeps the newest --keep-last N versions, every --keep VERSION and the
    head. First every kept version is made reachable without the others: a
    kept version whose only way from an anchor runs through removed versions
    gets a squashed bundle (an anchor for the oldest kept version, a delta from
    the kept version before it for the others). Then, in two phases as
    restic's prune does: phase 1 publishes a chain index without the removed
    entries (one conditional write; status 8 if the chain moved meanwhile),
    which lists every object it no longer names as garbage, with the time it
    was found; phase 2 deletes only the garbage that a gc listed at least
    --grace ago (default 24h). A pull that read the old chain therefore never
    finds its objects gone within the grace period; a later gc frees them.
    A signed chain is re-signed with --sign KEY, and refused without it. On a
    Hub repository the deletion is a commit: the bytes stay in the git history
    until the history is squashed.
    """
    options = dict(locals())
    from ..sync.gc import gc as run_gc

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_remote("gc", remote, f" --keep-last {keep_last}")
    interrupts.arm(interrupts.gc, remote)
    with argkinds.versions_of(remote):
        res = call(run_gc, options, grace=_grace_arg(grace), reporter=out.reporter())
    if out.json:
        out.document(res.to_json())
        return
    dry = res.dry_run
    for b in res.bridges:
        what = f"an anchor of {b.version.hex()[:12]}" if b.start is None else \
            f"a delta {b.start.hex()[:12]} -> {b.version.hex()[:12]}"
        size = f" ({o.size(b.bytes)})" if b.bytes is not None else ""
        out.result(f"{'would squash' if dry else 'squashed'} {b.bundles} bundle{'s' if b.bundles != 1 else ''} into "
                   f"{what}{size}, to keep it reachable")
    dropped = sum(e.size for e in res.dropped)
    pend = sum(s for _, s in res.pending)
    n = len(res.dropped)
    out.result(f"{o.name(res.remote)}: {'would keep' if dry else 'kept'} {len(res.kept)} version"
               f"{'s' if len(res.kept) != 1 else ''}, {'would drop' if dry else 'dropped'} {n} bundle"
               f"{'s' if n != 1 else ''} ({o.size(dropped)}); {'would delete' if dry else 'deleted'} "
               f"{len(res.deleted)} object{'s' if len(res.deleted) != 1 else ''} ({o.size(res.freed)} freed)")
    if res.pending:
        out.result(f"{len(res.pending)} unreferenced object{'s' if len(res.pending) != 1 else ''} ({o.size(pend)}) "
                   f"{'would wait' if dry else 'wait'} for a gc after the grace period ({grace})")


# -- commit -------------------------------------------------------------------------------


@app.command(epilog=epilog("commit"))
def commit(
    remote: Remote,
    stage: Annotated[str, typer.Option("--stage", metavar="NAME", help="The stage the writers pushed their parts to.", show_default=False)],
    expect: Annotated[int, typer.Option("--expect", metavar="N", help="How many parts make the version (one per writer).", show_default=False)],
    label: Annotated[Optional[str], typer.Option("--label", help="A name for the version, such as the training step.", show_default=False)] = None,
    sign_key: SignKey = None,
    trusted_keys: Annotated[Optional[list[Path]], typer.Option("--trusted-key", metavar="KEY.pub", help="Accept only parts this public key signed (repeatable; default: WDIFF_TRUSTED_KEYS; with --sign, KEY's own parts too).", show_default=False)] = None,
    token: HubToken = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Publish the parts staged by many writers as one version.

    With --sign KEY or a trusted key (--trusted-key, WDIFF_TRUSTED_KEYS),
    every part must be signed by a trusted key (the writers' push --stage
    --sign) or by KEY itself; an unsigned or untrusted part exits with status
    4 and nothing is published, so a part planted in the stage is never
    signed by the commit. Checks that every part is of this remote and this
    stage, that no file is in two parts (status 5, whichever is newer), that
    the stage holds exactly --expect parts, that their bases together are
    exactly the remote's head and that every part is intact; then merges
    them into one bundle, byte for byte the one a single host holding every
    file would push, and pushes it as the new head with one conditional
    chain write, so a reader sees the whole version or none of it. The stage
    is deleted afterwards. A missing part (a writer that died) exits with
    status 3 and changes nothing: rerun the writer, then commit again.
    """
    options = dict(locals())
    from ..sync.stage import commit as run_commit

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_remote("commit", remote, f" --stage {argkinds.q(stage)} --expect {expect}")
    interrupts.arm(interrupts.commit, remote, stage)
    res = call(run_commit, options, reporter=out.reporter())
    if out.json:
        out.document(res.to_json())
        return
    p = res.push
    verb = "committed" if p.uploaded else "already on the remote:"
    lab = f" ({o.name(p.label, 80)})" if p.label else ""
    out.result(f"{verb} {p.version.hex()[:12]}{lab} from {res.parts} part{'s' if res.parts != 1 else ''}: "
               f"{o.size(p.bytes)} to {o.name(p.remote)}")
