"""What an apply returns, in copy mode and in place."""

from __future__ import annotations

from dataclasses import dataclass

from ...store.hashing import hexd

SCHEMA = "wdiff.apply/1"


@dataclass(frozen=True)
class ApplyResult:
    """What :func:`wdiff.apply` wrote (or rolled back), and the target it verified."""

    output: str
    bundle_id: bytes
    base_fingerprint: bytes | None
    target_fingerprint: bytes
    files: int
    bytes_written: int
    in_place: bool = False
    resumed: bool = False
    #: in place: the directory already was the target; nothing was written
    already: bool = False

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "output": self.output,
            "bundle_id": hexd(self.bundle_id),
            "base_fingerprint": hexd(self.base_fingerprint) if self.base_fingerprint else None,
            "target_fingerprint": hexd(self.target_fingerprint),
            "files": self.files,
            "bytes_written": self.bytes_written,
            "in_place": self.in_place,
            "resumed": self.resumed,
            "already": self.already,
        }
