# diff, human form: a sparse step, then the same checkpoint twice
wdiff diff base sparse
wdiff diff base base
