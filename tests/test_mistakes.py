"""Ordinary mistakes, tried from the command line as a user makes them: each
exits with its documented status, says what went wrong, and names the next
step (on stderr as ``wdiff: hint:``, and as ``error.hint`` under --json),
and changes nothing on disk. Issue 30, mistakes 1-4 and 9.

Every test runs ``python -m wdiff`` in a child process (one on a
pseudo-terminal), against checkpoints, bundles and remotes made in code,
and a stand-in Hub (hubfake.py) on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from factory import mutate, rand, simple_pair, tree, write_ckpt
from kit.cli import run as kit_run
from kit.cli import run_pty_stderr

USAGE, NOT_FOUND, BASE_MISMATCH = 2, 3, 5


@dataclass
class Run:
    args: tuple
    rc: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"$ wdiff {' '.join(map(str, self.args))}\nexit {self.rc}\n--- stdout\n{self.out}--- stderr\n{self.err}"

    @property
    def hint(self) -> str:
        m = re.search(r"^wdiff: hint: (.*)$", self.err, re.M)
        return m.group(1) if m else ""

    @property
    def error(self) -> str:
        m = re.search(r"^wdiff: error: (.*)$", self.err, re.M)
        return m.group(1) if m else ""


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ, NO_COLOR="1", COLUMNS="100", HF_HUB_OFFLINE="1", WDIFF_THREADS="2")
    for k in ("WDIFF_DEBUG", "WDIFF_TRUSTED_KEYS", "HF_TOKEN", "HF_ENDPOINT"):
        env.pop(k, None)
    env.update(extra or {})
    return {k: v for k, v in env.items() if v is not None}


#: what every command here runs with, over kit.cli's plain environment
_WDIFF_ENV = {"COLUMNS": "100", "HF_HUB_OFFLINE": "1", "WDIFF_THREADS": "2", "HF_TOKEN": None, "HF_ENDPOINT": None}


def wdiff(*args, cwd, env: dict | None = None) -> Run:
    r = kit_run(*args, cwd=cwd, env={**_WDIFF_ENV, **(env or {})})
    return Run(args, r.rc, r.out, r.err)


def ok(*args, cwd, env: dict | None = None) -> Run:
    r = wdiff(*args, cwd=cwd, env=env)
    assert r.rc == 0, f"setup step failed:\n{r}"
    return r


def error_doc(r: Run) -> dict:
    doc = json.loads(r.out)
    assert doc["schema"] == "wdiff.error/1", r
    assert doc["error"]["exit_code"] == r.rc, r
    return doc["error"]


def snapshot(root: Path, *, state: bool = True) -> dict:
    """Every path under ``root`` with its bytes (None for a directory);
    without wdiff's own state folders (``.wdiff/``: its lock) unless ``state``."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if not state and ".wdiff" in p.relative_to(root).parts:
            continue
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = None
        else:
            out[rel] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A, B (checkpoints), step.wdb (A -> B), anchor.wdb (A whole),
    remote/ (v1 = A anchored, v2 = B), pulled/ (a pull of remote/)."""
    root = tmp_path_factory.mktemp("mistakes")
    A, B = simple_pair(root)
    os.rename(A, root / "A")
    os.rename(B, root / "B")
    ok("pack", "-q", "A", "B", "-o", "step.wdb", cwd=root)
    ok("pack", "-q", "--anchor", "A", "-o", "anchor.wdb", cwd=root)
    ok("push", "-q", "--anchor", "A", "remote", "--label", "v1", cwd=root)
    ok("push", "-q", "step.wdb", "remote", "--label", "v2", cwd=root)
    ok("pull", "-q", "remote", "pulled", cwd=root)
    return root


@pytest.fixture
def ws(work, tmp_path) -> Path:
    """A private copy of the workspace: a test may find something changed."""
    dst = tmp_path / "ws"
    shutil.copytree(work, dst, symlinks=True)
    return dst


# -- arguments of the wrong kind (mistake 3, as a class) ------------------------------------------
#
# (argv, words the message must hold, words the hint must hold: the command meant)

WRONG_KIND = {
    # a bundle where a remote belongs
    "pull BUNDLE NEWDIR": (["pull", "step.wdb", "new"], ["step.wdb", "bundle", "not a remote"], ["wdiff apply step.wdb"]),
    "pull BUNDLE CHECKPOINT": (["pull", "step.wdb", "A"], ["bundle", "not a remote"],
                               ["wdiff apply step.wdb A --in-place"]),
    "push BUNDLE BUNDLE": (["push", "step.wdb", "anchor.wdb"], ["anchor.wdb", "bundle", "not a remote"], ["wdiff push"]),
    "log BUNDLE": (["log", "step.wdb"], ["bundle", "not a remote"], ["wdiff info step.wdb"]),
    "status DIR BUNDLE": (["status", "pulled", "step.wdb"], ["bundle", "not a remote"],
                          ["wdiff verify pulled --bundle step.wdb"]),
    "verify --remote BUNDLE": (["verify", "pulled", "--remote", "step.wdb"], ["bundle", "not a remote"],
                               ["wdiff verify pulled --bundle step.wdb"]),
    "gc BUNDLE": (["gc", "step.wdb", "--keep-last", "1"], ["bundle", "not a remote"], ["wdiff push"]),
    "commit BUNDLE": (["commit", "step.wdb", "--stage", "s", "--expect", "2"], ["bundle", "not a remote"], ["wdiff push"]),
    "squash --remote BUNDLE": (["squash", "--remote", "step.wdb"], ["bundle", "not a remote"], ["wdiff push"]),
    # a checkpoint where a remote belongs
    "pull CHECKPOINT NEWDIR": (["pull", "A", "new"], ["A is a checkpoint directory", "not a remote"],
                               ["wdiff push --anchor A REMOTE", "wdiff pull REMOTE new"]),
    "log CHECKPOINT": (["log", "pulled"], ["checkpoint directory", "not a remote"], ["wdiff status pulled REMOTE"]),
    "status DIR CHECKPOINT": (["status", "pulled", "A"], ["checkpoint directory", "not a remote"],
                              ["wdiff diff A pulled"]),
    "push BUNDLE CHECKPOINT": (["push", "step.wdb", "B"], ["checkpoint directory", "not a remote"],
                               ["wdiff push step.wdb REMOTE"]),
    "verify --remote CHECKPOINT": (["verify", "pulled", "--remote", "B"], ["checkpoint directory", "not a remote"],
                                   ["wdiff diff B pulled"]),
    "gc CHECKPOINT": (["gc", "A", "--keep-last", "1"], ["checkpoint directory", "not a remote"], ["wdiff push"]),
    # a bundle where a checkpoint belongs
    "diff BUNDLE DIR": (["diff", "step.wdb", "B"], ["step.wdb is a bundle file", "not a checkpoint"],
                        ["wdiff info step.wdb", "wdiff apply step.wdb"]),
    "diff DIR BUNDLE": (["diff", "A", "step.wdb"], ["bundle", "not a checkpoint"], ["wdiff info step.wdb"]),
    "pack BUNDLE DIR": (["pack", "step.wdb", "B", "-o", "x.wdb"], ["bundle", "not a checkpoint"], ["wdiff squash"]),
    "pack --anchor BUNDLE": (["pack", "--anchor", "step.wdb", "-o", "x.wdb"], ["bundle", "not a checkpoint"],
                             ["wdiff squash"]),
    "apply BUNDLE BUNDLE": (["apply", "step.wdb", "anchor.wdb", "-o", "out"], ["anchor.wdb", "bundle", "not a checkpoint"],
                            ["wdiff squash step.wdb anchor.wdb"]),
    "verify BUNDLE": (["verify", "step.wdb"], ["bundle", "not a checkpoint"], ["wdiff info step.wdb"]),
    "push DIR --base BUNDLE": (["push", "B", "remote", "--base", "step.wdb"], ["bundle", "not a checkpoint"],
                               ["wdiff push step.wdb remote"]),
    "pull REMOTE BUNDLE": (["pull", "remote", "step.wdb"], ["bundle", "not a checkpoint directory"],
                           ["wdiff apply step.wdb"]),
    "status BUNDLE REMOTE": (["status", "step.wdb", "remote"], ["bundle", "not a checkpoint"], ["wdiff info step.wdb"]),
    # a remote where a checkpoint belongs
    "diff REMOTE DIR": (["diff", "remote", "B"], ["remote", "not a checkpoint directory"],
                        ["wdiff pull remote DIR", "wdiff log remote"]),
    "pack DIR REMOTE": (["pack", "A", "remote", "-o", "x.wdb"], ["remote", "not a checkpoint directory"],
                        ["wdiff pull remote"]),
    "apply BUNDLE REMOTE": (["apply", "step.wdb", "remote", "-o", "out"], ["not a checkpoint directory"],
                            ["wdiff pull remote"]),
    "verify REMOTE": (["verify", "remote"], ["not a checkpoint directory"], ["wdiff verify DIR --remote remote"]),
    "diff DIR hf:/org/name": (["diff", "A", "hf://org/name"], ["remote URL", "not a checkpoint directory"],
                              ["wdiff pull hf://org/name DIR"]),
    # a checkpoint or a remote where a bundle belongs
    "info CHECKPOINT": (["info", "A"], ["checkpoint directory", "not a bundle file"], ["wdiff verify A"]),
    "info REMOTE": (["info", "remote"], ["remote", "not a bundle file"], ["wdiff log remote"]),
    "sign CHECKPOINT": (["sign", "A", "--key", "no.key"], ["checkpoint directory", "not a bundle file"],
                        ["wdiff pack BASE A -o FILE --sign KEY"]),
    "squash CHECKPOINT": (["squash", "A", "step.wdb", "-o", "x.wdb"], ["checkpoint directory", "not a bundle file"],
                          ["wdiff pack"]),
    "squash REMOTE": (["squash", "remote", "-o", "x.wdb"], ["remote", "not a bundle file"],
                      ["wdiff squash --remote remote"]),
    "apply REMOTE DIR": (["apply", "remote", "A", "-o", "out"], ["remote", "not a bundle file"],
                         ["wdiff pull remote A"]),
    "verify --bundle CHECKPOINT": (["verify", "pulled", "--bundle", "B"], ["checkpoint directory", "not a bundle file"],
                                   ["wdiff diff B pulled"]),
    "verify --bundle REMOTE": (["verify", "pulled", "--bundle", "remote"], ["not a bundle file"],
                               ["wdiff verify pulled --remote remote"]),
    # two arguments swapped
    "pull CHECKPOINT REMOTE": (["pull", "pulled", "remote"], ["wrong order", "REMOTE comes first"],
                               ["wdiff pull remote pulled"]),
    "pull NEWDIR REMOTE": (["pull", "new", "remote"], ["wrong order"], ["wdiff pull remote new"]),
    "pull NEWDIR hf:/ORG/NAME": (["pull", "new", "hf://org/name"], ["wrong order"], ["wdiff pull hf://org/name new"]),
    "push REMOTE BUNDLE": (["push", "remote", "step.wdb"], ["wrong order"], ["wdiff push step.wdb remote"]),
    "push REMOTE DIR": (["push", "remote", "B", "--base", "A"], ["wrong order"], ["wdiff push B remote"]),
    "status REMOTE DIR": (["status", "remote", "pulled"], ["wrong order", "DIR comes first"],
                          ["wdiff status pulled remote"]),
    "apply DIR BUNDLE": (["apply", "A", "step.wdb", "-o", "out"], ["wrong order", "BUNDLE comes first"],
                         ["wdiff apply step.wdb A"]),
    # a URL that lost a slash, or a web address
    "pull hf:/ORG/NAME": (["pull", "hf:/org/name", "new"], ["hf:/org/name", "not a remote URL"],
                          ["did you mean hf://org/name?", "wdiff pull hf://org/name new"]),
    "pull hf:ORG/NAME": (["pull", "hf:org/name", "new"], ["not a remote URL"], ["wdiff pull hf://org/name new"]),
    "push DIR hf:/ORG/NAME": (["push", "B", "hf:/org/name", "--base", "A"], ["not a remote URL"],
                              ["wdiff push B hf://org/name"]),
    "log hf:/datasets/ORG/NAME": (["log", "hf:/datasets/org/name"], ["not a remote URL"],
                                  ["wdiff log hf://datasets/org/name"]),
    "status DIR s3:/BUCKET": (["status", "pulled", "s3:/bucket/p"], ["not a remote URL"],
                              ["wdiff status pulled s3://bucket/p"]),
    "log https://huggingface.co/ORG/NAME": (["log", "https://huggingface.co/org/name"], ["web page", "not a remote"],
                                            ["wdiff log hf://org/name"]),
    "pull huggingface.co/datasets/ORG/NAME/tree/dev": (["pull", "https://huggingface.co/datasets/org/name/tree/dev", "new"],
                                                       ["web page"], ["wdiff pull hf://datasets/org/name@dev new"]),
    # a checkpoint file where a bundle or a directory is published
    "push FILE.safetensors REMOTE": (["push", "A/model-00001-of-00002.safetensors", "remote"],
                                     ["checkpoint file", "not a bundle file or a checkpoint directory"],
                                     ["wdiff pack OLD A/model-00001-of-00002.safetensors -o STEP.wdb"]),
}


@pytest.mark.parametrize("case", sorted(WRONG_KIND))
def test_an_argument_of_the_wrong_kind_is_a_usage_error_naming_the_command_meant(ws, case):
    argv, said, hinted = WRONG_KIND[case]
    before = snapshot(ws)
    r = wdiff(*argv, "--json", cwd=ws)
    assert r.rc == USAGE, r
    doc = error_doc(r)
    assert doc["kind"] == "usage", r
    for words in said:
        assert words in doc["message"] and words in r.error, (words, str(r))
    assert doc["hint"] and doc["hint"] == r.hint, r
    for words in hinted:
        assert words in doc["hint"], (words, str(r))
    assert snapshot(ws) == before, f"{case} changed something on disk"


def test_the_hint_of_a_swapped_pull_runs_as_given(ws):
    """The command a hint names is the one that works: run it."""
    r = wdiff("pull", "new", "remote", "--json", cwd=ws)
    cmd = error_doc(r)["hint"].split()
    assert cmd[:2] == ["wdiff", "pull"]
    ok(*cmd[1:], cwd=ws)
    assert tree(ws / "new") == tree(ws / "B")


def test_what_a_right_argument_is_stays_accepted(ws):
    """The kinds are read from the disk, not guessed from names: a bundle
    without .wdb, a new directory remote, a checkpoint of one file."""
    shutil.copyfile(ws / "step.wdb", ws / "step")
    ok("apply", "step", "A", "-o", "out", cwd=ws)
    assert tree(ws / "out") == tree(ws / "B")
    ok("push", "-q", "--anchor", "A", "fresh-remote", cwd=ws)
    (ws / "empty").mkdir()
    ok("push", "-q", "--anchor", "A", "empty", cwd=ws)
    ok("diff", "A/model-00001-of-00002.safetensors", "B/model-00001-of-00002.safetensors", cwd=ws)
    ok("pull", "-q", "remote", "A", cwd=ws)  # a checkpoint at a version the remote knows


def test_a_fifo_planted_where_a_remote_or_a_bundle_goes_is_never_read(ws):
    """What an argument is, is found without reading a FIFO (which would
    block): refused as a file (a remote's place) or by the bundle reader."""
    os.mkfifo(ws / "step.wdb.fifo")
    r = wdiff("pull", "step.wdb.fifo", "new", cwd=ws)
    assert r.rc == USAGE and "is a file, not a remote" in r.err and r.hint, r
    r = wdiff("info", "step.wdb.fifo", cwd=ws)
    assert r.rc == 4 and "not a regular file" in r.err, r


def test_a_url_that_lost_a_slash_creates_no_folder_through_the_library(ws):
    """open_remote, below the command line: hf:/org/name is not turned into
    a local folder "hf:" by a push."""
    code = ("import wdiff, sys\n"
            "try:\n    wdiff.push('A', 'hf:/org/name', anchor=True)\n"
            "except wdiff.errors.UsageError as e:\n    print(e.hint); sys.exit(2)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, env=_env(), timeout=120)
    assert p.returncode == 2 and b"hf://org/name" in p.stdout, p
    assert not (ws / "hf:").exists()


# -- a version the remote does not hold (mistake 9) ------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["pull", "remote", "new", "--to", "step-99"],
    ["status", "pulled", "remote", "--to", "step-99"],
    ["verify", "pulled", "--remote", "remote", "--to", "step-99"],
    ["gc", "remote", "--keep-last", "1", "--keep", "step-99", "--dry-run"],
    ["squash", "--remote", "remote", "--from", "step-99"],
    ["pull", "remote", "new", "--to", "HEAD~7"],
])
def test_no_such_version_names_the_remote_and_how_to_list_its_versions(ws, argv):
    r = wdiff(*argv, "--json", cwd=ws)
    assert r.rc == NOT_FOUND, r
    doc = error_doc(r)
    assert "on remote" in doc["message"] and ("step-99" in doc["message"] or "HEAD~7" in doc["message"]), r
    assert doc["hint"] == "`wdiff log remote` lists its versions and their labels", r
    assert not (ws / "new").exists()


