"""Threat model: signed chains against rollback, freeze, replay and
mix-and-match, with TUF's threat model as reference. The attacker controls
the storage of a remote (they can put back any file they ever saw, copy
another remote's files, edit chain.json) but not the signing key.

What a chain signature must cover (see DIAGNOSIS.md): the remote's identity
(chosen at its first push), a sequence number that grows with every push,
the digest of the previous chain, and a timestamp. A puller records, per
remote, the highest sequence it accepted, beside the checkpoint and in a
per-user place, and refuses to go back: with exit status 4 (integrity).

Every test drives the real command line; each user's state lives in its own
directory (WDIFF_STATE_DIR, XDG_STATE_HOME and HOME point there).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from factory import rand, simple_pair, tree, write_ckpt
from threatlib import OnOpen, minisign, ok, read_chain, user_env, wdiff, write_chain

#: every test here pushes, signs and pulls a few versions as two users: seconds each
pytestmark = pytest.mark.slow

INTEGRITY = 4


@pytest.fixture
def world(tmp_path):
    """Two versions A -> B, a key pair, a remote, and a first user."""
    A, B = simple_pair(tmp_path)
    user = user_env(tmp_path / "user1")
    ok(wdiff("keygen", tmp_path / "key", "-q", env=user))
    return {
        "tmp": tmp_path, "A": Path(A), "B": Path(B), "key": tmp_path / "key", "pub": tmp_path / "key.pub",
        "remote": tmp_path / "remote", "user": user,
    }


def other_user(w, name: str) -> dict:
    return user_env(w["tmp"] / name)


def push_v1_v2(w) -> bytes:
    """Push A (anchor) then B, both signed; returns chain.json as it was
    after the first push (its signature object stays on the remote)."""
    ok(wdiff("push", "--sign", w["key"], "--anchor", w["A"], w["remote"], "-q", env=w["user"]))
    v1 = (w["remote"] / "chain.json").read_bytes()
    ok(wdiff("push", "--sign", w["key"], "--base", w["A"], w["B"], w["remote"], "-q", env=w["user"]))
    return v1


def third_checkpoint(w, name="C", seed=7) -> Path:
    rng = np.random.default_rng(seed)
    return Path(write_ckpt(w["tmp"] / name, {"w": rand(rng, "BF16", (128, 64)), "b": rand(rng, "F32", (64,))},
                           companions={"config.json": f'{{"name": "{name}"}}'.encode()}))


# -- rollback -----------------------------------------------------------------------------------


def test_rollback_to_an_older_signed_chain_is_refused_by_pull(world):
    w = world
    v1 = push_v1_v2(w)
    d = w["tmp"] / "D"
    ok(wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], "-q", env=w["user"]))
    assert tree(d) == tree(w["B"])
    (w["remote"] / "chain.json").write_bytes(v1)  # the old index; its signature is still there

    # precondition: the replayed index is validly signed; someone who never
    # saw V2 cannot tell, and accepts it (trust on first use)
    e = w["tmp"] / "E"
    ok(wdiff("pull", w["remote"], e, "--trusted-key", w["pub"], "-q", env=other_user(w, "newcomer")))
    assert tree(e) == tree(w["A"])

    # D recorded that it holds sequence 2 of this remote: going back to 1 is
    # refused even when the per-user record is gone (another user, a wiped home)
    r = wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], env=other_user(w, "user1-wiped"))
    assert tree(d) == tree(w["B"]), "the pull downgraded the directory from V2 to V1\n" + str(r)
    assert r.rc == INTEGRITY, str(r)


def test_rollback_is_refused_for_a_fresh_directory_by_the_user_state(world):
    w = world
    v1 = push_v1_v2(w)
    ok(wdiff("pull", w["remote"], w["tmp"] / "D", "--trusted-key", w["pub"], "-q", env=w["user"]))
    (w["remote"] / "chain.json").write_bytes(v1)
    # the same user, a new directory: the per-user record of the remote says 2
    e = w["tmp"] / "E"
    r = wdiff("pull", w["remote"], e, "--trusted-key", w["pub"], env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert not e.exists(), "a refused pull left a directory behind"


def test_status_refuses_a_rolled_back_chain_instead_of_saying_up_to_date(world):
    w = world
    v1 = push_v1_v2(w)
    d = w["tmp"] / "D"
    ok(wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], "-q", env=w["user"]))
    (w["remote"] / "chain.json").write_bytes(v1)
    # status with a configured trusted key (WDIFF_TRUSTED_KEYS is the default
    # of --trusted-key) must check what pull checks
    env = user_env(w["tmp"] / "user1", trusted_keys=[w["pub"]])
    r = wdiff("status", d, w["remote"], "--json", env=env)
    assert r.rc == INTEGRITY, str(r)
    assert '"up_to_date": true' not in r.stdout


def test_signed_push_onto_a_rolled_back_chain_is_refused(world):
    """Rolling the index back under a pusher must not make its next signed
    push erase history (here: drop B from the chain)."""
    w = world
    v1 = push_v1_v2(w)
    (w["remote"] / "chain.json").write_bytes(v1)
    c = third_checkpoint(w)
    r = wdiff("push", "--sign", w["key"], "--anchor", c, w["remote"], env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert (w["remote"] / "chain.json").read_bytes() == v1, "the push published a chain that forgets B"


# -- mix and match: another remote's files served under this remote's name ---------------------


def make_remote_y(w) -> Path:
    """A second remote signed with the same key, with more pushes than X
    (so a sequence check alone does not catch it)."""
    a2, b2 = simple_pair(w["tmp"] / "other", seed=3)
    y = w["tmp"] / "remote-y"
    ok(wdiff("push", "--sign", w["key"], "--anchor", a2, y, "-q", env=w["user"]))
    ok(wdiff("push", "--sign", w["key"], "--base", a2, b2, y, "-q", env=w["user"]))
    ok(wdiff("push", "--sign", w["key"], "--anchor", b2, y, "-q", env=w["user"]))
    return y


def serve_as(src: Path, dest: Path) -> None:
    shutil.rmtree(dest)
    shutil.copytree(src, dest)


def test_another_remotes_chain_served_as_this_remote_is_refused(world):
    w = world
    push_v1_v2(w)
    y = make_remote_y(w)
    d = w["tmp"] / "D"
    ok(wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], "-q", env=w["user"]))
    serve_as(y, w["remote"])
    # D knows which remote it came from, whatever the per-user state says
    r = wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], env=other_user(w, "user1-wiped"))
    assert tree(d) == tree(w["B"]), "the puller got the other remote's model\n" + str(r)
    assert r.rc == INTEGRITY, str(r)


def test_another_remotes_chain_served_to_a_fresh_directory_is_refused_by_the_user_state(world):
    w = world
    push_v1_v2(w)
    y = make_remote_y(w)
    ok(wdiff("pull", w["remote"], w["tmp"] / "D", "--trusted-key", w["pub"], "-q", env=w["user"]))
    serve_as(y, w["remote"])
    e = w["tmp"] / "E"
    r = wdiff("pull", w["remote"], e, "--trusted-key", w["pub"], env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert not e.exists()


# -- freeze --------------------------------------------------------------------------------------


def test_frozen_remote_is_refused_with_max_age(world):
    """A remote that keeps serving an old (validly signed) index forever:
    --max-age refuses an index signed longer ago than that."""
    w = world
    ok(wdiff("push", "--sign", w["key"], "--anchor", w["A"], w["remote"], "-q", env=w["user"]))
    pushed = time.monotonic()
    d = w["tmp"] / "D"
    ok(wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], "--max-age", "1h", "-q", env=w["user"]))
    assert tree(d) == tree(w["A"])
    time.sleep(max(0.0, 2.5 - (time.monotonic() - pushed)))  # signed timestamps have 1 s resolution
    e = w["tmp"] / "E"
    r = wdiff("pull", w["remote"], e, "--trusted-key", w["pub"], "--max-age", "1s", env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert not e.exists()


# -- pushes that would sign what nobody checked ------------------------------------------------


def test_unsigned_push_onto_a_signed_chain_is_refused(world):
    w = world
    ok(wdiff("push", "--sign", w["key"], "--anchor", w["A"], w["remote"], "-q", env=w["user"]))
    before = (w["remote"] / "chain.json").read_bytes()
    r = wdiff("push", "--base", w["A"], w["B"], w["remote"], env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert (w["remote"] / "chain.json").read_bytes() == before


def test_push_sign_refuses_to_resign_a_chain_the_storage_owner_altered(world):
    w = world
    ok(wdiff("push", "--sign", w["key"], "--anchor", w["A"], w["remote"], "-q", env=w["user"]))
    chain = read_chain(w["remote"])
    chain["entries"][0]["label"] = "release-approved"  # not something the key holder said
    tampered = write_chain(w["remote"], chain)
    r = wdiff("push", "--sign", w["key"], "--base", w["A"], w["B"], w["remote"], env=w["user"])
    assert r.rc == INTEGRITY, "push --sign signed a chain it did not verify\n" + str(r)
    assert (w["remote"] / "chain.json").read_bytes() == tampered


# -- apply: what the signature says, and which bytes it covers ---------------------------------


def test_apply_refuses_a_signature_whose_trusted_comment_is_not_this_bundles(world):
    """A valid signature by the trusted key over these exact bytes, but made
    for another purpose: its trusted comment does not name this bundle."""
    w = world
    bundle = w["tmp"] / "d.wdb"
    ok(wdiff("pack", w["A"], w["B"], "-o", bundle, "-q", env=w["user"]))
    info = json.loads(ok(wdiff("info", bundle, "--json", env=w["user"])).stdout)
    # control: the same helper with the comment wdiff defines is accepted
    minisign(bundle, w["key"], f"wdiff bundle {info['bundle_id']} base {info['base_fingerprint']} "
                               f"target {info['target_fingerprint']}")
    ok(wdiff("apply", bundle, w["A"], "-o", w["tmp"] / "good", "--trusted-key", w["pub"], "-q", env=w["user"]))
    minisign(bundle, w["key"], "wdiff chain 00000000000000000000000000000000")
    out = w["tmp"] / "out"
    r = wdiff("apply", bundle, w["A"], "-o", out, "--trusted-key", w["pub"], env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert not out.exists()


def test_apply_checks_the_signature_on_the_bytes_it_applies(world):
    """Swap the bundle file for an unsigned one right after wdiff opens it to
    check the signature: whatever it then applies must be what it checked."""
    w = world
    signed, unsigned = w["tmp"] / "signed.wdb", w["tmp"] / "unsigned.wdb"
    ok(wdiff("pack", w["A"], w["B"], "-o", signed, "-q", env=w["user"]))
    ok(wdiff("sign", signed, "--key", w["key"], "-q", env=w["user"]))
    c = w["tmp"] / "C"
    shutil.copytree(w["B"], c)
    (c / "config.json").write_bytes(b'{"step": 2, "backdoor": true}')
    ok(wdiff("pack", w["A"], c, "-o", unsigned, "-q", env=w["user"]))
    swaps = 0
    for k in range(3):
        work = w["tmp"] / f"try{k}"
        work.mkdir()
        shutil.copy(signed, work / "b.wdb")
        shutil.copy(str(signed) + ".minisig", work / "b.wdb.minisig")
        shutil.copy(unsigned, work / ".swap.wdb")
        out = w["tmp"] / f"out{k}"
        with OnOpen(work, "b.wdb", lambda work=work: (work / ".swap.wdb").rename(work / "b.wdb")) as watch:
            r = wdiff("apply", work / "b.wdb", w["A"], "-o", out, "--trusted-key", w["pub"], env=w["user"])
        swaps += watch.fired.is_set()
        if r.rc == 0:
            assert tree(out) != tree(c), f"try {k}: applied the unsigned bundle\n{r}"
            assert tree(out) == tree(w["B"]), str(r)
        else:
            assert r.rc == INTEGRITY, str(r)
            assert not out.exists()
    assert swaps, "the harness never swapped the file: the test proved nothing"
