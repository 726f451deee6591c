"""verify, keygen, sign, info, demo, man, completion, and the maintainers' generate."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import ExitCode
from . import argkinds, interrupts
from . import output as o
from .common import (
    Json,
    Quiet,
    Threads,
    Verbose,
    _setup,
    app,
    call,
)
from .help import epilog

# -- verify -------------------------------------------------------------------------------


@app.command(epilog=epilog("verify"))
def verify(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Checkpoint directory to check.", show_default=False)],
    bundle: Annotated[Optional[Path], typer.Option("--bundle", help="Check DIR against this bundle's target.", show_default=False)] = None,
    remote: Annotated[Optional[str], typer.Option("--remote", metavar="REMOTE", help="Check DIR against a version of this remote.", show_default=False)] = None,
    version: Annotated[Optional[str], typer.Option("--to", metavar="VERSION", help="With --remote: the version [default: the head].", show_default=False)] = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Check a checkpoint directory against what wdiff recorded for it.

    Reads every byte of DIR (the manifest cache is not trusted here) and
    compares it, file by file and tensor by tensor, with the target of a
    bundle or a version on a remote. Names what differs, is missing, or
    should not be there. With neither --bundle nor --remote, DIR is checked
    file by file against its own record (DIR/.wdiff/state.json, which the
    last pull or in-place apply left: the version and each file's digest);
    files the record does not list are not the checkpoint's, and are not
    read.
    """
    options = dict(locals())
    from ..errors import IntegrityError
    from ..sync.verify import verify as run_verify

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_verify(directory, bundle, remote)
    interrupts.arm(interrupts.read_only)
    with argkinds.versions_of(remote or "REMOTE"):
        res = call(run_verify, options, reporter=out.reporter())
    if res.ok:
        if out.json:
            out.document(res.to_json())
        else:
            out.result(f"{o.name(str(directory))} is intact: {res.actual.hex()[:16]}, as {o.name(res.source)} records")
        return
    if not out.json:
        for p in res.problems[:50]:
            what = f"tensor {o.name(p.tensor, 80)} differs" if p.tensor else p.what
            out.warn(f"{o.name(p.path)}: {what}")
    # a failure like any other: a message on stderr and, under --json, one
    # wdiff.error/1 document, with verify's own document as its details
    raise IntegrityError(
        f"{directory}: {len(res.problems)} problem(s); fingerprint {res.actual.hex()[:16]}, expected {res.expected.hex()[:16]}",
        hint=(f"`wdiff pull REMOTE {o.name(str(directory))} --force` restores the checkpoint's files from the remote "
              f"it came from; `wdiff status {o.name(str(directory))} REMOTE` says what that downloads")
        if bundle is None and remote is None else None,
        details=res.to_json(),
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
    from ..format.signature import generate

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
    from ..format.signature import load_secret
    from ..ops.signing import sign_bundle

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_bundle("sign", bundle)
    secret = load_secret(str(key))
    sig = sign_bundle(bundle, secret, reporter=out.reporter(), key_path=key)
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
    options = dict(locals())
    from ..ops.inspect import inspect as run_inspect

    out = _setup(json_mode, quiet, verbose)
    argkinds.check_bundle("info", bundle)
    interrupts.arm(interrupts.read_only)
    res = call(run_inspect, options)
    if out.json:
        out.document(res.to_json())
        return
    base = res.base_fingerprint.hex() if res.base_fingerprint else "none (anchor: builds from nothing)"
    out.result(f"bundle   {o.name(str(bundle))}  ({o.size(res.bundle_bytes)}, format {res.version}, {o.name(res.writer, 80)})")
    out.result(f"id       {res.bundle_id.hex()}")
    out.result(f"base     {base}")
    out.result(f"target   {res.target_fingerprint.hex()}  ({o.count(len(res.files))} file{'' if len(res.files) == 1 else 's'}, {o.size(res.target_bytes)})")
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
    from ..sync.demo import run_demo

    out = _setup(json_mode, quiet, verbose)
    res = run_demo(directory, size_mb=size_mb, threads=threads, log=None if out.json else out.result)
    if out.json:
        out.document(res)


# -- man and completion ---------------------------------------------------------------------


@app.command(epilog=epilog("man"))
def man(
    ctx: typer.Context,
    command: Annotated[
        Optional[str], typer.Argument(metavar="[COMMAND]", help="A command, or format for the bundle format [default: wdiff itself].", show_default=False)
    ] = None,
) -> None:
    """Show a man page: wdiff's own, a command's, or the bundle format's.

    Prints the page's roff source, the same text as the files under man/ in
    the source tree, so it can be redirected into a man directory. When
    standard output is a terminal and man(1) is installed, the page is shown
    with `man -l` instead.
    """
    from .generate import page

    text = page(ctx.find_root().command, command)
    if sys.stdout.isatty() and shutil.which("man"):
        name = f"wdiff-{command}" if command else "wdiff"
        with tempfile.TemporaryDirectory(prefix="wdiff-man-") as tmp:
            path = os.path.join(tmp, name + (".5" if command == "format" else ".1"))
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            sys.stdout.flush()
            if subprocess.run(["man", "-l", path]).returncode == 0:
                return
    sys.stdout.write(text)


@app.command(epilog=epilog("completion"))
def completion(
    ctx: typer.Context,
    shell: Annotated[str, typer.Argument(metavar="SHELL", help="bash, zsh or fish.", show_default=False)],
) -> None:
    """Print the shell completion script for bash, zsh or fish.

    The scripts are static: pressing TAB runs no Python. Load one for the
    running shell, or install it where the shell looks for completions.
    """
    from .generate import completion as script

    sys.stdout.write(script(ctx.find_root().command, shell))


# -- generate (for maintainers; hidden) ------------------------------------------------------


@app.command(hidden=True)
def generate(
    ctx: typer.Context,
    root: Annotated[Path, typer.Argument(metavar="[ROOT]", help="Project root.", show_default=False)] = Path("."),
    check: Annotated[bool, typer.Option("--check", help="Only report files that would change; exit 1 if any.")] = False,
) -> None:
    """Write the man pages, shell completions and reference pages generated from this command line."""
    from .generate import check as run_check
    from .generate import write

    group = ctx.find_root().command  # the whole command line, whose pages these are
    if check:
        drift = run_check(str(root), group)
        for rel in drift:
            typer.echo(f"out of date: {rel}")
        if drift:
            raise typer.Exit(int(ExitCode.DIFFERENCES))
        return
    for rel in write(str(root), group):
        typer.echo(f"wrote {rel}")
