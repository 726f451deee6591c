# diff --all lists the unchanged tensors too (0-d and empty tensors, ints)
wdiff diff --all base sparse