# -- a wrong base, and a directory already at the target (mistake 4) -------------------------------


def other_version(ws: Path) -> Path:
    """C: A with one tensor file changed, neither the base nor the target of step.wdb."""
    c = ws / "C"
    shutil.copytree(ws / "A", c)
    shard = c / "model-00001-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1  # one bit of the last tensor's data
    shard.write_bytes(bytes(raw))
    return c


@pytest.mark.parametrize("mode", ["-o", "--in-place"])
def test_a_wrong_base_names_both_fingerprints_and_the_next_step(ws, mode):
    other_version(ws)
    fp = {d: json.loads(ok("diff", "--json", d, d, cwd=ws).out)["a"]["fingerprint"][:16] for d in ("A", "B", "C")}
    before = snapshot(ws, state=False)
    argv = ["apply", "step.wdb", "C", "--json"] + (["-o", "out"] if mode == "-o" else ["--in-place"])
    r = wdiff(*argv, cwd=ws)
    assert r.rc == BASE_MISMATCH, r
    doc = error_doc(r)
    assert doc["kind"] == "base-mismatch"
    # the directory's fingerprint, the bundle's base and its target, in the message
    assert f"it is {fp['C']}" in doc["message"] and f"turns {fp['A']} into {fp['B']}" in doc["message"], r
    # and what to do: the bundle made from what C is, or C brought to the bundle's base
    assert doc["hint"] and f"bundle made from {fp['C']}" in doc["hint"], r
    assert f"wdiff pull REMOTE C --to {fp['A']}" in doc["hint"], r
    assert snapshot(ws, state=False) == before


