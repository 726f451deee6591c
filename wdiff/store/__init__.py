"""Checkpoints on disk: scanning directories, safetensors headers, units of
work, block digests, manifests and their cache, block I/O. Knows no bundle."""
