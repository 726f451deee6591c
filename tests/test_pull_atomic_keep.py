"""pull --atomic --keep N (issue 33, class 8: resources over time).

``pull --atomic`` builds each version in a new directory beside the link's
target and switches the link; it kept every old directory, so a cron job
grew the disk by one whole checkpoint per pull, for ever. Now the oldest
directories it made for this link are removed beyond N (default 2: the
link's target and the one before it), after the switch. The list of what
it made is input: a planted or edited entry never removes a directory the
user made, renamed, or reaches through a link, nor where the link points;
a pull SIGKILLed in the middle of a removal leaves the link on a complete
version, and the next pull finishes the removal. Real command line only."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from schemacheck import errors
from test_pull_retention import cli, env  # noqa: F401 - env: per-test user state and cache

import wdiff

LIST = ".current.wdiff-versions"
SCHEMA = json.loads((Path(__file__).parent.parent / "wdiff" / "cli" / "schemas" / "pull.json").read_text())


class Head:
    """A remote whose head moves: each :meth:`next` pushes one more version,
    labelled ``step-N`` (the name pull --atomic gives its directory)."""

    def __init__(self, root: Path) -> None:
        self.root, self.rng = root, np.random.default_rng(5)
        self.remote = root / "remote"
        self.t = {f"layer.{i}.w": rand(self.rng, "BF16", (64, 64)) for i in range(3)}
        self.n = 0
        self.prev = write_ckpt(root / "v0", self.t, shards=3)
        wdiff.push(self.prev, self.remote, anchor=True, label="step-0")
        self.trees = {"step-0": tree(self.prev)}

    def next(self) -> str:
        self.n += 1
        self.t = {k: mutate(x, 0.05, self.rng) for k, x in self.t.items()}
        cur = write_ckpt(self.root / f"v{self.n}", self.t, shards=3)  # files enough to die half way through removing them
        wdiff.push(cur, self.remote, base=self.prev, label=f"step-{self.n}")
        self.trees[f"step-{self.n}"] = tree(cur)
        shutil.rmtree(self.prev)
        self.prev = cur
        return f"step-{self.n}"


def site_of(tmp_path: Path) -> tuple[Path, Path]:
    """``site/current -> start``: the link a cron job pulls into, at a
    directory the user made (never removed: pull --atomic did not make it)."""
    site = tmp_path / "site"
    (site / "start").mkdir(parents=True)
    os.symlink("start", site / "current")
    return site, site / "current"


def versions_beside(site: Path) -> set[str]:
    """The version directories beside the link (not the user's, not hidden)."""
    return {n for n in os.listdir(site) if n not in ("current", "start") and not n.startswith(".")}


@pytest.mark.slow
def test_cron_pulls_keep_the_target_and_the_one_before_it(env, tmp_path):
    """Ten cron-style ``pull --atomic`` of a moving head: after each, exactly
    two version directories stand beside the link (the new one and the one
    before it), the link resolves to the complete head, and each removal is
    reported (human and --json). Without --keep every one of the ten stayed."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for k in range(10):
        made.append(head.next())
        args = ["pull", head.remote, link, "--atomic"] + (["--json"] if k % 2 else [])
        r = cli(*args, env=env)
        assert os.readlink(link) == made[-1] and tree(link) == head.trees[made[-1]]
        assert versions_beside(site) == set(made[-2:]), sorted(os.listdir(site))
        assert os.listdir(site / "start") == []  # the user's own directory, untouched
        gone = [str(site / n) for n in made[-3:-2]]
        if k % 2:
            doc = json.loads(r.stdout)
            assert doc["removed"] == gone and errors(SCHEMA, doc) == [], doc
        else:
            assert [ln for ln in r.stdout.splitlines() if ln.startswith("removed")] == \
                [f"removed the old version {g}" for g in gone]
    leftovers = [n for n in os.listdir(site) if n.startswith(".")]
    assert leftovers == [LIST], leftovers  # no temporaries, no half-removed trees, no locks


@pytest.mark.slow
@pytest.mark.parametrize("keep, stays", [("1", 1), ("3", 3), ("0", 5)])
def test_keep_counts_the_target(env, tmp_path, keep, stays):
    """--keep 1 keeps only the link's target, --keep 3 two before it, and
    --keep 0 every version (as before)."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for _ in range(5):
        made.append(head.next())
        cli("pull", "-q", head.remote, link, "--atomic", "--keep", keep, env=env)
        assert tree(link) == head.trees[made[-1]]
    assert versions_beside(site) == set(made[-stays:])


@pytest.mark.slow
def test_the_version_kept_for_a_rollback_is_the_one_the_link_left(env, tmp_path):
    """The user points the link back at the version before (a rollback by
    hand); the next pull builds the head from there and keeps that one, the
    directory it just replaced, and removes the newer one it had left."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for _ in range(3):
        made.append(head.next())
        cli("pull", "-q", head.remote, link, "--atomic", env=env)
    os.symlink(made[1], site / "rollback")
    os.replace(site / "rollback", link)
    made.append(head.next())
    r = cli("pull", "--json", head.remote, link, "--atomic", env=env)
    assert json.loads(r.stdout)["removed"] == [str(site / made[2])]
    assert versions_beside(site) == {made[1], made[3]} and tree(link) == head.trees[made[3]]
    assert tree(site / made[1]) == head.trees[made[1]]


@pytest.mark.slow
def test_a_version_another_wdiff_is_writing_stays_until_the_next_pull(env, tmp_path):
    """An old version whose lock another process holds (as a pull or an
    in-place apply into it does) is not removed under it: the pull succeeds
    and the next one, the lock released, removes it."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for _ in range(2):
        made.append(head.next())
        cli("pull", "-q", head.remote, link, "--atomic", env=env)
    fd = os.open(site / f".{made[0]}.wdiff-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        made.append(head.next())
        r = cli("pull", "--json", head.remote, link, "--atomic", env=env)
        assert json.loads(r.stdout)["removed"] == [] and versions_beside(site) == set(made)
        assert tree(site / made[0]) == head.trees[made[0]]
    finally:
        os.close(fd)
    r = cli("pull", "--json", head.remote, link, "--atomic", env=env)
    assert json.loads(r.stdout)["removed"] == [str(site / made[0])] and versions_beside(site) == set(made[1:])


@pytest.mark.slow
def test_versions_the_remote_gc_dropped_are_still_removed(env, tmp_path):
    """The remote's gc forgets old versions; the directories pull --atomic
    built for them still hold the version it listed them with, and go."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for _ in range(3):
        made.append(head.next())
        cli("pull", "-q", head.remote, link, "--atomic", "--keep", "0", env=env)
    cli("gc", "-q", head.remote, "--keep-last", "1", "--grace", "0", env=env)
    made.append(head.next())
    r = cli("pull", "--json", head.remote, link, "--atomic", env=env)
    assert json.loads(r.stdout)["removed"] == [str(site / n) for n in made[:2]]
    assert versions_beside(site) == set(made[2:]) and tree(link) == head.trees[made[-1]]


def test_keep_is_refused_without_atomic_or_below_zero(env, tmp_path):
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    r = cli("pull", head.remote, site / "start", "--keep", "1", env=env, want=None)
    assert r.returncode == 2 and "--atomic" in r.stderr, r.stderr
    r = cli("pull", head.remote, link, "--atomic", "--keep", "-1", env=env, want=None)
    assert r.returncode == 2, r.stderr
    assert os.listdir(site / "start") == [] and versions_beside(site) == set()


def _entry(name: str, st: os.stat_result, mac: str, **extra) -> dict:
    return {"name": name, "dev": st.st_dev, "ino": st.st_ino, "version": "0" * 32, "mac": mac} | extra


@pytest.mark.slow
def test_planted_list_entries_never_remove_what_is_not_ours(env, tmp_path):
    """Whoever can write the link's parent edits the list: entries for
    ``..``, ``/etc``, a symlink named like a version pointing outside (one
    a listed version's own name, the directory moved out to where it
    points: same device and inode, genuine MAC), the
    user's own directory (a real version of the remote, its real device and
    inode, with a MAC copied from a genuine entry), a half-removed
    "temporary" that is a link outside, the current target put first, and
    an old version the user renamed to keep it: --keep 1 removes none of
    them, and still removes what pull --atomic made."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for _ in range(3):
        made.append(head.next())
        cli("pull", "-q", head.remote, link, "--atomic", "--keep", "0", env=env)
    os.rename(site / made[0], site / "pinned")  # the user keeps this one
    moved = tmp_path / "moved"  # a listed version moved out, its name now a link to it
    os.rename(site / made[1], moved)
    os.symlink(moved, site / made[1])
    outside = tmp_path / "outside"
    shutil.copytree(site / made[2], outside, symlinks=True)  # a whole version, with its record
    os.symlink(outside, site / "step-99")
    os.symlink(outside, site / ".current.wdiff-old-00000000000000aa")
    mine = site / "mine"
    cli("pull", "-q", head.remote, mine, "--to", made[0], env=env)  # the user's own checkpoint
    before = {p: tree(p) for p in (outside, mine, site / "pinned", moved)}
    doc = json.loads((site / LIST).read_text())
    genuine = doc["versions"]
    mac = genuine[0]["mac"]
    st = os.stat
    doc["versions"] = [
        *[e for e in genuine if e["name"] == made[2]],  # the link's target, put first
        _entry("..", st(tmp_path), mac),
        _entry("/etc", st("/etc"), mac),
        _entry("step-99", os.lstat(site / "step-99"), mac),
        _entry("step-99", st(outside), mac),
        _entry("mine", st(mine), mac),
        _entry("pinned", st(site / "pinned"), genuine[0]["mac"]),
        *[e for e in genuine if e["name"] != made[2]],
    ]
    doc["removing"] = [_entry("mine", st(mine), mac, trash=".current.wdiff-old-00000000000000aa"),
                       _entry("mine", st(outside), mac, trash=".current.wdiff-old-00000000000000aa")]
    (site / LIST).write_text(json.dumps(doc))
    r = cli("pull", "--json", head.remote, link, "--atomic", "--keep", "1", env=env)
    assert json.loads(r.stdout)["removed"] == []  # up to date: the target stays, whatever the list says
    assert os.readlink(link) == made[2] and tree(link) == head.trees[made[2]]
    for _ in range(2):
        made.append(head.next())
        cli("pull", "-q", head.remote, link, "--atomic", "--keep", "1", env=env)
        assert tree(link) == head.trees[made[-1]]
    assert versions_beside(site) == {made[-1], "mine", "pinned", "step-99", made[1]}
    assert os.path.islink(site / made[1]) and os.path.islink(site / "step-99") and os.path.islink(site / ".current.wdiff-old-00000000000000aa")
    assert {p: tree(p) for p in before} == before
    assert os.path.isdir("/etc/") and (tmp_path / "remote").is_dir()


@pytest.mark.slow
def test_a_list_that_is_not_ours_removes_nothing(env, tmp_path):
    """The list replaced by a symlink to a file elsewhere, then by garbage:
    the pull succeeds, removes nothing it cannot vouch for, and the file the
    link named is never written."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = [head.next()]
    cli("pull", "-q", head.remote, link, "--atomic", env=env)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text((site / LIST).read_text())
    os.unlink(site / LIST)
    os.symlink(elsewhere, site / LIST)
    kept = elsewhere.read_bytes()
    made.append(head.next())
    cli("pull", "-q", head.remote, link, "--atomic", "--keep", "1", env=env)
    assert elsewhere.read_bytes() == kept and not (site / LIST).is_symlink()
    assert versions_beside(site) == set(made)  # the first one's entry came through the link: not trusted
    (site / LIST).write_bytes(b"\xff not json")
    made.append(head.next())
    cli("pull", "-q", head.remote, link, "--atomic", "--keep", "1", env=env)
    assert versions_beside(site) == set(made) and tree(link) == head.trees[made[-1]]


#: runs the real CLI in this process after an audit hook that SIGKILLs it at
#: one exact step of a removal: before the rename to the temporary name
#: ("rename"), or once the rename is done and two files of the tree are gone
#: ("rmtree"): no sleep decides where it dies
KILLER = """
import os, runpy, signal, sys
at, seen = os.environ["KEEP_KILL_AT"], {"files": 0, "on": False}
def hook(event, args):
    if at == "rename" and event == "os.rename" and ".wdiff-old-" in str(args[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    if at == "rmtree" and event == "os.rename" and ".wdiff-old-" in str(args[1]):
        seen["on"] = True
    if at == "rmtree" and event == "os.remove" and seen["on"]:
        seen["files"] += 1
        if seen["files"] == 3:
            os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
sys.argv[0] = "wdiff"
runpy.run_module("wdiff", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("at", ["rename", "rmtree"])
def test_a_pull_killed_while_removing_is_finished_by_the_next(env, tmp_path, at):
    """SIGKILL before the old version is renamed away, or half way through
    removing its tree: the link is on the complete new version, no
    directory that looks like a version is half removed, and the next pull
    (the head has not moved) finishes the removal and leaves no debris."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for _ in range(2):
        made.append(head.next())
        cli("pull", "-q", head.remote, link, "--atomic", env=env)
    made.append(head.next())
    p = subprocess.run([sys.executable, "-c", KILLER, "pull", "-q", str(head.remote), str(link), "--atomic"],
                       env=env | {"KEEP_KILL_AT": at}, capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert os.readlink(link) == made[-1] and tree(link) == head.trees[made[-1]]
    for n in versions_beside(site):  # every directory named like a version is one, whole
        assert tree(site / n) == head.trees[n], n
    trash = [n for n in os.listdir(site) if ".wdiff-old-" in n]
    assert (len(trash), made[0] in versions_beside(site)) == ((0, True) if at == "rename" else (1, False))
    r = cli("pull", "--json", head.remote, link, "--atomic", env=env)
    doc = json.loads(r.stdout)
    assert doc["up_to_date"] and doc["removed"] == [str(site / made[0])], doc
    assert versions_beside(site) == set(made[-2:]) and tree(link) == head.trees[made[-1]]
    assert [n for n in os.listdir(site) if n.startswith(".")] == [LIST]
    assert json.loads((site / LIST).read_text())["removing"] == []


@pytest.mark.slow
def test_a_link_in_another_folder_than_its_versions(env, tmp_path):
    """``site/live -> ../store/start``: each version is built beside the
    link's target, in ``store/``, so the list and every check of a removal
    are there; nothing is added beside the link. (The list was kept beside
    the link, and every version checked there: none was ever found, so none
    was removed, and the list was debris beside the user's link.)"""
    head = Head(tmp_path)
    store, site = tmp_path / "store", tmp_path / "site"
    (store / "start").mkdir(parents=True)
    site.mkdir()
    link = site / "live"
    os.symlink(os.path.join("..", "store", "start"), link)
    made = []
    for _ in range(4):
        made.append(head.next())
        r = cli("pull", head.remote, link, "--atomic", env=env)
        assert "warning" not in r.stderr, r.stderr
        assert os.path.realpath(link) == str((store / made[-1]).resolve()) and tree(link) == head.trees[made[-1]]
        assert sorted(os.listdir(site)) == ["live"]
        assert {n for n in os.listdir(store) if not n.startswith(".")} == {"start", *made[-2:]}
