# push an anchor, then deltas; pushing again does nothing
wdiff push --anchor base new-remote --label step-0
wdiff push sparse new-remote --base base --label step-1
wdiff push sparse.wdb new-remote
wdiff push --json struct.wdb new-remote --fork --label struct
ls new-remote new-remote/objects/*
