"""Every mistake and mishap names the next step (issue 30, mistakes 5, 6, 7).

Driven from outside: the real command line in a child process. Where a
test must catch a command in the middle of its work, the child is the same
``wdiff`` main with one step slowed down (a write of the in-place patch, a
download, a bundle write: see SLOW), so that a real SIGINT lands there
every time, not by luck.

5. status reports what the pull (with --force) really downloads: the
   anchor when a delta cannot restore a locally changed file; -v says the
   disk the pull needs and has.
6. Ctrl-C says what was kept and what to run next; the next pull says it
   finished the interrupted apply.
7. -v lists the plan (bundles, sizes, from where) and the times, -vv the
   parts; messages name versions by label; `verify DIR` checks DIR against
   its own record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt

sys.path.insert(0, str(Path(__file__).parent / "ux"))
from uxkit import with_pty_stderr  # noqa: E402
from kit.cli import run as kit_run

#: the real command line, with one step slowed when SLOW_AT says which
SLOW = textwrap.dedent(
    """
    import os, sys, time
    at = os.environ.get("SLOW_AT")
    def flag():
        open(os.environ["SLOW_FLAG"], "a").close()
    if at == "patch":  # every write of the in-place patch phase
        from wdiff.ops.apply import patch as patching
        real_write = patching.write_all
        def write_all(fd, data, off):
            flag(); time.sleep(0.2); real_write(fd, data, off)
        patching.write_all = write_all
    elif at == "fetch":  # after a part of a bundle arrived from a directory remote
        from wdiff.remotes import local
        real_fetch = local.LocalStore.fetch
        def fetch(self, *a, **k):
            real_fetch(self, *a, **k); flag(); time.sleep(60)
        local.LocalStore.fetch = fetch
    elif at == "bundle":  # every write into a bundle being packed, from the SLOW_AFTER-th on
        from wdiff.format import bundle
        real = bundle.BundleWriter._write
        seen = [0]
        def _write(self, data):
            real(self, data)
            seen[0] += 1
            if seen[0] >= int(os.environ.get("SLOW_AFTER", "1")):
                flag(); time.sleep(0.05)
        bundle.BundleWriter._write = _write
    from wdiff.cli import main
    sys.exit(main())
    """
)


def env(**extra) -> dict:
    e = dict(os.environ, NO_COLOR="1", COLUMNS="80", WDIFF_THREADS="2")
    for k in ("WDIFF_DEBUG", "WDIFF_TRUSTED_KEYS"):
        e.pop(k, None)
    e.update(extra)
    return e


def wd(*args, cwd=None) -> subprocess.CompletedProcess:
    return kit_run(*args, cwd=cwd, env={"WDIFF_THREADS": "2"})


def ok(*args, cwd=None) -> subprocess.CompletedProcess:
    r = wd(*args, cwd=cwd)
    assert r.returncode == 0, f"wdiff {args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def interrupted(tmp: Path, at: str, *args, sig=signal.SIGINT, cwd=None, extra=None) -> subprocess.CompletedProcess:
    """Run ``wdiff ARGS`` with the step ``at`` slowed, and send ``sig`` once
    the command is in that step."""
    flag = tmp / f"flag-{time.monotonic_ns()}"
    p = subprocess.Popen([sys.executable, "-c", SLOW, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(SLOW_AT=at, SLOW_FLAG=str(flag), **(extra or {})),
                         cwd=cwd, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert p.poll() is None, f"wdiff {args} ended before it reached {at}: {p.communicate()}"
        assert time.monotonic() < deadline, f"wdiff {args} never reached {at}"
        time.sleep(0.005)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(args, p.returncode, out, err)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A directory remote: step-1 (anchor of A), step-2 (delta to B), step-3
    (delta to C); 8 BF16 tensors of 512x512 in two shards and a config."""
    t = tmp_path_factory.mktemp("guide")
    rng = np.random.default_rng(30)
    a = {f"layer.{i}.w": rand(rng, "BF16", (512, 512)) for i in range(8)}
    b = {k: mutate(v, 0.02, rng) for k, v in a.items()}
    c = {k: mutate(v, 0.02, rng) for k, v in b.items()}
    A = write_ckpt(t / "A", a, shards=2, companions={"config.json": b'{"step": 1}'})
    B = write_ckpt(t / "B", b, shards=2, companions={"config.json": b'{"step": 2}'})
    C = write_ckpt(t / "C", c, shards=2, companions={"config.json": b'{"step": 3}'})
    R = t / "R"
    ok("push", "-q", "--anchor", A, R, "--label", "step-1")
    ok("push", "-q", B, R, "--base", A, "--label", "step-2")
    ok("push", "-q", C, R, "--base", B, "--label", "step-3")
    log = json.loads(ok("log", "--json", R).stdout)
    sizes = {e["label"]: e["size"] for e in log["entries"]}
    return t, A, B, C, R, sizes


def _at_step2(world, name) -> Path:
    t, *_, R, _ = world
    d = t / name
    ok("pull", "-q", R, d, "--to", "step-2")
    return d


# -- 5: status follows the pull's own plan ------------------------------------------------