def test_a_directory_at_the_target_is_said_to_be_so_with_o_and_in_place(ws):
    shutil.copytree(ws / "B", ws / "B2")
    r = wdiff("apply", "step.wdb", "B2", "-o", "out", "--json", cwd=ws)
    assert r.rc == BASE_MISMATCH, r  # nothing was written to OUT: not a success
    doc = error_doc(r)
    assert "already at the bundle's target" in doc["message"] and "nothing to do" in doc["message"], r
    assert "out was not written" in doc["message"], r
    assert "--in-place" in doc["hint"] and "use it as it is" in doc["hint"], r
    assert not (ws / "out").exists()
    r = wdiff("apply", "step.wdb", "B2", "--in-place", cwd=ws)
    assert r.rc == 0 and "already at the target" in r.out and "nothing to do" in r.out, r
    assert tree(ws / "B2") == tree(ws / "B")


# -- --include where a checkpoint is read (mistake 2) ----------------------------------------------


def test_push_has_the_include_its_warning_names_and_verify_reads_what_a_version_holds(ws):
    shutil.copytree(ws / "B", ws / "B-trained")
    (ws / "B-trained" / "optimizer.pt").write_bytes(b"optimizer state")
    r = ok("push", "B-trained", "remote", "--base", "B", cwd=ws)
    assert "left out" in r.err and "--include PATTERN" in r.err, r  # no-op push: B-trained is B
    help_ = ok("push", "--help", cwd=ws).out
    assert "--include" in help_ and "--exclude" in help_
    ok("push", "-q", "B-trained", "remote", "--base", "B", "--include", "optimizer.pt", cwd=ws)
    ok("pull", "-q", "remote", "follower", cwd=ws)
    assert (ws / "follower" / "optimizer.pt").read_bytes() == b"optimizer state"
    r = ok("verify", "follower", "--remote", "remote", cwd=ws)  # not "optimizer.pt: missing"
    assert "intact" in r.out
    (ws / "follower" / "optimizer.pt").write_bytes(b"changed")
    r = wdiff("verify", "follower", "--remote", "remote", cwd=ws)
    assert r.rc == 4 and "optimizer.pt" in r.err, r
    r = wdiff("push", "step.wdb", "remote", "--include", "optimizer.pt", cwd=ws)
    assert r.rc == USAGE and "bundle" in r.err, r


