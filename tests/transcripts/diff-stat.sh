wdiff diff --stat base sparse
wdiff diff --stat base struct
