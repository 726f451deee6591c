# signing with the committed test key is deterministic (Ed25519)
wdiff pack --format 1 base sparse -o s.wdb --sign keys/test.key
cmp s.wdb.minisig signed.wdb.minisig
cat s.wdb.minisig
wdiff sign dense.wdb --key keys/test.key