# -- small ones (mistake 9) ------------------------------------------------------------------------


def test_pack_counts_one_file_in_the_singular(ws):
    shutil.copytree(ws / "B", ws / "B1")
    (ws / "B1" / "config.json").write_bytes(b'{"step": 3}')  # one companion file changes, nothing else
    r = ok("pack", "B", "B1", "-o", "one.wdb", cwd=ws)
    assert "; 1 file stored whole" in r.out, r
    r = ok("pack", "A", "B", "-o", "more.wdb", cwd=ws)
    assert re.search(r"; ([02-9]|\d\d+) files stored whole", r.out), r


def test_diff_stat_aligns_its_percentages(ws):
    rng = np.random.default_rng(1)
    a = {"small": rand(rng, "BF16", (64, 64)), "big": rand(rng, "BF16", (64, 64)), "gone": rand(rng, "F32", (4,))}
    b = {"small": mutate(a["small"], 0.01, rng), "big": mutate(a["big"], 0.2, rng), "new": rand(rng, "F32", (4,))}
    write_ckpt(ws / "sa", a)
    write_ckpt(ws / "sb", b)
    lines = [x for x in ok("diff", "--stat", "sa", "sb", cwd=ws).out.splitlines() if "|" in x]
    ends = {x.index("% changed") for x in lines if "% changed" in x}
    assert len([x for x in lines if "% changed" in x]) == 2 and len(ends) == 1, lines
    bars = {x.index("|") for x in lines}
    assert len(bars) == 1, lines


