# one JSON document on stdout (one line, as stdout is not a terminal);
# relative_l2 is rounded by the runner (see README.md)
wdiff diff --json base struct
