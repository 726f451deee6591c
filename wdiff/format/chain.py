"""The chain of versions on a remote: which bundles exist, which version each
one leads from and to, and the head. Pure: JSON in, objects out.

``chain.json`` at the root of a remote::

    {"format": "wdiff-chain", "version": 1, "head": "<fingerprint>",
     "entries": [{"bundle": "<bundle id>", "version": "<target fingerprint>",
                  "parent": "<base fingerprint>" | null, "label": "step-101" | null,
                  "created": "2026-12-01T02:50:00Z", "size": 1234,
                  "parts": [{"path": "objects/ab/<id>.wdb", "size": 1234,
                             "digest": "<xxh3-128>"}]}, ...]}

An entry is an edge from ``parent`` to ``version``; an entry without a parent
is an *anchor*, a whole checkpoint. Entries are in push order. The layout is
specified in man/wdiff-format.5 (section REMOTES).
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass, replace

from ..errors import FormatError, NotFoundError
from ..paths import printable, validate_relpath
from ..store.hashing import hexd, unhex
from .records import canonical_json

FORMAT = "wdiff-chain"
VERSION = 1
#: bounds that keep a hostile index from exhausting memory; a real chain of
#: this size has pushed for months and wants squashing into a new anchor
MAX_CHAIN_BYTES = 32 * 1024 * 1024
MAX_ENTRIES = 50_000
MAX_LABEL = 256
#: HEAD~N in resolve
_BACK = re.compile(r"(?i:head)~([0-9]{1,6})")
OBJECTS = "objects"


@dataclass(frozen=True)
class Part:
    path: str  # relative to the remote root
    size: int
    digest: bytes

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "digest": hexd(self.digest)}


@dataclass(frozen=True)
class Entry:
    bundle: bytes  # bundle id
    version: bytes  # target fingerprint
    parent: bytes | None  # base fingerprint; None for an anchor
    parts: tuple[Part, ...]
    created: str
    label: str | None = None
    signature: str | None = None  # path of the bundle's .minisig object, when signed

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def anchor(self) -> bool:
        return self.parent is None

    def to_json(self) -> dict:
        d = {
            "bundle": hexd(self.bundle),
            "version": hexd(self.version),
            "parent": hexd(self.parent) if self.parent else None,
            "parts": [p.to_json() for p in self.parts],
            "size": self.size,
            "created": self.created,
            "label": self.label,
        }
        if self.signature is not None:
            d["signature"] = self.signature
        return d


def part_paths(bundle_id: bytes, n_parts: int) -> list[str]:
    h = hexd(bundle_id)
    if n_parts == 1:
        return [f"{OBJECTS}/{h[:2]}/{h}.wdb"]
    return [f"{OBJECTS}/{h[:2]}/{h}.wdb.{k:05d}" for k in range(n_parts)]


@dataclass(frozen=True)
class Chain:
    head: bytes | None
    entries: tuple[Entry, ...] = ()

    @property
    def versions(self) -> set[bytes]:
        return {e.version for e in self.entries}

    def entry(self, bundle_id: bytes) -> Entry | None:
        for e in self.entries:
            if e.bundle == bundle_id:
                return e
        return None

    def appended(self, e: Entry, *, head: bool = True) -> Chain:
        return replace(self, entries=self.entries + (e,), head=e.version if head else self.head)

    def encode(self) -> bytes:
        return canonical_json({
            "format": FORMAT,
            "version": VERSION,
            "head": hexd(self.head) if self.head else None,
            "entries": [e.to_json() for e in self.entries],
        }) + b"\n"

    @classmethod
    def decode(cls, raw: bytes | None, *, where: str) -> Chain:
        if raw is None:
            return cls(head=None)
        if len(raw) > MAX_CHAIN_BYTES or raw.count(b"{") > 3 * MAX_ENTRIES + 1:
            raise FormatError(
                f"{where}: chain index is larger than this wdiff accepts",
                hint="start a new remote from a fresh anchor",
            )
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise FormatError(f"{where}: chain index is not valid JSON") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise FormatError(f"{where}: not a wdiff chain index")
        if obj.get("version") != VERSION or type(obj.get("version")) is not int:
            raise FormatError(f"{where}: chain index version {obj.get('version')!r} is not supported", hint="upgrade wdiff")
        entries = obj.get("entries")
        if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
            raise FormatError(f"{where}: malformed chain entries")
        out = tuple(_entry(e, where) for e in entries)
        head = obj.get("head")
        head = unhex(head, where=where) if head is not None else None
        versions = {e.version for e in out}
        if (head is None) != (not out) or (head is not None and head not in versions):
            raise FormatError(f"{where}: chain head is not one of its versions")
        if len({e.bundle for e in out}) != len(out):
            raise FormatError(f"{where}: a bundle is listed twice")
        return cls(head=head, entries=out)

    # -- queries ---------------------------------------------------------------------

    def resolve(self, spec: str | None) -> bytes:
        """A version from a user's words: None or "head", "HEAD~N" (N
        versions before the head, case-insensitive), a label, a full
        fingerprint or an unambiguous prefix of at least 4 hex digits."""
        if spec is None or spec.lower() == "head":
            if self.head is None:
                raise NotFoundError("the remote has no versions yet")
            return self.head
        m = _BACK.fullmatch(spec)
        if m and not any(e.label == spec for e in self.entries):
            return self._back(int(m.group(1)), spec)
        labelled = [e.version for e in self.entries if e.label == spec]
        if labelled:
            return labelled[-1]
        s = spec.lower()
        if len(s) >= 4 and all(c in "0123456789abcdef" for c in s):
            hits = {v for v in self.versions if hexd(v).startswith(s)}
            if len(hits) == 1:
                return hits.pop()
            if len(hits) > 1:
                raise NotFoundError(f"version {printable(spec)} is ambiguous: {len(hits)} versions start with it")
        raise NotFoundError(f"no version {printable(spec)} on the remote")

    def _back(self, n: int, spec: str) -> bytes:
        """N steps back from the head, each to the parent of the entry that
        first brought a version (its push; squash entries come later)."""
        v = self.resolve(None)
        first: dict[bytes, Entry] = {}
        for e in self.entries:
            first.setdefault(e.version, e)
        for k in range(n):
            parent = first[v].parent
            if parent is None:
                raise NotFoundError(f"no version {printable(spec)} on the remote: it begins {k} version(s) before the head")
            v = parent
        return v

    def path(self, start: bytes | None, goal: bytes) -> list[Entry] | None:
        """The cheapest run of entries (fewest bytes, then fewest entries) from
        ``start`` to ``goal``; ``start=None`` means from nothing (an anchor)."""
        edges: dict[bytes | None, list[Entry]] = {}
        for e in self.entries:
            edges.setdefault(e.parent, []).append(e)
        best: dict[bytes | None, tuple[int, int]] = {start: (0, 0)}
        heap: list = [(0, 0, 0, start, [])]
        tie = 1
        while heap:
            size, hops, _, node, run = heapq.heappop(heap)
            if node == goal and run:
                return run
            if node == goal:
                return []
            if best.get(node, (size, hops)) < (size, hops):
                continue
            for e in edges.get(node, ()):
                cost = (size + e.size, hops + 1)
                if cost < best.get(e.version, (1 << 62, 0)):
                    best[e.version] = cost
                    heapq.heappush(heap, (cost[0], cost[1], tie, e.version, run + [e]))
                    tie += 1
        return None


def _entry(d: object, where: str) -> Entry:
    if not isinstance(d, dict):
        raise FormatError(f"{where}: malformed chain entry")
    try:
        parts = d["parts"]
        if not isinstance(parts, list) or not parts or len(parts) > 100_000:
            raise FormatError(f"{where}: chain entry has no parts")
        ps = []
        for p in parts:
            path = validate_relpath(p["path"], where=where)
            if not path.startswith(OBJECTS + "/"):
                raise FormatError(f"{where}: part {printable(path)} is outside {OBJECTS}/")
            if type(p["size"]) is not int or p["size"] < 0:
                raise FormatError(f"{where}: part size is not a size")
            ps.append(Part(path, p["size"], unhex(p["digest"], where=where)))
        label = d.get("label")
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL):
            raise FormatError(f"{where}: malformed label")
        created = d.get("created")
        if not isinstance(created, str) or len(created) > 64:
            raise FormatError(f"{where}: malformed creation time")
        parent = d["parent"]
        signature = d.get("signature")
        if signature is not None:
            validate_relpath(signature, where=where)
            if not (isinstance(signature, str) and signature.startswith(OBJECTS + "/") and signature.endswith(".minisig")):
                raise FormatError(f"{where}: malformed signature path")
        return Entry(
            bundle=unhex(d["bundle"], where=where),
            version=unhex(d["version"], where=where),
            parent=unhex(parent, where=where) if parent is not None else None,
            parts=tuple(ps),
            created=created,
            label=label,
            signature=signature,
        )
    except (KeyError, TypeError):
        raise FormatError(f"{where}: malformed chain entry") from None