def test_pull_names_the_directory_as_status_does(ws):
    r = ok("pull", "remote", "mirror", cwd=ws)
    assert r.out.startswith("updated mirror:"), r
    assert str(ws) not in r.out
    r = ok("pull", "remote", "mirror", cwd=ws)
    s = ok("status", "mirror", "remote", cwd=ws)
    assert r.out.split()[0] == s.out.split()[0] == "mirror", (r, s)


# -- the same mistakes at a terminal ----------------------------------------------------------------


def _on_pty(*args, cwd) -> Run:
    """stderr on a pseudo-terminal (progress bars are drawn there), stdout a pipe."""
    r = run_pty_stderr(*args, cwd=cwd, env={**_WDIFF_ENV, "TERM": "xterm-256color"})
    return Run(args, r.rc, r.out, "\n".join(screen(r.err)))


def screen(raw: str) -> list[str]:
    """What a terminal shows after ``raw``: carriage returns, line feeds,
    cursor-up and erase-line honoured (what a transient progress display
    uses to take itself down), every other escape sequence dropped."""
    rows, r, col = [""], 0, 0
    for tok in re.split(r"(\x1b\[[0-9;?]*[A-Za-z]|\r|\n)", raw):
        if not tok:
            continue
        if tok == "\r":
            col = 0
        elif tok == "\n":
            r, col = r + 1, 0
            if r == len(rows):
                rows.append("")
        elif tok.startswith("\x1b["):
            if tok.endswith("A"):
                r = max(0, r - int(tok[2:-1] or 1))
            elif tok == "\x1b[2K":
                rows[r] = ""
        else:
            rows[r] = rows[r][:col].ljust(col) + tok + rows[r][col + len(tok):]
            col += len(tok)
    return [x.rstrip() for x in rows if x.strip()]


