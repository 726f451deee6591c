wdiff frobnicate
