"""Threat model: a directory remote's storage is input. Whoever can write
the remote's folder (a shared or synced file system, another user of the
machine) plants links, FIFOs and hard links in it, and pushers often run as
root. A planted ``REMOTE/.lock`` link made a push create the file it named
(``/etc/nologin``); ``objects/``, ``stage/NAME/`` and ``signatures/`` linked
to folders outside were written through by push, staged push, push --sign
and gc --sign.

Every write, create, rename, lock, mkdir and delete of wdiff into a
directory remote, and every read that steers one or a verdict, stays inside
the remote: a link inside it is never followed, and is refused with exit
status 4 (what is stored is not what wdiff wrote), quickly, with nothing
outside the remote created, changed or removed and the chain as it was. The
root the user names may itself be a link (the user's choice, followed once).
Paths that come from stored data never climb out of the remote.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from functools import partial
from pathlib import Path

import pytest

from factory import simple_pair, tree
from kit.trees import snapshot
from threatlib import HANG_S, ok, read_chain, user_env, wdiff, wdiff_many

INTEGRITY = 4
DEAD = "0-0-0badc0de"  # an owner tag that names no live process: a killed writer's temporary


@pytest.fixture
def world(tmp_path):
    A, B = simple_pair(tmp_path)
    user = user_env(tmp_path / "user")
    ok(wdiff("keygen", tmp_path / "key", "-q", env=user))
    remote = tmp_path / "remote"
    ok(wdiff("push", "--sign", tmp_path / "key", "--anchor", A, remote, "-q", env=user))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"weeks of GPU time\n")
    return {"tmp": tmp_path, "A": Path(A), "B": Path(B), "remote": remote, "user": user, "key": tmp_path / "key",
            "pub": tmp_path / "key.pub", "victim": victim}


#: every entry under a root (links as links, never followed), with file
#: contents and inode numbers: what "nothing changed" means
snap = partial(snapshot, content="bytes", inodes=True)


def outside(w) -> dict:
    """Everything of the test's world that is not the remote, the user's
    state or the pull's directory D (checked on its own)."""
    return snap(w["tmp"], skip=("remote", "user", "D"))


def refused(run, what: str = "") -> None:
    assert not run.hung, f"{what} HUNG\n{run}"
    assert run.rc == INTEGRITY, f"{what} did not refuse with exit {INTEGRITY}\n{run}"
    assert "unexpected" not in run.stderr, str(run)


def link_out(w, rel: str) -> Path:
    """Replace folder ``rel`` of the remote by a link to a copy of it in
    the victim's folder (so that reading through it would even succeed)."""
    src = w["remote"] / rel
    dest = w["victim"] / rel.replace("/", "_")
    if src.exists():
        shutil.copytree(src, dest)
        shutil.rmtree(src)
    else:
        dest.mkdir()
    src.parent.mkdir(parents=True, exist_ok=True)
    src.symlink_to(dest, target_is_directory=True)
    return dest


def new_objects(w) -> dict[str, int]:
    """The bundle objects (path: size) a push of B onto the remote writes
    (bundles are named by content, so a push onto a scratch copy names the
    same ones)."""
    scratch = w["tmp"] / "scratch"
    shutil.copytree(w["remote"], scratch, symlinks=True)
    ok(wdiff("push", "--sign", w["key"], w["B"], scratch, "--base", w["A"], "-q", env=w["user"]))
    old = {p for p in snap(w["remote"]) if p.startswith("objects/")}
    new = {p: len(v[2]) for p, v in snap(scratch).items()
           if p.startswith("objects/") and p.endswith(".wdb") and v[0] == "file" and p not in old}
    shutil.rmtree(scratch)
    assert new
    return new


def push_b(w, *extra):
    return wdiff("push", "--sign", w["key"], w["B"], w["remote"], "--base", w["A"], "-q", *extra, env=w["user"],
                 timeout=HANG_S * 4)


# -- the lock ---------------------------------------------------------------------------------


