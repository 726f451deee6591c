# a path that does not exist: exit 3
wdiff diff base nosuch
