# remote/ holds step-0 (anchor of base) and step-1 (sparse.wdb).
# pull into an empty directory, to an older version, then to the head
wdiff pull remote mirror
diff -r -x .wdiff mirror sparse
wdiff pull remote mirror
wdiff pull remote old --to step-0
diff -r -x .wdiff old base
wdiff pull --json remote old
diff -r -x .wdiff old sparse
