"""A command line that never surprises, in scripts and at a terminal: the
result reaches stdout wherever stderr goes, every failure says why exactly
once (and under --json as one wdiff.error/1 document), the exit status means
what the table says, and messages say what is true.

Exit status: 0 ok, 1 differences (--exit-code), 2 usage, 3 not found,
4 integrity, 5 base mismatch, 6 remote, 7 auth, 8 busy, 9 I/O, 130 interrupted.
One test per item of the issue; each drives the real command line. (Copied
from the cli-ux branch: only the item the state-directory work owns, a
second apply --in-place; the others live in that branch.)"""

from __future__ import annotations

from factory import tree
from uxkit import Promises, copy_ckpt, ok, weights_tree, wdiff


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
