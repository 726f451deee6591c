wdiff apply --json sparse.wdb base -o out