def test_a_dangling_lock_link_creates_nothing_where_it_points(world):
    w = world
    (w["remote"] / ".lock").unlink()
    (w["remote"] / ".lock").symlink_to(w["victim"] / "nologin")
    before, chain = outside(w), (w["remote"] / "chain.json").read_bytes()
    run = push_b(w)
    refused(run, "push")
    assert ".lock" in run.stderr and "symbolic link" in run.stderr, str(run)
    assert not os.path.lexists(w["victim"] / "nologin")
    assert outside(w) == before
    assert (w["remote"] / "chain.json").read_bytes() == chain


@pytest.mark.parametrize("kind", ["link to a file", "fifo", "hard link", "folder"])
def test_a_lock_that_is_not_a_plain_file_of_its_own_is_refused(world, kind):
    w = world
    lock = w["remote"] / ".lock"
    lock.unlink()
    if kind == "link to a file":
        lock.symlink_to(w["victim"] / "precious")
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "hard link":
        os.link(w["victim"] / "precious", lock)
    else:
        lock.mkdir()
    before, chain = outside(w), (w["remote"] / "chain.json").read_bytes()
    run = push_b(w)
    refused(run, f"push with .lock as a {kind}")
    assert ".lock" in run.stderr, str(run)
    assert outside(w) == before
    assert (w["remote"] / "chain.json").read_bytes() == chain


# -- folders linked out of the remote: push, push --sign, gc --sign -------------------------


@pytest.mark.parametrize("rel", ["objects", "objects/SHARD", "signatures", "signatures/ALL"])
def test_a_folder_linked_outside_is_never_written_through(world, rel):
    w = world
    plants = {}
    if rel == "objects/SHARD":
        obj = min(new_objects(w))
        rel = os.path.dirname(obj)
        # a killed writer's temporary, as a clearing of dead temps would see it through the link
        plants[f".{os.path.basename(obj)}.wdiff-tmp-{DEAD}"] = b"not wdiff's to remove"
    if rel == "signatures/ALL":  # the chain's signature lands in a shard named by its digest: link them all
        targets = [link_out(w, f"signatures/{i:02x}") for i in range(256)]
    else:
        targets = [link_out(w, rel)]
    for name, data in plants.items():
        (targets[0] / name).write_bytes(data)
    before, chain = outside(w), (w["remote"] / "chain.json").read_bytes()
    run = push_b(w)
    refused(run, f"push with {rel} linked outside")
    assert "symbolic link" in run.stderr, str(run)
    assert outside(w) == before
    assert (w["remote"] / "chain.json").read_bytes() == chain


def test_gc_sign_never_writes_through_a_linked_signatures_folder(world):
    w = world
    ok(push_b(w))
    for i in range(256):
        link_out(w, f"signatures/{i:02x}")
    before, chain = outside(w), (w["remote"] / "chain.json").read_bytes()
    run = wdiff("gc", w["remote"], "--keep-last", "1", "--grace", "0", "--sign", w["key"], "-q", env=w["user"],
                timeout=HANG_S * 4)
    refused(run, "gc --sign")
    assert outside(w) == before
    assert (w["remote"] / "chain.json").read_bytes() == chain


def test_a_fifo_where_a_folder_belongs_does_not_hang_a_push(world):
    w = world
    shutil.rmtree(w["remote"] / "signatures")
    os.mkfifo(w["remote"] / "signatures")
    chain = (w["remote"] / "chain.json").read_bytes()
    (run,) = wdiff_many([["push", "--sign", w["key"], w["B"], w["remote"], "--base", w["A"], "-q"]], env=w["user"])
    refused(run, "push with signatures/ as a FIFO")
    assert (w["remote"] / "chain.json").read_bytes() == chain


# -- staged pushes and commit -------------------------------------------------------------


def staged_push(w, stage: str = "s1"):
    return wdiff("push", w["B"], w["remote"], "--base", w["A"], "--only", "*", "--stage", stage, "-q",
                 env=w["user"], timeout=HANG_S * 4)


