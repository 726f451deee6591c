# with a trusted key, pull accepts only a chain and bundles it signed
wdiff push -q --anchor base signed-remote --label step-0 --sign keys/test.key
wdiff push -q sparse.wdb signed-remote --label step-1 --sign keys/test.key
wdiff pull signed-remote mirror --trusted-key keys/test.key.pub
diff -r -x .wdiff mirror sparse
# remote/ is not signed: refused, exit 4
wdiff pull remote mirror2 --trusted-key keys/test.key.pub