@pytest.mark.parametrize("changed", ["model-00001-of-00002.safetensors", "config.json"])
def test_status_says_what_a_forced_pull_downloads(world, changed):
    """A weights file changed here cannot be restored from a delta (it
    holds the delta's base, not the file whole): the forced pull starts
    from an anchor, and status says so, with the same bytes. A changed
    companion file that the next delta carries whole: the delta only."""
    t, A, B, C, R, sizes = world
    d = _at_step2(world, f"changed-{changed}")
    p = d / changed
    data = bytearray(p.read_bytes())
    data[-2] ^= 1
    p.write_bytes(bytes(data))
    st = json.loads(ok("status", "--json", d, R).stdout)
    human = ok("status", d, R).stdout
    assert wd("pull", R, d).returncode == 5  # refused without --force
    pulled = json.loads(ok("pull", "--json", "--force", R, d).stdout)
    assert tree(d) == tree(C)
    assert st["download_bytes"] == pulled["downloaded_bytes"], (st, pulled)
    if changed.endswith(".safetensors"):
        assert pulled["from_anchor"] and st["from_anchor"]
        assert st["download_bytes"] >= sizes["step-1"]
        assert "--force restores them from an anchor" in human, human
    else:
        assert not pulled["from_anchor"] and not st["from_anchor"]
        assert st["download_bytes"] == sizes["step-3"]
    assert "step-2 (" in human and "step-3 (" in human  # versions named by their labels


def test_verbose_pull_states_the_disk_it_needs(world):
    t, A, B, C, R, sizes = world
    r = ok("pull", "-v", R, t / "disk-new")
    assert "disk: needs " in r.stderr and " free, has " in r.stderr, r.stderr


# -- 6: an interrupted command names what comes next ---------------------------------------


def test_ctrl_c_in_the_middle_of_a_pull_says_what_comes_next(world):
    t, A, B, C, R, sizes = world
    d = _at_step2(world, "intr-pull")
    r = interrupted(t, "patch", "pull", R, d)
    assert r.returncode == 130, r
    assert "in place" in r.stderr and "parts of two versions" in r.stderr, r.stderr
    assert f"run `wdiff pull {R} {d}` again to finish the update" in r.stderr, r.stderr
    assert (d / ".wdiff" / "txn" / "journal.json").exists()
    again = ok("pull", R, d)
    assert again.stdout.startswith("finished the interrupted apply"), again.stdout
    assert "already at" not in again.stdout
    assert tree(d) == tree(C)
    # the JSON document says it too: the pull did something
    d2 = _at_step2(world, "intr-pull-json")
    assert interrupted(t, "patch", "pull", R, d2).returncode == 130
    doc = json.loads(ok("pull", "--json", R, d2).stdout)
    assert doc["finished_interrupted"] is True and doc["up_to_date"] is False
    assert tree(d2) == tree(C)


def test_ctrl_c_while_a_pull_downloads_keeps_what_arrived(world):
    t, A, B, C, R, sizes = world
    d = t / "intr-download"
    r = interrupted(t, "fetch", "pull", R, d)
    assert r.returncode == 130, r
    assert f"{d} was not changed" in r.stderr and "downloaded so far are kept" in r.stderr, r.stderr
    assert f"run `wdiff pull {R} {d}` again" in r.stderr and "resumes" in r.stderr, r.stderr
    doc = json.loads(ok("pull", "--json", R, d).stdout)
    assert tree(d) == tree(C)
    assert doc["downloaded_bytes"] < sizes["step-1"] + sizes["step-2"] + sizes["step-3"]  # the anchor resumed


def test_sigterm_and_json_carry_the_next_step(world):
    t, A, B, C, R, sizes = world
    d = _at_step2(world, "intr-term")
    r = interrupted(t, "patch", "pull", "--json", R, d, sig=signal.SIGTERM)
    assert r.returncode == 130
    doc = json.loads(r.stdout)
    assert doc["error"]["kind"] == "interrupted" and "finish the update" in doc["error"]["hint"], doc


def test_ctrl_c_in_an_in_place_apply_offers_to_finish_or_abort(world, tmp_path):
    t, A, B, C, R, sizes = world
    ok("pack", "-q", A, B, "-o", tmp_path / "ab.wdb")
    live = tmp_path / "live"
    ok("pull", "-q", R, live, "--to", "step-1")
    r = interrupted(tmp_path, "patch", "apply", tmp_path / "ab.wdb", live, "--in-place")
    assert r.returncode == 130, r
    assert "in place" in r.stderr, r.stderr
    assert f"wdiff apply {tmp_path / 'ab.wdb'} {live} --in-place --abort" in r.stderr, r.stderr
    assert wd("diff", live, A).returncode != 0  # refused meanwhile: neither version
    assert "rolled back" in ok("apply", tmp_path / "ab.wdb", live, "--in-place", "--abort").stdout
    assert tree(live) == tree(A)
    assert interrupted(tmp_path, "patch", "apply", tmp_path / "ab.wdb", live, "--in-place").returncode == 130
    assert "finished an interrupted apply" in ok("apply", tmp_path / "ab.wdb", live, "--in-place").stdout
    assert tree(live) == tree(B)


