# pack writes the committed golden bytes (cmp prints nothing when equal)
wdiff pack base sparse -o step.wdb
cmp step.wdb sparse.wdb
wdiff pack base struct -o struct2.wdb -v
cmp struct2.wdb struct.wdb
wdiff pack --anchor base -o base.wdb
cmp base.wdb anchor.wdb
