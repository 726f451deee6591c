"""The remote use cases, each a library call the command line wraps: push,
pull, fetch, log and status, stage and commit, gc, trust, signatures on a
remote, rollback, and verify against a remote's version. They move bundles
between a checkpoint directory and a remote (wdiff.remotes) and run the
local use cases (wdiff.ops) on what they fetched; they never print."""
