"""A command line that never surprises, in scripts and at a terminal: the
result reaches stdout wherever stderr goes, every failure says why exactly
once (and under --json as one wdiff.error/1 document), the exit status means
what the table says, and messages say what is true.

Exit status: 0 ok, 1 differences (--exit-code), 2 usage, 3 not found,
4 integrity, 5 base mismatch, 6 remote, 7 auth, 8 busy, 9 I/O, 130 interrupted.
One test per item of the issue; each drives the real command line."""

from __future__ import annotations

import re

import pytest

from factory import tree
from uxkit import (
    SIGNALS, Promises, copy_ckpt, interrupted_while_waiting, ok, one_json_doc, weights_tree, wdiff,
    with_pty_stderr,
)


def test_apply_in_place_twice_is_already_at_the_target(chain):
    bundle = chain.tmp / "step.wdb"
    ok("pack", "-q", chain.A, chain.B, "-o", bundle)
    d = copy_ckpt(chain.A, chain.tmp / "live")
    ok("apply", "-q", bundle, d, "--in-place")
    r = wdiff("apply", bundle, d, "--in-place")  # cron ran it again
    with Promises() as p:
        p.check(r.rc == 0, "a second apply --in-place of the same bundle exits 0", r)
        p.check("already" in r.out, "and says the directory is already at the target", r)
        p.check(weights_tree(d) == tree(chain.B), "the directory is still the target", r)


@pytest.mark.parametrize("case", ["diff", "squash --remote (fresh anchor)", "squash --remote (already one bundle)"])
def test_results_reach_stdout_when_stderr_is_a_terminal(chain, case):
    report = chain.tmp / "report.txt"
    if case == "diff":
        r = with_pty_stderr("diff", chain.A, chain.B, stdout_path=report)  # wdiff diff A B > report.txt
        expect = ["layer.0.w", "modified"]
    elif case == "squash --remote (fresh anchor)":
        r = with_pty_stderr("squash", "--remote", chain.R, stdout_path=report)
        expect = ["remote"]
    else:
        one = chain.tmp / "one-anchor"
        ok("push", "-q", "--anchor", chain.A, one)
        r = with_pty_stderr("squash", "--remote", one, stdout_path=report)
        expect = ["one-anchor"]
    with Promises() as p:
        p.check(r.rc == 0, f"{case} succeeds", r)
        p.check(report.stat().st_size > 0, f"`wdiff {case} > report.txt` writes the result to the file", r)
        for word in expect:
            p.check(word in r.out, f"the report holds the result ({word!r})", r)
        p.check("\x1b" not in r.out, "no terminal escape sequences (progress bars) in the report", r)


def _failure(chain, case):
    """(argv, expected exit status) of a command that fails in the way ``case`` says."""
    t, A, B, R = chain.tmp, chain.A, chain.B, chain.R
    if case == "usage: missing argument":
        return ("diff", "--json", A), 2
    if case == "usage: unknown option":
        return ("pack", "--json", "--no-such-option", A, B, "-o", t / "x.wdb"), 2
    if case == "usage: found by the command":
        return ("pack", "--json", A, "-o", t / "x.wdb"), 2
    if case == "not found":
        return ("diff", "--json", A, t / "nowhere"), 3
    if case == "integrity":
        (t / "junk.wdb").write_bytes(b"\x89WDIFF\r\n" + bytes(range(256)) * 8)
        return ("info", "--json", t / "junk.wdb"), 4
    if case == "base mismatch":
        ok("pack", "-q", A, B, "-o", t / "step.wdb")
        return ("apply", "--json", t / "step.wdb", B, "-o", t / "out"), 5
    if case == "verify finds problems":
        return ("verify", "--json", A, "--remote", R), 4
    raise AssertionError(case)


