# --exit-code: 0 when identical, 1 when the checkpoints differ
wdiff diff --exit-code -q base base
wdiff diff --exit-code -q base dense || echo "exit $?"
wdiff diff --exit-code --stat base sparse
