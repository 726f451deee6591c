"""tests/kit itself: the runner gives the environment it promises and the
same result in a child process and in this one; a snapshot sees every kind
of change it claims to see."""

import hashlib
import os
import stat

import pytest
from factory import simple_pair
from kit.cli import SCRIPT, argv, environment, in_process, ok, run
from kit.trees import digests, du, listing, snapshot, tree


def test_the_environment_is_plain_and_env_sets_and_removes(monkeypatch):
    monkeypatch.setenv("WDIFF_DEBUG", "1")
    monkeypatch.setenv("WDIFF_TRUSTED_KEYS", "/k.pub")
    monkeypatch.setenv("KIT_SEEN", "yes")
    e = environment()
    assert "WDIFF_DEBUG" not in e and "WDIFF_TRUSTED_KEYS" not in e
    assert e["KIT_SEEN"] == "yes" and e["NO_COLOR"] == "1" and e["COLUMNS"] == "80"
    assert e["WDIFF_CACHE_DIR"] == os.environ["WDIFF_CACHE_DIR"]  # the test's private cache (conftest)
    e = environment({"WDIFF_DEBUG": "1", "KIT_SEEN": None, "COLUMNS": 100})
    assert e["WDIFF_DEBUG"] == "1" and "KIT_SEEN" not in e and e["COLUMNS"] == "100"


def test_env_reaches_the_child():
    assert "numpy kernels: WDIFF_NATIVE=0" in ok("--version", env={"WDIFF_NATIVE": "0"}).out
    assert "WDIFF_NATIVE=0" not in ok("--version", env={"WDIFF_NATIVE": None}).out


def test_a_child_and_main_in_process_say_the_same(tmp_path):
    A, B = simple_pair(tmp_path)
    for args in (["diff", "--json", A, B], ["diff", A, tmp_path / "missing"], ["diff", "--no-such-option"]):
        child, here = run(*args, cwd=tmp_path), in_process(*args)
        assert (child.rc, child.out, child.err) == (here.rc, here.out, here.err), (child, here)
    assert child.rc == 2 and "no such option" in child.err.lower()


def test_want_fails_with_the_whole_run(tmp_path):
    with pytest.raises(AssertionError) as e:
        run("diff", tmp_path / "a", tmp_path / "b", want=0)
    assert "wanted exit status 0" in str(e.value) and "exit status 3" in str(e.value)
    assert "no such directory" in str(e.value)
    r = run("diff", tmp_path / "a", tmp_path / "b", text=False, want=3)
    assert isinstance(r.stderr, bytes) and r.rc == r.returncode == 3 and r.err is r.stderr


def test_script_is_the_console_script_where_installed():
    assert argv("info", script=False)[1:] == ["-m", "wdiff", "info"]
    if SCRIPT is None:
        assert argv("info", script=True)[1:] == ["-m", "wdiff", "info"]
    else:
        assert argv("info", script=True) == [SCRIPT, "info"]
    assert ok("--version", script=True).out == ok("--version").out


def test_umask_is_the_childs(tmp_path):
    A, B = simple_pair(tmp_path)
    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        out = tmp_path / f"d{umask:o}.wdb"
        ok("pack", "-q", A, B, "-o", out, umask=umask)
        assert stat.S_IMODE(out.stat().st_mode) == mode


def test_snapshot_sees_bytes_links_modes_inodes_and_other_kinds(tmp_path):
    r = tmp_path / "r"
    (r / "d" / ".wdiff").mkdir(parents=True)
    (r / "f").write_bytes(b"one")
    (r / "d" / "g").write_bytes(b"two")
    (r / "to-f").symlink_to("f")
    (r / "to-d").symlink_to("d")
    os.mkfifo(r / "fifo")
    s = snapshot(r)
    assert s == {"d": ("dir",), "d/.wdiff": ("dir",), "d/g": ("file", hashlib.sha256(b"two").hexdigest()),
                 "f": ("file", hashlib.sha256(b"one").hexdigest()), "to-f": ("link", "f"), "to-d": ("link", "d"),
                 "fifo": (stat.S_IFIFO,)}
    assert snapshot(r, content="bytes")["f"] == ("file", b"one")
    assert set(snapshot(r, skip=("d", "fifo", "f"))) == {"f", "to-f", "to-d", "fifo"}  # folders alone

    before, before_modes, before_ino = snapshot(r), snapshot(r, modes=True), snapshot(r, inodes=True)
    os.chmod(r / "f", 0o600)
    assert snapshot(r) == before and snapshot(r, modes=True) != before_modes
    (r / "f2").write_bytes(b"one")
    os.replace(r / "f2", r / "f")  # the same bytes, another file
    assert snapshot(r) == before and snapshot(r, inodes=True) != before_ino
    (r / "to-f").unlink()
    (r / "to-f").symlink_to("d/g")
    assert snapshot(r) != before
    with pytest.raises(ValueError):
        snapshot(r, content="md5")


def test_tree_digests_listing_du(tmp_path):
    r = tmp_path / "r"
    (r / ".wdiff").mkdir(parents=True)
    (r / ".wdiff" / "lock").write_bytes(b"")
    (r / ".wdiff" / "state.json").write_bytes(b"{}")
    (r / "sub").mkdir()
    (r / "sub" / "a").write_bytes(b"aaaa")
    (r / "link").symlink_to("sub/a")
    (r / "dlink").symlink_to("sub")
    assert tree(r) == {"sub/a": b"aaaa", "link": b"aaaa"}  # links to files read through, to folders not
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / ".wdiff").write_bytes(b"a user's file")  # a file of a skipped name stays
    assert tree(tmp_path / "f") == {".wdiff": b"a user's file"}
    assert set(tree(r, skip=())) == {"sub/a", "link", ".wdiff/state.json", ".wdiff/lock"}
    assert digests(r, length=16) == {p: d[:16] for p, d in digests(r).items()}
    assert digests(r)["sub/a"] == hashlib.sha256(b"aaaa").hexdigest()
    assert listing(r) == [".wdiff/", ".wdiff/lock", ".wdiff/state.json", "dlink/", "link", "sub/", "sub/a"]
    assert du(r) == 4 + 2 + len("sub/a")
    assert du(tmp_path / "missing") == 0
