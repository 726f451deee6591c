"""The local use cases, each a library call the command line wraps: diff,
pack, apply, squash, reverse, verify against a bundle, inspect, and the
companion files' deltas. They work on checkpoints and bundles on this
machine, compose the layers below, never talk to a remote (wdiff.sync
does) and never print."""
