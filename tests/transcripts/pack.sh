# pack writes the committed golden bytes (cmp prints nothing when equal)
wdiff pack --format 1 base sparse -o step.wdb
cmp step.wdb sparse.wdb
wdiff pack --format 1 base struct -o struct2.wdb -v
cmp struct2.wdb struct.wdb
wdiff pack base struct -o struct3.wdb -v
cmp struct3.wdb v3-struct.wdb
wdiff pack --anchor base -o base.wdb
cmp base.wdb anchor.wdb