@pytest.mark.parametrize("rel", ["stage", "stage/s1"])
def test_a_staged_push_never_writes_through_a_linked_stage(world, rel):
    w = world
    link_out(w, rel)
    before, chain = outside(w), (w["remote"] / "chain.json").read_bytes()
    run = staged_push(w)
    refused(run, f"push --stage with {rel} linked outside")
    assert "symbolic link" in run.stderr, str(run)
    assert outside(w) == before
    assert (w["remote"] / "chain.json").read_bytes() == chain


def test_commit_of_a_stage_linked_outside_is_refused_and_removes_nothing_there(world):
    """A stage whose folder is a link to parts kept elsewhere: the commit
    neither publishes them nor deletes them where the link points."""
    w = world
    ok(staged_push(w))
    link_out(w, "stage/s1")
    before, chain = outside(w), (w["remote"] / "chain.json").read_bytes()
    run = wdiff("commit", w["remote"], "--stage", "s1", "--expect", "1", "--sign", w["key"], "-q", env=w["user"],
                timeout=HANG_S * 4)
    refused(run, "commit")
    assert outside(w) == before
    assert (w["remote"] / "chain.json").read_bytes() == chain


# -- what is replaced is replaced, never written in place ----------------------------------


@pytest.mark.parametrize("kind", ["link", "hard link", "fifo"])
def test_a_planted_object_is_replaced_never_written_through(world, kind):
    """An object path that holds a link to a file outside (of the very size
    the object will have), a hard link to one, or a FIFO: the push stores
    the real object in its place, the outside file stays as it was, and the
    version pulls exactly."""
    w = world
    obj, size = min(new_objects(w).items())
    dest = w["remote"] / obj
    dest.parent.mkdir(parents=True, exist_ok=True)
    target = w["victim"] / "same-size"
    target.write_bytes(b"x" * size)
    if kind == "link":
        dest.symlink_to(target)
    elif kind == "hard link":
        os.link(target, dest)
    else:
        os.mkfifo(dest)
    before = outside(w)
    ok(push_b(w))
    assert outside(w) == before
    st = os.lstat(dest)
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1
    d = w["tmp"] / "D"
    ok(wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], "-q", env=w["user"]))
    assert tree(d) == tree(w["B"])


def test_a_chain_hard_linked_outside_is_replaced_not_rewritten(world):
    w = world
    os.link(w["remote"] / "chain.json", w["victim"] / "chain-copy")
    before = outside(w)
    ok(push_b(w))
    assert outside(w) == before
    assert os.lstat(w["remote"] / "chain.json").st_nlink == 1


# -- the read side: links planted for a pull, log or rollback ---------------------------------


@pytest.mark.parametrize("rel", ["chain.json", "objects", "objects/SHARD"])
def test_a_pull_never_reads_through_a_link_in_the_remote(world, rel):
    w = world
    if rel == "chain.json":
        shutil.copy(w["remote"] / "chain.json", w["victim"] / "chain.json")
        (w["remote"] / "chain.json").unlink()
        (w["remote"] / "chain.json").symlink_to(w["victim"] / "chain.json")
    elif rel == "objects":
        link_out(w, "objects")
    else:
        entry = read_chain(w["remote"])["entries"][0]
        link_out(w, os.path.dirname(entry["parts"][0]["path"]))
    before = outside(w)
    d = w["tmp"] / "D"
    run = wdiff("pull", w["remote"], d, "-q", env=w["user"], timeout=HANG_S * 4)
    refused(run, f"pull with {rel} linked outside")
    assert "symbolic link" in run.stderr, str(run)
    assert not d.exists() or tree(d) == {}
    assert outside(w) == before


def test_a_rollback_never_reads_through_a_linked_objects_folder(world):
    """``pull --to HEAD~1`` reads pieces of the remote's bundles (rollback):
    through a link planted since the last pull, it is refused, and DIR stays
    at the version it holds."""
    w = world
    ok(push_b(w))
    d = w["tmp"] / "D"
    ok(wdiff("pull", w["remote"], d, "-q", env=w["user"]))
    link_out(w, "objects")
    before = outside(w)
    run = wdiff("pull", w["remote"], d, "--to", "HEAD~1", "-q", env=w["user"], timeout=HANG_S * 4)
    refused(run, "pull --to HEAD~1")
    assert tree(d) == tree(w["B"])
    assert outside(w) == before


