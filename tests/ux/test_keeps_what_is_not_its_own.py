"""A command line that never surprises: wdiff changes what it manages and
nothing else. Local edits are not discarded without --force, files that are
not part of the checkpoint are kept, remotes and checkpoints are never
mistaken for each other, an existing file is not replaced silently, a
symbolic link stays a link, file modes survive, and no debris is left.

One test per item of the issue; each drives the real command line. (Copied
from the cli-ux branch: the items of the state-directory work that are done
here, file modes and debris. Local changes, --force and --atomic, remotes
mistaken for checkpoints and pack -o replacing a file stay in that branch.)"""

from __future__ import annotations

from pathlib import Path

from factory import tree
from uxkit import Promises, copy_ckpt, json_docs, listing, mode, ok, wdiff


def test_apply_and_pull_keep_file_modes(chain):
    def private(src, dst) -> Path:
        d = copy_ckpt(src, chain.tmp / dst)
        for f in d.rglob("*"):
            if f.is_file():
                f.chmod(0o600)
        return d

    M, N = private(chain.A, "M"), private(chain.B, "N")
    bundle = chain.tmp / "mn.wdb"
    ok("pack", "-q", M, N, "-o", bundle)
    kept = sorted(set(tree(M)) & set(tree(N)))  # files the base already had
    with Promises() as p:
        out = chain.tmp / "out"
        r = wdiff("apply", "-q", bundle, M, "-o", out)
        p.check(r.rc == 0, "apply -o works", r)
        for rel in kept:
            p.check(r.rc == 0 and mode(out / rel) == 0o600, f"apply -o: {rel} is 0600 like the checkpoint's, not "
                    f"{oct(mode(out / rel)) if (out / rel).exists() else 'missing'}")

        ip = private(chain.A, "inplace")
        r = wdiff("apply", "-q", bundle, ip, "--in-place")
        p.check(r.rc == 0, "apply --in-place works", r)
        for rel in kept:
            p.check(mode(ip / rel) == 0o600, f"apply --in-place: {rel} stays 0600, not {oct(mode(ip / rel))}")

        remote = chain.tmp / "private-remote"
        ok("push", "-q", "--anchor", M, remote)
        ok("push", "-q", N, remote, "--base", M)
        d = private(chain.A, "pulled")
        r = wdiff("pull", "-q", remote, d)
        p.check(r.rc == 0, "pull works", r)
        for rel in kept:
            p.check(mode(d / rel) == 0o600, f"pull: {rel} stays 0600, not {oct(mode(d / rel))}")


def test_no_debris_after_pull_push_or_failure(chain):
    with Promises() as p:
        # a pull leaves nothing beside its target
        site = chain.tmp / "site"
        site.mkdir()
        r = wdiff("pull", "-q", chain.R, site / "model")
        p.check(r.rc == 0, "the pull works", r)
        p.check(listing(site) == {"model"}, f"nothing is left beside the pulled directory: {sorted(listing(site))}", r)
        r = wdiff("pull", "-q", chain.R, site / "model")
        p.check(listing(site) == {"model"}, f"nor after a second pull: {sorted(listing(site))}", r)

        # a signed push leaves nothing beside the checkpoints it packed
        keys = chain.tmp / "keys"
        keys.mkdir()
        ok("keygen", "-q", keys / "release.key")
        work = chain.tmp / "work"
        work.mkdir()
        a, b = copy_ckpt(chain.A, work / "step-1"), copy_ckpt(chain.B, work / "step-2")
        r1 = wdiff("push", "-q", "--anchor", a, chain.tmp / "signed", "--sign", keys / "release.key")
        r2 = wdiff("push", "-q", b, chain.tmp / "signed", "--base", a, "--sign", keys / "release.key")
        p.check(r1.rc == 0 and r2.rc == 0, "signed pushes work", f"{r1}\n{r2}")
        p.check(listing(work) == {"step-1", "step-2"},
                f"no signature temp files beside the checkpoints: {sorted(listing(work) - {'step-1', 'step-2'})}")

        # a pull that fails after downloading leaves no staged downloads
        broken = copy_ckpt(chain.R, chain.tmp / "broken-remote")
        (log,) = json_docs(ok("log", "--json", broken).out)
        delta = next(e for e in log["entries"] if not e["anchor"])
        part = broken / delta["parts"][0]["path"]
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, other bytes: found only by its digest
        part.write_bytes(bytes(data))
        site2 = chain.tmp / "site2"
        site2.mkdir()
        r = wdiff("pull", broken, site2 / "model")  # needs the anchor, then the damaged delta
        p.check(r.rc == 4, "the damaged download is refused as an integrity failure", r)
        staged = [str(f.relative_to(site2)) for f in site2.rglob("*") if f.is_file()
                  and (".wdiff/pull" in f.as_posix() or f.suffix == ".wdb" or ".part" in f.name)]
        p.check(not staged, f"no staged downloads are left after the failure: {staged}", r)
        p.check(not {n for n in listing(site2) if n != "model"},
                f"nothing is left beside the target: {sorted(listing(site2))}", r)
