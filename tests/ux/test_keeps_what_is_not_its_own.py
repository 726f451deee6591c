"""A command line that never surprises: wdiff changes what it manages and
nothing else. Local edits are not discarded without --force, files that are
not part of the checkpoint are kept, remotes and checkpoints are never
mistaken for each other, an existing file is not replaced silently, a
symbolic link stays a link, file modes survive, and no debris is left.

One test per item of the issue; each drives the real command line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from factory import simple_pair, tree
from kit.trees import write_tree
from uxkit import Promises, copy_ckpt, json_docs, listing, mode, ok, one_json_doc, weights_tree, wdiff

#: every scenario here is a dozen real commands on a user's directory
pytestmark = pytest.mark.slow


def _untracked(d: Path) -> dict[str, bytes]:
    """Files a user keeps beside the weights, none of them wdiff's."""
    files = {
        "NOTES.md": b"# eval notes\nlooks good at step 2\n",
        "eval/results.json": b'{"mmlu": 0.61}',
        ".git/HEAD": b"ref: refs/heads/main\n",
        ".git/config": b"[core]\n\tbare = false\n",
        ".cache/huggingface/download/model.safetensors.metadata": b"etag\n",
    }
    write_tree(d, files)
    return files


def test_pull_keeps_local_changes_and_files_it_does_not_manage(chain):
    B = tree(chain.B)
    with Promises() as p:
        # 1. only files the checkpoint does not have: a pull updates the
        #    weights with the delta and leaves the user's files alone
        d = chain.pull("plain", to="v1")
        extra = _untracked(d)
        r = wdiff("pull", "--json", chain.R, d)
        p.check(r.rc == 0, "a pull into a checkpoint with untracked files beside it succeeds", r)
        for rel, data in extra.items():
            p.check((d / rel).is_file() and (d / rel).read_bytes() == data, f"{rel} is kept as it was", r)
        got = {k: v for k, v in weights_tree(d).items() if k not in extra}
        p.check(got == B, "the checkpoint's own files are the new version", r)
        doc = one_json_doc(r.out) or {}
        p.check(doc.get("downloaded_bytes", chain.anchor_bytes) < chain.anchor_bytes,
                f"only the delta is downloaded, not the whole anchor ({chain.anchor_bytes} bytes)", r)

        # 2. a hand-edited file of the checkpoint: refused, named, nothing touched
        e = chain.pull("edited", to="v1")
        (e / "config.json").write_bytes(b'{"step": 1, "rope_scaling": "hand-tuned"}')
        extra = _untracked(e)
        before = tree(e)
        r = wdiff("pull", chain.R, e)
        p.check(r.rc != 0, "a pull over a locally modified file is refused by default", r)
        p.check("config.json" in r.err, "the refusal names the file that differs (config.json)", r)
        p.check("--force" in r.err, "the refusal says how to proceed (--force)", r)
        p.check(tree(e) == before, "a refused pull changes nothing, .git/ and .cache/ included", r)

        # 3. --force discards the local edit, keeps untracked files, and
        #    still downloads only the delta
        shutil.rmtree(e)
        e = chain.pull("edited", to="v1")
        (e / "config.json").write_bytes(b'{"step": 1, "rope_scaling": "hand-tuned"}')
        extra = _untracked(e)
        r = wdiff("pull", "--force", "--json", chain.R, e)
        p.check(r.rc == 0, "pull --force over a local edit succeeds", r)
        p.check((e / "config.json").exists() and (e / "config.json").read_bytes() == B["config.json"],
                "--force replaces the edited config.json with the version's", r)
        for rel, data in extra.items():
            p.check((e / rel).is_file() and (e / rel).read_bytes() == data,
                    f"--force still keeps {rel} (untracked files are kept, as rsync without --delete)", r)
        doc = one_json_doc(r.out) or {}
        p.check(doc.get("downloaded_bytes", chain.anchor_bytes) < chain.anchor_bytes,
                "--force over one edited companion file downloads the delta, not a whole anchor", r)


def test_remotes_and_checkpoints_are_not_mistaken_for_each_other(chain):
    with Promises() as p:
        # push --anchor A B, with B a checkpoint: B must not become a remote
        ckpt = copy_ckpt(chain.B, chain.tmp / "ckpt-B")
        before = tree(ckpt)
        r = wdiff("push", "--anchor", chain.A, ckpt)
        p.check(r.rc != 0, "pushing to a directory that holds a checkpoint is refused", r)
        p.check(not (ckpt / "chain.json").exists() and not (ckpt / "objects").exists(),
                "the checkpoint gets no chain.json and no objects/", r)
        p.check(tree(ckpt) == before, "the checkpoint is unchanged", r)

        # push --anchor REMOTE NEW: a remote is not a checkpoint to publish
        new = chain.tmp / "new-remote"
        r = wdiff("push", "--anchor", chain.R, new)
        p.check(r.rc != 0, "pushing a directory that holds a remote (chain.json, objects/) is refused", r)
        p.check(not (new / "chain.json").exists(), "nothing is published from it", r)

        # pull into a directory that holds a remote: the remote survives
        other = copy_ckpt(chain.R, chain.tmp / "other-remote")
        before = tree(other)
        r = wdiff("pull", chain.R, other)
        p.check(r.rc != 0, "pulling into a directory that holds a remote is refused", r)
        p.check(tree(other) == before, "that remote's chain.json and objects/ are untouched", r)


