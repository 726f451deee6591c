# a bundle applied to another base: exit 5, nothing written
wdiff apply sparse.wdb dense -o out
test ! -e out