def test_at_a_terminal_the_message_and_the_hint_are_whole_lines(ws):
    """After a progress display (the wrong base is found while reading the
    base), the error and the hint are all the terminal shows: the display
    took itself down first."""
    other_version(ws)
    for argv, rc, hint in ((["pull", "step.wdb", "new"], USAGE, "wdiff apply step.wdb"),
                           (["apply", "step.wdb", "C", "-o", "out"], BASE_MISMATCH, "wdiff pull REMOTE C --to"),
                           (["apply", "step.wdb", "B", "-o", "out"], BASE_MISMATCH, "--in-place")):
        r = _on_pty(*argv, cwd=ws)
        assert r.rc == rc, r
        lines = r.err.splitlines()
        assert len(lines) == 2 and lines[0].startswith("wdiff: error: "), r
        assert lines[1].startswith("wdiff: hint: ") and hint in lines[1], r
        assert r.out == "", r


# -- a private Hub repository, pulled without a token (mistake 1) ---------------------------------


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from hubfake import FakeHub, block_internet

    block_internet(monkeypatch)
    with FakeHub(tmp_path / "hub") as h:
        yield h


def _hub_env(hub, home: Path, token: str | None) -> dict:
    home.mkdir(exist_ok=True)
    return {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": token, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"),
            "HF_XET_CACHE": str(home / "xet"), "HF_TOKEN_PATH": str(home / "token"),
            "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}