def test_pack_does_not_replace_an_existing_file(chain):
    out = chain.tmp / "step-2.wdb"
    out.write_bytes(b"last week's bundle, the only copy")
    with Promises() as p:
        r = wdiff("pack", chain.A, chain.B, "-o", out)
        p.check(r.rc != 0, "pack -o onto an existing file is refused", r)
        p.check(out.read_bytes() == b"last week's bundle, the only copy", "the existing file is untouched", r)
        p.check("--force" in r.err, "the refusal says how to replace it (--force)", r)
        r = wdiff("pack", "--force", chain.A, chain.B, "-o", out)
        p.check(r.rc == 0, "pack --force replaces it", r)
        p.check(r.rc == 0 and wdiff("info", "-q", out).rc == 0, "and what replaced it is a valid bundle", r)


def test_pull_into_a_symlinked_directory_updates_its_target(chain):
    B = tree(chain.B)
    other_a, _ = simple_pair(chain.tmp / "unrelated", seed=7)  # a checkpoint the remote never saw
    site = chain.tmp / "site"
    site.mkdir()
    with Promises() as p:
        # the link's target holds something the remote cannot reach by deltas
        copy_ckpt(other_a, site / "v17")
        (site / "current").symlink_to("v17")
        before_listing, before_tree = listing(site), tree(site / "v17")
        r = wdiff("pull", chain.R, site / "current")
        p.check("unexpected error" not in r.err, "a pull through a symlink does not crash", r)
        p.check((site / "current").is_symlink() and os.readlink(site / "current") == "v17",
                "the link survives a refused pull", r)
        p.check(r.rc == 0 or tree(site / "v17") == before_tree, "a refused pull leaves v17 as it was", r)
        p.check(listing(site) == before_listing, f"no debris beside the link: {sorted(listing(site) - before_listing)}", r)

        r = wdiff("pull", "--force", chain.R, site / "current")
        p.check(r.rc == 0, "pull --force through a symlinked directory succeeds", r)
        p.check((site / "current").is_symlink() and os.readlink(site / "current") == "v17",
                "the link survives and still points at v17", r)
        p.check(weights_tree(site / "v17") == B, "v17, the link's target, was updated in place to the new version", r)
        p.check(listing(site) == before_listing, f"no debris beside the link: {sorted(listing(site) - before_listing)}", r)

        # --atomic: the new version is built beside the old one and the link flipped
        w = chain.pull("w1", to="v1")
        (site / "live").symlink_to(w)
        before = listing(site)
        r = wdiff("pull", "--atomic", chain.R, site / "live")
        p.check(r.rc == 0, "pull --atomic through a symlink succeeds", r)
        p.check((site / "live").is_symlink(), "with --atomic the link survives (it is flipped, not replaced)", r)
        p.check((site / "live").is_dir() and weights_tree(site / "live") == B, "it points at the new version", r)
        new = listing(site) - before
        target = os.path.basename(os.path.realpath(site / "live"))
        p.check(new <= {target}, f"the flipped-to directory is the only new entry: {sorted(new)}", r)


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


def test_a_directory_the_remote_does_not_know_is_refused_unless_forced(chain):
    """No record of a pull and a version the remote does not know: nothing
    says which files are the checkpoint, so a pull would replace the user's
    work. It refuses, names the files and changes nothing; --force replaces
    it, keeping .git/ and .cache/."""
    d = copy_ckpt(chain.A, chain.tmp / "mine")  # a copy by hand: no record
    (d / "config.json").write_bytes(b'{"my": "fine-tune"}')
    (d / "NOTES.md").write_bytes(b"three weeks of GPU time")
    (d / ".git").mkdir()
    (d / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    before = tree(d)
    with Promises() as p:
        r = wdiff("pull", chain.R, d)
        p.check(r.rc == 5, "a pull into a directory at an unknown version is refused (exit 5)", r)
        p.check("does not know" in r.err and "NOTES.md" in r.err and "--force" in r.err,
                "the message says why, names the files and how to proceed", r)
        p.check(tree(d) == before and not (d / ".wdiff" / "pull").exists(),
                "and nothing was changed or downloaded", r)
        r = wdiff("pull", "--json", chain.R, d)
        doc = one_json_doc(r.out) or {}
        p.check(r.rc == 5 and (doc.get("error") or {}).get("kind") == "local-changes",
                "under --json the error document says local-changes", r)
        r = wdiff("pull", "--force", chain.R, d)
        p.check(r.rc == 0 and weights_tree(d) == tree(chain.B), "--force replaces it with the head", r)
        p.check((d / ".git" / "HEAD").read_bytes() == b"ref: refs/heads/main\n", "and keeps .git/", r)