@pytest.mark.parametrize("case", [
    "usage: missing argument", "usage: unknown option", "usage: found by the command", "not found", "integrity",
    "base mismatch", "verify finds problems", "SIGINT", "SIGTERM",
])
def test_every_failure_says_why_once(chain, case):
    if case in SIGNALS:
        # a push to a directory remote waits for the remote's lock: a user
        # presses Ctrl-C (or a scheduler sends SIGTERM) while it waits
        bundle = chain.tmp / "anchor-B.wdb"
        ok("pack", "-q", "--anchor", chain.B, "-o", bundle)
        r = interrupted_while_waiting(chain.R / ".lock", SIGNALS[case], "push", "--json", bundle, chain.R)
        want = 130
    else:
        argv, want = _failure(chain, case)
        r = wdiff(*argv)
    with Promises() as p:
        p.check(r.rc == want, f"{case}: exit status {want}", r)
        p.check(r.err.strip() != "", f"{case}: a message on stderr says what went wrong", r)
        doc = one_json_doc(r.out)
        p.check(doc is not None, f"{case}: under --json, stdout is exactly one JSON document", r)
        if case != "verify finds problems":  # verify's own document lists the problems
            p.check(isinstance(doc, dict) and doc.get("schema") == "wdiff.error/1",
                    f"{case}: the document is a wdiff.error/1", r)
            p.check(isinstance(doc, dict) and doc.get("error", {}).get("exit_code") == r.rc,
                    f"{case}: the error document carries the exit status", r)


@pytest.mark.parametrize("case", ["status of a missing directory", "log of a checkpoint", "status ahead of --to",
                                  "a bare ORG/NAME"])
def test_messages_say_what_is_true(chain, case):
    with Promises() as p:
        if case == "status of a missing directory":
            r = wdiff("status", chain.tmp / "nowhere", chain.R)
            p.check("behind" not in r.out, "a directory that does not exist is not 'N bundles behind'", r)
            p.check(re.search(r"does not exist|doesn't exist|no such|not found|missing", r.text, re.I),
                    "it is said not to exist", r)
        elif case == "log of a checkpoint":
            r = wdiff("log", chain.A)
            p.check("no versions" not in r.text, "a checkpoint directory is not a remote with 'no versions yet'", r)
            p.check(r.rc != 0, "log of something that is not a remote fails", r)
            p.check(re.search(r"checkpoint|not a remote", r.err, re.I), "and says it is a checkpoint, not a remote", r)
        elif case == "status ahead of --to":
            d = chain.pull("at-v2")
            r = wdiff("status", d, chain.R, "--to", "v1")
            p.check(r.rc == 0, "status works", r)
            p.check("behind" not in r.out, "a directory at v2 is not 'behind' v1", r)
            p.check("ahead" in r.out, "it is said to be ahead of v1", r)
        else:
            r = wdiff("log", "you/model", cwd=chain.tmp)
            p.check(r.rc != 0, "there is no directory you/model", r)
            p.check("hf://you/model" in r.err, "the message asks: did you mean hf://you/model?", r)


@pytest.mark.parametrize("case", ["apply DIR BUNDLE -o OUT", "apply DIR BUNDLE --in-place",
                                  "control character in a file name", "symlinked subdirectory"])
def test_usage_mistakes_exit_2_with_a_hint(chain, case):
    bundle = chain.tmp / "step.wdb"
    with Promises() as p:
        if case.startswith("apply"):
            ok("pack", "-q", chain.A, chain.B, "-o", bundle)
            before = tree(chain.A)
            if case.endswith("-o OUT"):
                r = wdiff("apply", chain.A, bundle, "-o", chain.tmp / "out")
            else:
                r = wdiff("apply", chain.A, bundle, "--in-place")
            p.check(r.rc == 2, "arguments in the wrong order are a usage error (2), not an I/O error (9)", r)
            p.check("hint" in r.err, "with a hint (BUNDLE comes first)", r)
            p.check(tree(chain.A) == before, "nothing is touched", r)
        else:
            b = copy_ckpt(chain.B, chain.tmp / "B-odd")
            if case == "control character in a file name":
                (b / "notes\nfor step 2.txt").write_bytes(b"x")
            else:
                shared = chain.tmp / "shared-tokenizer"
                shared.mkdir()
                (shared / "tokenizer_config.json").write_bytes(b"{}")
                (b / "tokenizer").symlink_to(shared)
            r = wdiff("diff", chain.A, b)
            p.check(r.rc != 4, "a layout wdiff does not handle is not an integrity failure (4)", r)
            p.check(r.rc == 0 or (r.rc == 2 and "hint" in r.err),
                    "it is handled, or refused as a usage error (2) with a hint on how to fix it", r)


@pytest.mark.parametrize("size", ["20GiB", "1MiB", "1.5TiB", "20GB"])
def test_part_size_accepts_binary_units(chain, size):
    r = wdiff("push", "--json", "--part-size", size, "--anchor", chain.A, chain.tmp / "r")
    with Promises() as p:
        p.check(r.rc == 0, f"--part-size {size} is accepted", r)
        doc = one_json_doc(r.out) or {}
        p.check(doc.get("parts") == 1, "a small bundle is one part", r)
