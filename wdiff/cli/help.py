"""Examples and exit-status notes of every command: one source for --help
(epilogs) and for the generated man pages."""

from __future__ import annotations

EXAMPLES: dict[str, list[str]] = {
    "diff": [
        "wdiff diff ckpt/step-100 ckpt/step-101",
        "wdiff diff --stat ckpt/step-100 ckpt/step-101",
        "wdiff diff --json A B | jq .totals.changed_fraction",
        "wdiff diff -q --exit-code A B || echo 'weights moved'",
    ],
    "pack": [
        "wdiff pack ckpt/step-100 ckpt/step-101 -o step-101.wdb",
        "wdiff pack --anchor ckpt/step-100 -o step-100.anchor.wdb",
        "# at the end of every training step:",
        'wdiff pack -q "ckpt/$PREV" "ckpt/$STEP" -o "deltas/$STEP.wdb"',
    ],
    "apply": [
        "wdiff apply step-101.wdb ckpt/step-100 -o ckpt/step-101",
        "wdiff apply step-101.wdb /models/live --in-place",
        "wdiff apply step-100.anchor.wdb -o ckpt/step-100",
        "# roll back an interrupted in-place apply:",
        "wdiff apply step-101.wdb /models/live --in-place --abort",
    ],
    "push": [
        "wdiff push --anchor ckpt/step-100 hf://acme/policy --label step-100",
        "wdiff push ckpt/step-101 hf://acme/policy --base ckpt/step-100",
        "wdiff push step-101.wdb /mnt/shared/deltas",
        "# at the end of every training step:",
        'wdiff push -q "ckpt/$STEP" "$REMOTE" --base "ckpt/$PREV" --label "$STEP"',
        "# an anchor beside every 10th delta: new machines replay at most 9",
        'wdiff push "ckpt/$STEP" "$REMOTE" --base "ckpt/$PREV" --anchor-every 10',
    ],
    "commit": [
        "# on each of 8 hosts, for the shards it holds, signed with its key:",
        'wdiff push ckpt/102 "$R" --base ckpt/101 --only "$MINE" --stage s102 \\',
        '    --sign host.key',
        "# then once, on any host, trusting the writers' keys:",
        'wdiff commit "$R" --stage s102 --expect 8 --label step-102 \\',
        '    --sign release.key --trusted-key host.key.pub',
    ],
    "gc": [
        "wdiff gc hf://acme/policy --keep-last 20 --keep step-1000 --dry-run",
        "# nightly: keep a week of hourly versions and the releases",
        "wdiff gc /mnt/shared/deltas --keep-last 168 --keep v1.0 --keep v2.0",
    ],
    "pull": [
        "wdiff pull hf://acme/policy /models/policy",
        "wdiff pull hf://acme/policy /models/policy --trusted-key release.pub",
        "wdiff pull /mnt/shared/deltas /models/policy --to step-200",
        "# crontab: follow the head every 5 minutes, silent unless it fails",
        "*/5 * * * * wdiff pull -q hf://acme/policy /models/policy",
        "# current -> step-17: build each version beside it, switch the link,",
        "# keep the newest 3 version directories",
        "*/5 * * * * wdiff pull -q --atomic --keep 3 hf://acme/p /srv/p/current",
        "# follow a slime trainer's weight_vNNNNNN/ folders",
        "wdiff pull /mnt/slime/deltas /models/policy --layout hf-delta",
    ],
    "export": [
        "wdiff export hf://acme/policy /srv/weights --layout hf-delta",
        "wdiff export /mnt/shared/deltas s3://rl/policy --layout hf-delta",
        "# crontab: add each new version for SGLang's /pull_weights",
        "*/5 * * * * wdiff export -q hf://acme/policy /srv/weights --work /var/wd",
    ],
    "log": [
        "wdiff log hf://acme/policy",
        "wdiff log --json /mnt/shared/deltas | jq '.entries[0]'",
    ],
    "status": [
        "wdiff status /models/policy hf://acme/policy",
        "# crontab: pull only when behind",
        '*/5 * * * * wdiff status -q --exit-code D "$R" || wdiff pull -q "$R" D',
    ],
    "squash": [
        "wdiff squash 101.wdb 102.wdb 103.wdb --base ckpt/step-100 -o 100-103.wdb",
        "wdiff squash anchor-100.wdb 101.wdb 102.wdb -o anchor-102.wdb",
        "# nightly: a fresh anchor at the head, for machines that join late",
        "wdiff squash --remote hf://acme/policy",
    ],
    "verify": [
        "wdiff verify /models/policy --remote hf://acme/policy",
        "wdiff verify ckpt/step-101 --bundle step-101.wdb",
        "# crontab: check nightly, mail only on failure",
        "0 3 * * * wdiff verify -q /models/policy --remote hf://acme/policy",
    ],
    "keygen": [
        "wdiff keygen ~/.wdiff/release.key",
        'wdiff push ckpt/101 "$REMOTE" --base ckpt/100 --sign ~/.wdiff/release.key',
        "wdiff pull hf://acme/policy /models/policy --trusted-key release.key.pub",
    ],
    "sign": [
        "wdiff sign step-101.wdb --key ~/.wdiff/release.key",
        "minisign -Vm step-101.wdb -p release.key.pub    # checks it too",
        "wdiff apply step-101.wdb ckpt/step-100 -o out --trusted-key release.key.pub",
    ],
    "info": [
        "wdiff info step-101.wdb",
        "wdiff info --json step-101.wdb | jq .records",
    ],
    "demo": [
        "wdiff demo",
        "wdiff demo /tmp/wdiff-demo    # keep the files",
        "wdiff demo --size-mb 256 --json",
    ],
    "man": [
        "wdiff man",
        "wdiff man pull",
        "wdiff man format          # the bundle format's specification",
        "wdiff man diff > ~/.local/share/man/man1/wdiff-diff.1",
    ],
    "completion": [
        'source <(wdiff completion bash)',
        "wdiff completion bash > ~/.local/share/bash-completion/completions/wdiff",
        "wdiff completion zsh > ~/.zfunc/_wdiff",
        "wdiff completion fish > ~/.config/fish/completions/wdiff.fish",
    ],
}

