"""Arguments of the wrong kind. A command argument expects one of three
things, a remote, a checkpoint or a bundle, and a user sometimes gives one
of the other two (``wdiff pull s1.wdb DIR``, ``wdiff diff BUNDLE DIR``), two
arguments in swapped order, or a URL that lost a slash (``hf:/org/name``,
which a path reads as a local folder). Each is a usage mistake (exit 2),
recognised here before anything is read or written, and named with the
command that was most likely meant, in the ``hint`` that --json carries.

What an argument is, is read from the file system only (a bundle's magic
bytes, a remote's chain.json, a checkpoint's safetensors files): never from
a network, never beyond a directory listing and 8 bytes of one file.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat

from ..errors import NotFoundError, UsageError
from ..sync.places import holds_checkpoint, holds_remote
from ..paths import printable
from ..remotes import near_url
from ..remotes.base import CHAIN

# what an argument is
URL = "url"  # a remote URL (hf://, s3://, ...)
NEAR = "near-url"  # a remote URL that lost a slash, or a Hub web address: read as a missing local path
REMOTE_DIR = "remote-dir"  # a directory remote (chain.json, objects/)
CHECKPOINT = "checkpoint"  # a directory of safetensors files, or a .safetensors file
BUNDLE = "bundle"  # a file that starts with a bundle's magic bytes
FILE = "file"  # another file
DIR = "dir"  # another directory (empty, new, companion files only)
MISSING = "missing"

_AS = {
    URL: "a remote",
    NEAR: "a remote URL",
    REMOTE_DIR: f"a remote ({CHAIN}, objects/)",
    BUNDLE: "a bundle file",
    FILE: "a file",
}
_REMOTES = (URL, NEAR, REMOTE_DIR)


def kind_of(arg) -> str:
    """What ``arg`` (a command-line argument, str or path) is."""
    text = os.fspath(arg)
    if "://" in text:
        return NEAR if near_url(text) else URL
    try:
        st = os.stat(text)
    except OSError:
        return NEAR if near_url(text) else MISSING
    if stat.S_ISDIR(st.st_mode):
        if os.path.lexists(os.path.join(text, CHAIN)):
            return REMOTE_DIR
        if holds_checkpoint(text):
            return CHECKPOINT
        return REMOTE_DIR if holds_remote(text) else DIR
    if not stat.S_ISREG(st.st_mode):
        return FILE
    if text.endswith(".safetensors"):
        return CHECKPOINT
    from ..format.records import MAGIC  # here: the format's modules cost ~0.1 s to import

    try:
        # never blocks: a FIFO or a device swapped in since the stat is not read
        fd = os.open(text, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return FILE
    try:
        head = os.read(fd, len(MAGIC)) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        head = b""
    finally:
        os.close(fd)
    return BUNDLE if head == MAGIC else FILE


def q(arg) -> str:
    """An argument as a user would type it again in a shell."""
    text = printable(os.fspath(arg))
    return shlex.quote(text)


def remote_text(arg) -> str:
    """A remote-like argument as a URL: what a path type kept of it mended."""
    return near_url(os.fspath(arg)) or os.fspath(arg)


def _is(arg, kind: str) -> str:
    """"ARG is a bundle file" and the like, for a message."""
    if kind == CHECKPOINT:
        what = "a checkpoint file" if os.path.isfile(os.fspath(arg)) else "a checkpoint directory"
    else:
        what = _AS.get(kind, "a directory")
    return f"{printable(os.fspath(arg))} is {what}"


def wrong(arg, kind: str, want: str, hint: str) -> UsageError:
    return UsageError(f"{_is(arg, kind)}, not {want}", hint=hint)


def swapped(right: str, hint: str) -> UsageError:
    return UsageError(f"the arguments are in the wrong order: {right}", hint=hint)


def near(arg, command: str) -> UsageError:
    """A URL that lost a slash (a path keeps one of ``hf://``'s two): the
    command again with it mended."""
    fixed = remote_text(arg)
    text = printable(os.fspath(arg))
    said = (f"{text} is a repository's web page, not a remote" if "://" in text
            else f"{text} is not a remote URL (it reads as a local path)")
    return UsageError(said, hint=f"did you mean {fixed}? {command.replace('{fixed}', q(fixed))}")


# -- the roles -----------------------------------------------------------------------------------


def as_remote(arg, command: str, *, bundle: str, checkpoint: str) -> str:
    """Refuse ``arg`` where a remote belongs unless it is one (or may be:
    a URL, a new or empty directory, a missing path). ``command`` is the
    command line with ``{fixed}`` where a mended URL goes; ``bundle`` and
    ``checkpoint``, the next step for a bundle or a checkpoint given
    instead. Returns the kind."""
    k = kind_of(arg)
    if k == NEAR:
        raise near(arg, command)
    if k == BUNDLE:
        raise wrong(arg, k, "a remote", bundle)
    if k == CHECKPOINT:
        raise wrong(arg, k, f"a remote (it has no {CHAIN})", checkpoint)
    if k == FILE:
        raise wrong(arg, k, "a remote", "a remote is a directory that `wdiff push` wrote, or a URL "
                                          "(hf://ORG/NAME, s3://BUCKET/PREFIX, ...)")
    return k


def as_checkpoint(arg, *, bundle: str, remote: str) -> str:
    """Refuse ``arg`` where a checkpoint belongs when it is a bundle (next
    step ``bundle``) or a remote (``remote``, with ``{remote}`` for the URL).
    Returns the kind."""
    k = kind_of(arg)
    if k == BUNDLE:
        raise wrong(arg, k, "a checkpoint", bundle)
    if k in _REMOTES:
        raise wrong(arg, k, "a checkpoint directory", remote.replace("{remote}", q(remote_text(arg))))
    return k


def as_bundle(arg, *, checkpoint: str, remote: str) -> str:
    """Refuse ``arg`` where a bundle file belongs when it is a checkpoint
    (next step ``checkpoint``) or a remote (``remote``, ``{remote}`` for
    the URL). Returns the kind."""
    k = kind_of(arg)
    if k in (CHECKPOINT, DIR):
        raise wrong(arg, k, "a bundle file", checkpoint)
    if k in _REMOTES:
        raise wrong(arg, k, "a bundle file", remote.replace("{remote}", q(remote_text(arg))))
    return k


def is_remote(kind: str) -> bool:
    return kind in _REMOTES


# -- the commands ---------------------------------------------------------------------------------
#
# Each takes the command's arguments as given and refuses the mistakes above,
# swapped arguments first (they explain two wrong kinds at once).

_PULLED = "pull a version of it first: wdiff pull {remote} DIR (`wdiff log {remote}` lists them)"


def check_diff(*paths, command: str = "diff") -> None:
    """diff A B, pack A B: two checkpoints."""
    for x in paths:
        if command == "pack":
            bundle = (f"pack reads two checkpoints and writes the bundle (-o); `wdiff squash {q(x)} NEXT.wdb "
                      "-o OUT` composes bundles")
        else:
            bundle = (f"`wdiff info {q(x)}` describes a bundle; to compare what it makes: "
                      f"wdiff apply {q(x)} BASE -o NEW, then wdiff diff BASE NEW")
        as_checkpoint(x, bundle=bundle, remote=_PULLED)


def check_pack_output(output) -> None:
    k = kind_of(output)
    if k in (URL, NEAR):
        raise wrong(output, k, "a bundle file to write",
                    f"pack writes a local file; to publish: wdiff push DIR {q(remote_text(output))} --base PREV")


def check_apply(bundle, base) -> None:
    bk = kind_of(bundle)
    b = q(bundle)
    if bk in (CHECKPOINT, DIR):
        if base is not None and kind_of(base) == BUNDLE:
            raise swapped("BUNDLE comes first, then BASE", f"wdiff apply {q(base)} {b} ...")
        raise wrong(bundle, bk, "a bundle file",
                    "wdiff apply BUNDLE [BASE] (-o OUT | --in-place): the bundle file comes first")
    if is_remote(bk):
        raise wrong(bundle, bk, "a bundle file",
                    f"a remote's versions are pulled: wdiff pull {q(remote_text(bundle))} "
                    f"{q(base) if base is not None else 'DIR'}")
    if base is not None:
        as_checkpoint(base, bundle=f"apply takes one bundle, then its base; `wdiff squash {b} {q(base)} -o OUT` "
                                   "composes two bundles",
                      remote="a remote's versions are pulled: wdiff pull {remote} DIR")


def check_pull(remote: str, directory) -> None:
    rk, dk = kind_of(remote), kind_of(directory)
    r, d = q(remote), q(directory)
    if is_remote(dk) and rk in (CHECKPOINT, DIR, MISSING):
        raise swapped("REMOTE comes first, then DIR", f"wdiff pull {q(remote_text(directory))} {r}")
    if dk == CHECKPOINT:
        bundle = f"to apply a bundle: wdiff apply {r} {d} --in-place (or -o NEW for a copy)"
    else:
        bundle = f"to apply a bundle: wdiff apply {r} BASE -o {d} (BASE: the checkpoint it was made from; none for an anchor)"
    as_remote(remote, f"wdiff pull {{fixed}} {d}", bundle=bundle,
              checkpoint=f"a remote is where `wdiff push` publishes: wdiff push --anchor {r} REMOTE, "
                         f"then wdiff pull REMOTE {d}")
    if dk == BUNDLE:
        raise wrong(directory, dk, "a checkpoint directory",
                    f"pull into a checkpoint directory (it is created if missing); a bundle is applied: "
                    f"wdiff apply {d} BASE -o OUT")
    if is_remote(dk):
        raise wrong(directory, dk, "a checkpoint directory",
                    f"pull into a checkpoint directory (it is created if missing): wdiff pull {r} DIR")


def check_push(source, remote: str, base) -> None:
    sk, rk = kind_of(source), kind_of(remote)
    s, r = q(source), q(remote)
    if (is_remote(sk) or sk == MISSING) and rk in (BUNDLE, CHECKPOINT):
        raise swapped("BUNDLE or DIR comes first, then REMOTE", f"wdiff push {r} {q(remote_text(source))} ...")
    if sk == CHECKPOINT and os.path.isfile(os.fspath(source)):
        raise wrong(source, sk, "a bundle file or a checkpoint directory",
                    f"pack it first: wdiff pack OLD {s} -o STEP.wdb, then wdiff push STEP.wdb {r}")
    if is_remote(sk):
        raise wrong(source, sk, "a bundle file or a checkpoint directory",
                    f"push publishes a bundle or a checkpoint to a remote: wdiff push BUNDLE|DIR {q(remote_text(source))}")
    where = ("the last argument is where to publish: a directory that `wdiff push` wrote (or creates), "
             f"or a URL: wdiff push {s} REMOTE")
    as_remote(remote, f"wdiff push {s} {{fixed}}", bundle=where,
              checkpoint=f"a push would turn it into a remote; {where}")
    if base is not None:
        as_checkpoint(base, bundle=f"--base is the checkpoint at the remote's head; a bundle is pushed itself: "
                                   f"wdiff push {q(base)} {r}",
                      remote="--base is the checkpoint at the remote's head: wdiff pull {remote} PREV brings one there")


def check_status(directory, remote: str) -> None:
    dk, rk = kind_of(directory), kind_of(remote)
    d, r = q(directory), q(remote)
    if is_remote(dk) and rk in (CHECKPOINT, DIR, MISSING):
        raise swapped("DIR comes first, then REMOTE", f"wdiff status {r} {q(remote_text(directory))}")
    as_checkpoint(directory, bundle=f"`wdiff info {d}` describes a bundle and checks its digests",
                  remote="status compares a checkpoint with a remote: wdiff status DIR {remote}")
    as_remote(remote, f"wdiff status {d} {{fixed}}",
              bundle=f"to check {d} against a bundle's target: wdiff verify {d} --bundle {r}",
              checkpoint=f"to compare two checkpoints: wdiff diff {r} {d}")


def check_remote(command: str, remote: str, rest: str = "") -> None:
    """log, gc, commit, squash --remote: a remote and nothing else."""
    r = q(remote)
    if command == "log":
        bundle = f"`wdiff info {r}` describes a bundle; `wdiff push {r} REMOTE` publishes it"
        checkpoint = f"`wdiff status {r} REMOTE` says which version of a remote it holds"
    else:
        bundle = checkpoint = f"{command} works on a remote: the one `wdiff push` published to"
    as_remote(remote, f"wdiff {command} {{fixed}}{rest}", bundle=bundle, checkpoint=checkpoint)


def check_squash(bundles, base) -> None:
    for x in bundles or ():
        as_bundle(x, checkpoint=f"squash composes bundle files; `wdiff pack A {q(x)} -o FILE` makes one",
                  remote="a remote's run is squashed there: wdiff squash --remote {remote}")
    if base is not None:
        as_checkpoint(base, bundle="--base is the checkpoint the first bundle applies to; the bundles come first",
                      remote=_PULLED)


def check_verify(directory, bundle, remote) -> None:
    d = q(directory)
    as_checkpoint(directory, bundle=f"`wdiff info {d}` checks every digest of a bundle",
                  remote="verify checks a checkpoint against a remote: wdiff verify DIR --remote {remote}")
    if bundle is not None:
        as_bundle(bundle, checkpoint=f"to compare two checkpoints: wdiff diff {q(bundle)} {d}",
                  remote=f"wdiff verify {d} --remote {{remote}}")
    if remote is not None:
        as_remote(remote, f"wdiff verify {d} --remote {{fixed}}",
                  bundle=f"wdiff verify {d} --bundle {q(remote)}",
                  checkpoint=f"to compare two checkpoints: wdiff diff {q(remote)} {d}")


def check_bundle(command: str, bundle) -> None:
    """info and sign: a bundle file."""
    b = q(bundle)
    if command == "info":
        checkpoint = f"`wdiff verify {b} --remote REMOTE` (or --bundle BUNDLE) checks a checkpoint"
        remote = "`wdiff log {remote}` lists a remote's versions"
    else:
        checkpoint = f"pack it first and sign the bundle: wdiff pack BASE {b} -o FILE --sign KEY"
        remote = "a remote's chain is signed as it is pushed: wdiff push ... {remote} --sign KEY"
    as_bundle(bundle, checkpoint=checkpoint, remote=remote)


@contextlib.contextmanager
def versions_of(remote):
    """A version named that ``remote`` does not hold (or none, on an empty
    remote): the message names the remote, the hint how to list its
    versions, or how to publish the first."""
    try:
        yield
    except NotFoundError as e:
        from ..format.chain import NoSuchVersion  # imported by whatever raised one

        if not isinstance(e, NoSuchVersion):
            raise
        r = q(remote_text(remote))
        message = e.message.replace("the remote", printable(os.fspath(remote)))
        hint = (f"push the first version: wdiff push --anchor DIR {r}" if e.empty
                else f"`wdiff log {r}` lists its versions and their labels")
        raise NoSuchVersion(message, empty=e.empty, hint=hint) from None
