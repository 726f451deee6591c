# --in-place keeps its lock in live/.wdiff/, which is not part of the checkpoint
cp -r base live
wdiff apply sparse.wdb live --in-place
diff -r -x .wdiff live sparse
wdiff diff --exit-code -q live sparse