EXIT_NOTES: dict[str, str] = {
    "diff": "0 done (and, with --exit-code, no differences); 1 only with --exit-code when the "
    "checkpoints differ; 2 a usage mistake, or a directory laid out in a way wdiff does not handle "
    "(a symlinked subdirectory, an unprintable file name: the hint says how to fix it); 3 A or B "
    "does not exist.",
    "pack": "0 the bundle was written; 2 and above are errors.",
    "apply": "0 the target was rebuilt and verified; 2 a usage mistake, such as BASE before "
    "BUNDLE; 5 the base is not the bundle's; 4 the bundle is corrupt; 8 an interrupted in-place apply must be "
    "finished first, or another apply is writing OUT.",
    "push": "0 pushed (or already there); 5 the bundle's base is not the head; 8 another push "
    "won the race (run it again); 6 and 7 remote errors.",
    "pull": "0 the directory is at the version (nothing to do counts); 8 another pull holds the "
    "directory; 4 a download was damaged (run again); 3 no such remote or version; 9 the disk lacks "
    "what the pull needs (it says how much, before it writes anything). With --layout hf-delta: 4 a "
    "checksum does not match, or an index, shard or frame is malformed; 5 a delta's base_version is not "
    "the version DIR holds, or DIR was changed since; 3 a version or a file its index names is missing; "
    "DIR is unchanged by every refusal.",
    "export": "0 written (or up to date); 3 no such remote or version; 4 a version written did not check out "
    "against the chain's digests (nothing of it is visible), or OUT holds a version wdiff did not write; 5 OUT's "
    "last version is not on the chain's history; 8 another export holds OUT.",
    "log": "0 listed; 3 the remote does not exist.",
    "commit": "0 published (or already there); 3 a part is missing (rerun its writer); 4 a part is "
    "unsigned, untrusted, damaged or not of this remote and stage; 5 two parts hold one file, the parts are not "
    "against the head, or a writer lacked the base file of a tensor it holds; 8 another push won the race.",
    "gc": "0 done (or nothing to do); 8 the chain moved while gc ran (run it again); 4 the chain is "
    "signed and no --sign KEY was given; 3 no such remote or version to --keep; 6 and 7 remote errors.",
    "status": "0 done (and, with --exit-code, up to date); 1 only with --exit-code when DIR is "
    "not at the version (behind it, ahead of it, or not there at all); 3 the remote or the version does not "
    "exist.",
    "squash": "0 written; 5 a bundle does not follow the previous one, or BASE is not the "
    "first one's base; 4 a bundle is corrupt.",
    "verify": "0 the directory is exactly what was recorded; 4 something differs (each "
    "difference is named on stderr; under --json, the wdiff.error/1 document holds verify's "
    "own as error.details).",
    "keygen": "0 the key pair was written; 2 a key is already there (never overwritten).",
    "sign": "0 the signature was written; 4 the bundle is corrupt.",
    "info": "0 the bundle is intact; 4 it is corrupt.",
    "demo": "0 the demo rebuilt the new checkpoint bit for bit.",
    "man": "0 the page was shown; 2 there is no such page.",
    "completion": "0 the script was printed; 2 an unknown shell.",
}


def epilog(command: str) -> str:
    lines = "\n".join("  " + e for e in EXAMPLES[command])
    return f"Examples:\n\n\b\n{lines}\n\nExit status: {EXIT_NOTES[command]} The full table is in wdiff --help."