def test_a_chain_naming_a_path_outside_the_remote_is_refused(world):
    w = world
    raw = json.loads((w["remote"] / "chain.json").read_text())
    raw["entries"][0]["parts"][0]["path"] = "../victim/precious"
    (w["remote"] / "chain.json").write_text(json.dumps(raw))
    before = outside(w)
    run = wdiff("pull", w["remote"], w["tmp"] / "D", "-q", env=w["user"], timeout=HANG_S * 4)
    refused(run, "pull of a chain naming ../")
    assert outside(w) == before


def test_store_paths_that_climb_out_are_refused_by_the_api(world, tmp_path):
    """The directory store checks every path it is given, whatever checked
    it before: ``..``, ``.`` and empty parts never reach the file system."""
    from wdiff.errors import IntegrityError
    from wdiff.remotes import Upload, open_remote

    w = world
    store = open_remote(str(w["remote"]))
    src = tmp_path / "payload"
    src.write_bytes(b"planted")
    before = outside(w)
    for bad in ("../escape", "objects/../../escape", "objects//x", "./x", "objects/."):
        with pytest.raises(IntegrityError):
            store.store([Upload(bad, str(src), 0, 7)])
        with pytest.raises(IntegrityError):
            store.fetch(bad, str(tmp_path / "got"), max_size=100)
        with pytest.raises(IntegrityError):
            store.fetch_range(bad, 0, 1, size=1)
    with pytest.raises(IntegrityError):
        store.fetch("../victim/precious", str(tmp_path / "got"), max_size=100)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "got").exists()
    assert outside(w) == before


# -- the root the user names ------------------------------------------------------------------


def test_a_root_given_as_a_link_is_followed_once(world):
    """The user's own link to the remote is the user's choice: push and pull through it work."""
    w = world
    site = w["tmp"] / "current"
    site.symlink_to(w["remote"], target_is_directory=True)
    ok(wdiff("push", "--sign", w["key"], w["B"], site, "--base", w["A"], "-q", env=w["user"]))
    d = w["tmp"] / "D"
    ok(wdiff("pull", site, d, "--trusted-key", w["pub"], "-q", env=w["user"]))
    assert tree(d) == tree(w["B"])
    assert site.is_symlink()


# -- cost: a planted tree -----------------------------------------------------------------------


def test_a_planted_deep_tree_does_not_break_or_slow_gc(world):
    """gc lists objects/ and signatures/: 1,500 nested folders planted there
    cost it nothing (wdiff's objects lie 3 deep; the listing stops at 8)
    and are left as they are."""
    w = world
    top = w["remote"] / "objects" / "zz"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1500):  # deeper than Python recursion goes; made relative to the last
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("x.wdb", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"planted")
        os.close(leaf)
        run = wdiff("gc", w["remote"], "--keep-last", "1", "--grace", "0", "--sign", w["key"], "-q", env=w["user"],
                    timeout=HANG_S * 4)
        ok(run)
        assert run.elapsed < HANG_S, str(run)
        leaf = os.open("x.wdb", os.O_RDONLY, dir_fd=fd)
        assert os.pread(leaf, 100, 0) == b"planted"
        os.close(leaf)
    finally:
        os.close(fd)
        remove_deep(top)  # pytest's own clean-up of old temporaries is recursive


def remove_deep(top: Path) -> None:
    """Remove a tree of nested ``d`` folders one level at a time (a
    recursive removal, pytest's own included, stops at Python's recursion
    limit)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            try:
                os.rename("d/d", "e", src_dir_fd=fd, dst_dir_fd=fd)
            except FileNotFoundError:
                break
            os.rmdir("d", dir_fd=fd)
            os.rename("e", "d", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    shutil.rmtree(top)