def test_a_private_repository_pulled_without_a_token_says_it_may_be_private(ws, hub, tmp_path):
    signed_in = _hub_env(hub, tmp_path / "home-in", hub.token)
    anonymous = _hub_env(hub, tmp_path / "home-out", None)
    r = ok("push", "--anchor", "A", "hf://acme/deltas", cwd=ws, env=signed_in)
    assert "private" in r.err, r  # what a first push makes, and says
    assert hub.repo("acme/deltas").private
    for argv in (["pull", "hf://acme/deltas", "new"], ["log", "hf://acme/deltas"],
                 ["status", "pulled", "hf://acme/deltas"]):
        r = wdiff(*argv, "--json", cwd=ws, env=anonymous)
        assert r.rc == NOT_FOUND, r
        doc = error_doc(r)
        assert "private" in doc["message"] and "no Hub token was sent" in doc["message"], r
        assert "hf auth login" in doc["hint"] and "HF_TOKEN" in doc["hint"], r
        assert hub.token not in r.out + r.err
    assert not (ws / "new").exists()
    # a typo, with a token: another message, for another next step
    r = wdiff("pull", "hf://acme/deltaz", "new", "--json", cwd=ws, env=signed_in)
    assert r.rc == NOT_FOUND, r
    doc = error_doc(r)
    assert "no Hub token" not in doc["message"] and "this token cannot read" in doc["message"], r
    assert "check the name" in doc["hint"], r
    # and once logged in, the same pull works
    ok("pull", "-q", "hf://acme/deltas", "new", cwd=ws, env=signed_in)
    assert tree(ws / "new") == tree(ws / "A")
