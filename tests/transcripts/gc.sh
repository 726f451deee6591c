# three versions, keep the newest: the anchor it needs is squashed first,
# the rest is listed as garbage and deleted by a gc after the grace period
wdiff push --anchor base r --label step-0
wdiff push sparse r --base base --label step-1
wdiff push dense r --base sparse --label step-2
wdiff gc r --keep-last 1 --dry-run
wdiff gc r --keep-last 1
wdiff log r
wdiff gc r --keep-last 1 --grace 0
