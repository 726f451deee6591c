# a usage error: exit 2, the message on stderr, nothing on stdout
wdiff pack base sparse
