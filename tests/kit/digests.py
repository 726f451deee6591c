"""Digests the tests compare: SHA-256 of bytes (an independent hash: not
the XXH3-128 wdiff itself checks with), and of a PyTorch state dict's
tensors, byte for byte (torch imported only when asked)."""

from __future__ import annotations

import hashlib


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_bytes(t) -> bytes:
    """A tensor's bytes as they lie in memory (any dtype, any shape)."""
    import torch

    return t.detach().reshape(-1).view(torch.uint8).numpy().tobytes()


def state_digest(sd: dict) -> str:
    """One SHA-256 over a state dict's names and tensors' bytes, in name order."""
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(tensor_bytes(sd[k]))
    return h.hexdigest()
