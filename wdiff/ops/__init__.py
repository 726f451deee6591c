"""The use cases, each a library call the command line wraps: diff, pack,
apply, squash, verify, inspect, push, pull, log and status. They compose the
layers below and never print."""
