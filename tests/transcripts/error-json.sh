# under --json an error is a wdiff.error/1 document on stdout too
wdiff diff --json base nosuch
