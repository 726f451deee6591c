# apply rebuilds the target exactly (diff -r prints nothing when equal)
wdiff apply struct.wdb base -o out
diff -r out struct
wdiff apply anchor.wdb -o fresh
diff -r fresh base
wdiff apply -q signed.wdb base -o out3 --trusted-key keys/test.key.pub
diff -r out3 sparse
