# two writers stage the files they hold; one commit publishes them as one version
wdiff push --anchor base r -q
wdiff push sparse r --base base --only '*.safetensors' --stage s1
wdiff push sparse r --base base --only '*.json' --stage s1
wdiff log r
wdiff commit r --stage s1 --expect 2 --label step-1
wdiff log r