@pytest.mark.parametrize("after", [1, 6])  # its preamble (the writer's start), records
def test_ctrl_c_in_pack_and_read_only_commands(world, tmp_path, after):
    """The output is not created, and no temp is left beside it (one was,
    when Ctrl-C came while the bundle writer wrote its preamble)."""
    t, A, B, C, R, sizes = world
    out = tmp_path / "ab.wdb"
    r = interrupted(tmp_path, "bundle", "pack", A, B, "-o", out, extra={"SLOW_AFTER": str(after)})
    assert r.returncode == 130, r
    assert f"{out} was not created" in r.stderr and f"run `wdiff pack {A} {B} -o {out}` again" in r.stderr, r.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".ab.wdb")]
    r = interrupted(tmp_path, "fetch", "verify", B, "--remote", R, "--to", "step-2")
    assert r.returncode == 130 and "nothing was changed" in r.stderr, r.stderr


# -- 7: -v and -vv, labels, verify DIR -----------------------------------------------------


def test_verbose_pull_lists_the_plan_and_times_on_stderr(world):
    t, A, B, C, R, sizes = world
    quiet = ok("pull", R, t / "v0")
    verbose = ok("pull", "-v", R, t / "v1")
    very = ok("pull", "-vv", R, t / "v2")
    assert quiet.stderr == ""
    # stdout is the result, the same with -v: the plan goes to stderr
    assert verbose.stdout.replace("v1", "v0") == quiet.stdout
    err = verbose.stderr
    assert "is empty; step-3 (" in err and f"is the head on {R}" in err, err
    assert "plan: 3 bundles from an anchor, " in err and f"to download from {R}" in err, err
    for label, prev in (("step-1", "anchor"), ("step-2", "step-1 ("), ("step-3", "step-2 (")):
        assert any(line.strip().startswith(f"apply {prev}") and f"-> {label} (" in line for line in err.splitlines()), err
    assert "took " in err and "download " in err, err
    assert "objects/" not in err  # the parts are -vv's
    assert "objects/" in very.stderr and "download: " in very.stderr
    assert "updated" in quiet.stdout and "-> step-3 (" in quiet.stdout


def test_verbose_pull_on_a_terminal_keeps_stdout_for_the_result(world, tmp_path):
    t, A, B, C, R, sizes = world
    r = with_pty_stderr("pull", "-v", R, tmp_path / "tty", stdout_path=tmp_path / "out.txt")
    assert r.rc == 0, r
    assert r.out.startswith("updated ") and len(r.out.splitlines()) == 1, r.out
    assert "plan: 3 bundles from an anchor" in r.err, r.err


def test_verify_checks_a_directory_against_its_own_record(world):
    t, A, B, C, R, sizes = world
    d = _at_step2(world, "verify-rec")
    (d / "NOTES.txt").write_text("mine, not the checkpoint's")
    r = ok("verify", d)
    assert "is intact" in r.stdout and "state.json" in r.stdout
    (d / "config.json").write_bytes(b'{"step": 99}')
    r = wd("verify", d)
    assert r.returncode == 4 and "config.json: differs" in r.stderr and "--force" in r.stderr, r.stderr
    assert "NOTES.txt" not in r.stderr  # not the checkpoint's: never read
    r = wd("verify", A)
    assert r.returncode == 2 and "no record" in r.stderr and "--bundle" in r.stderr and "--remote" in r.stderr


def test_an_interrupted_push_says_how_to_tell_whether_it_landed(world, tmp_path):
    """A push waiting for the remote's lock (held here) gets Ctrl-C: the
    message says the chain write is the push's last step and how to see
    whether it happened; the remote is as it was."""
    from uxkit import interrupted_while_waiting

    t, A, B, C, R, sizes = world
    before = (R / "chain.json").read_bytes()
    r = interrupted_while_waiting(R / ".lock", signal.SIGINT, "push", "--anchor", C, R)
    assert r.rc == 130, r
    assert f"`wdiff log {R}` shows whether it was" in r.err and f"run `wdiff push --anchor {C} {R}` again" in r.err, r
    assert (R / "chain.json").read_bytes() == before


def test_a_label_from_the_remote_never_drives_the_terminal(world, tmp_path):
    """Labels come from the remote's chain: in messages and -v notes they
    are escaped, never written raw (THREATS class 1: state is input)."""
    import shutil

    t, A, B, C, R, sizes = world
    R2 = tmp_path / "R2"
    shutil.copytree(R, R2)
    chain = json.loads((R2 / "chain.json").read_bytes())
    for e in chain["entries"]:
        e["label"] = "step-\x1b]0;owned\x07\x1b[2J" + (e["label"] or "")
    (R2 / "chain.json").write_text(json.dumps(chain))
    for args in (["pull", "-vv", R2, tmp_path / "d"], ["status", tmp_path / "d", R2], ["pull", R2, tmp_path / "d"]):
        r = ok(*args)
        assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr, r
        assert "step-" in r.stdout + r.stderr
