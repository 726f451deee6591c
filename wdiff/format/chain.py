"""The chain of versions on a remote: which bundles exist, which version each
one leads from and to, and the head. Pure: JSON in, objects out.

``chain.json`` at the root of a remote::

    {"format": "wdiff-chain", "version": 1, "head": "<fingerprint>",
     "entries": [{"bundle": "<bundle id>", "version": "<target fingerprint>",
                  "parent": "<base fingerprint>" | null, "label": "step-101" | null,
                  "created": "2026-12-01T02:50:00Z", "size": 1234,
                  "parts": [{"path": "objects/ab/<id>.wdb", "size": 1234,
                             "digest": "<xxh3-128>"}]}, ...]}

Since format 1.3 a part may name the commit that added it to a Hub
repository (``"commit": "<40 hex digits>"``): every puller then reads it at
that one URL, which a fleet's cache keeps for ever. A part without one is
read at the commit the chain was read at (chains written before 1.3, and
every store without commits).

An entry is an edge from ``parent`` to ``version``; an entry without a parent
is an *anchor*, a whole checkpoint. Entries are in push order.

Since format 1.1 a chain also carries its *lineage* (all four members or
none, which means a chain written before 1.1)::

     "remote": "<32 hex digits, chosen at the first push, never changed>",
     "seq": 7,                     # 1 at the first push, +1 at every publish
     "prev": "blake2b-256:<hex of the previous chain.json's bytes>" | null,
     "published": "2026-12-01T02:50:00Z",
     "signer": "<minisign key id, 16 hex digits>" | null   # who signs this chain

A chain signature covers these (sync/signatures.py), which is what lets a
reader refuse a replayed, frozen or transplanted chain.

Since format 1.2 a chain may carry the objects a gc unreferenced and when
(sync/gc.py; readers ignore it, writers keep it)::

     "garbage": [{"path": "objects/ab/<id>.wdb", "size": 1234,
                  "since": "2026-12-01T02:50:00Z"}, ...] The layout is
specified in man/wdiff-format.5 (section REMOTES).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from dataclasses import dataclass, replace
from functools import cached_property

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
#: a remote's identity, and the form of ``prev``
_REMOTE_ID = re.compile(r"[0-9a-f]{32}")
_PREV = re.compile(r"blake2b-256:[0-9a-f]{64}")
_SIGNER = re.compile(r"[0-9A-F]{16}")
#: a part's commit: a git object id (SHA-1), exactly as the Hub spells it
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
#: the part paths wdiff writes; anything else goes through the full path check
_PART = re.compile(r"objects/([0-9a-f]{2})/\1[0-9a-f]{30}\.wdb(?:\.[0-9]{5})?")
MAX_SEQ = 2**53  # exact in every JSON reader
#: the folders whose objects gc may remove (everything wdiff writes but chain.json)
GC_FOLDERS = (OBJECTS, "signatures", "stage")
MAX_GARBAGE = 1_000_000


def chain_digest(raw: bytes) -> str:
    """What ``prev`` says of a chain: BLAKE2b-256 of its bytes, collision
    resistant (XXH3, used for content addressing, is not)."""
    return "blake2b-256:" + hashlib.blake2b(raw, digest_size=32).hexdigest()


class NoSuchVersion(NotFoundError):
    """A version a user named (``--to``, ``--keep``, ``--from``) that the
    chain does not hold, or none at all when the chain is empty
    (``empty``). The chain does not know which remote it is read from: the
    command line names it, and how to list its versions."""

    def __init__(self, message: str, *, empty: bool = False, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.empty = empty


@dataclass(frozen=True)
class Part:
    path: str  # relative to the remote root
    size: int
    digest: bytes
    commit: str | None = None  # since 1.3: the Hub commit that added it (40 hex digits); None: read at the chain's

    def to_json(self) -> dict:
        d = {"path": self.path, "size": self.size, "digest": hexd(self.digest)}
        if self.commit is not None:
            d["commit"] = self.commit
        return d


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


def version_name(version: bytes | None, labels: dict | None = None) -> str:
    """A version by its label where it has one, then its fingerprint as
    ``wdiff log`` shows it: ``step-4 (dea9c1b2c3d4)``; the fingerprint alone
    otherwise, and "nothing" for None (before an anchor)."""
    if version is None:
        return "nothing"
    label = (labels or {}).get(version)
    return f"{label} ({hexd(version)[:12]})" if label else hexd(version)[:12]


def part_paths(bundle_id: bytes, n_parts: int) -> list[str]:
    h = hexd(bundle_id)
    if n_parts == 1:
        return [f"{OBJECTS}/{h[:2]}/{h}.wdb"]
    return [f"{OBJECTS}/{h[:2]}/{h}.wdb.{k:05d}" for k in range(n_parts)]


@dataclass(frozen=True)
class Lineage:
    """Where a chain stands in its remote's history: which remote, how many
    publishes, which chain it replaced, and when it was published."""

    remote: str  # 32 hex digits
    seq: int  # >= 1
    prev: str | None  # chain_digest() of the chain this one replaced; None at seq 1
    published: str  # UTC, YYYY-MM-DDTHH:MM:SSZ
    signer: str | None = None  # the minisign key id (16 hex digits) that signs this chain; None: unsigned

    def to_json(self) -> dict:
        return {"remote": self.remote, "seq": self.seq, "prev": self.prev, "published": self.published,
                "signer": self.signer}


@dataclass(frozen=True)
class Garbage:
    """An object no entry of the chain names since ``since`` (a gc marked
    it); it may be deleted once a grace period has passed."""

    path: str
    size: int
    since: str  # UTC, YYYY-MM-DDTHH:MM:SSZ

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "since": self.since}


@dataclass(frozen=True)
class Chain:
    head: bytes | None
    entries: tuple[Entry, ...] = ()
    lineage: Lineage | None = None  # None: written before format 1.1
    garbage: tuple[Garbage, ...] = ()  # since 1.2: objects a gc unreferenced, awaiting deletion

    @cached_property
    def versions(self) -> frozenset[bytes]:
        return frozenset(e.version for e in self.entries)

    @cached_property
    def _by_bundle(self) -> dict[bytes, Entry]:
        return {e.bundle: e for e in self.entries}

    @cached_property
    def _edges(self) -> dict[bytes | None, list[Entry]]:
        edges: dict[bytes | None, list[Entry]] = {}
        for e in self.entries:
            edges.setdefault(e.parent, []).append(e)
        return edges

    def entry(self, bundle_id: bytes) -> Entry | None:
        return self._by_bundle.get(bundle_id)

    def appended(self, e: Entry, *, head: bool = True) -> Chain:
        return replace(self, entries=self.entries + (e,), head=e.version if head else self.head)

    def placed(self, where: dict[str, str]) -> Chain:
        """This chain with the commit that added each part recorded, from
        ``where`` ({part path: commit}, what a Hub store reports after
        committing the parts); parts it does not name, and parts that
        already name a commit, are left as they are."""
        if not where:
            return self
        for c in where.values():
            if not _COMMIT.fullmatch(c):
                raise ValueError(f"not a commit id: {c!r}")
        entries = tuple(
            replace(e, parts=tuple(replace(p, commit=where[p.path]) if p.commit is None and p.path in where else p
                                   for p in e.parts))
            for e in self.entries)
        return replace(self, entries=entries)

    def succeeding(self, raw: bytes | None, *, remote: str, published: str, signer: str | None) -> Chain:
        """This chain as the publish after ``raw`` (the bytes it replaces,
        None for a remote's first chain): ``remote``, the next sequence
        number, ``prev`` naming those bytes."""
        seq = self.lineage.seq + 1 if self.lineage is not None else 1
        prev = chain_digest(raw) if raw is not None else None
        return replace(self, lineage=Lineage(remote, seq, prev, published, signer))

    def encode(self) -> bytes:
        obj = {
            "format": FORMAT,
            "version": VERSION,
            "head": hexd(self.head) if self.head else None,
            "entries": [e.to_json() for e in self.entries],
        }
        if self.lineage is not None:
            obj.update(self.lineage.to_json())
        if self.garbage:
            obj["garbage"] = [g.to_json() for g in self.garbage]
        return canonical_json(obj) + b"\n"

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
        return cls(head=head, entries=out, lineage=_lineage(obj, where), garbage=_garbage(obj, where))

    # -- queries ---------------------------------------------------------------------

    def resolve(self, spec: str | None) -> bytes:
        """A version from a user's words: None or "head", "HEAD~N" (N
        versions before the head, case-insensitive), a label, a full
        fingerprint or an unambiguous prefix of at least 4 hex digits."""
        if spec is None or spec.lower() == "head":
            if self.head is None:
                raise NoSuchVersion("the remote has no versions yet", empty=True)
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
                raise NoSuchVersion(f"version {printable(spec)} is ambiguous: {len(hits)} versions start with it")
        raise NoSuchVersion(f"no version {printable(spec)} on the remote")

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
                raise NoSuchVersion(f"no version {printable(spec)} on the remote: it begins {k} version(s) before the head")
            v = parent
        return v

    def name(self, version: bytes | None) -> str:
        """A version as messages name it (:func:`version_name`)."""
        return version_name(version, self.labels())

    def labels(self) -> dict[bytes, str]:
        """The label of each labelled version: that of the first entry that
        names it with one (its push; a later anchor or squash of it may
        repeat it)."""
        out: dict[bytes, str] = {}
        for e in self.entries:
            if e.label:
                out.setdefault(e.version, e.label)
        return out

    def path(self, start: bytes | None, goal: bytes) -> list[Entry] | None:
        """The cheapest run of entries (fewest bytes, then fewest entries) from
        ``start`` to ``goal``; ``start=None`` means from nothing (an anchor).

        Dijkstra over versions with a predecessor pointer per version: time
        O(E log V) and memory O(V + E), whatever the shape of the chain (a
        hostile remote may serve any chain within the limits)."""
        if start == goal:
            return []
        edges = self._edges
        best: dict[bytes | None, tuple[int, int]] = {start: (0, 0)}
        via: dict[bytes, Entry] = {}
        heap: list = [(0, 0, 0, start)]
        tie = 1
        while heap:
            size, hops, _, node = heapq.heappop(heap)
            if best[node] < (size, hops):
                continue  # a stale item: a cheaper way here was found since
            if node == goal:
                run = []
                while node != start:
                    e = via[node]
                    run.append(e)
                    node = e.parent
                run.reverse()
                return run
            for e in edges.get(node, ()):
                cost = (size + e.size, hops + 1)
                known = best.get(e.version)
                if known is None or cost < known:
                    best[e.version] = cost
                    via[e.version] = e
                    heapq.heappush(heap, (cost[0], cost[1], tie, e.version))
                    tie += 1
        return None


def _garbage(obj: dict, where: str) -> tuple[Garbage, ...]:
    items = obj.get("garbage", [])
    if not isinstance(items, list) or len(items) > MAX_GARBAGE:
        raise FormatError(f"{where}: malformed garbage list")
    out = []
    for g in items:
        if not isinstance(g, dict) or set(g) != {"path", "size", "since"}:
            raise FormatError(f"{where}: malformed garbage item")
        path, size, since = g["path"], g["size"], g["since"]
        path = validate_relpath(path, where=where) if isinstance(path, str) else None
        if path is None or path.split("/")[0] not in GC_FOLDERS:
            raise FormatError(f"{where}: garbage item outside {', '.join(GC_FOLDERS)}")
        if type(size) is not int or size < 0:
            raise FormatError(f"{where}: garbage size is not a size")
        if not isinstance(since, str) or not _TIME.fullmatch(since):
            raise FormatError(f"{where}: malformed garbage time")
        out.append(Garbage(path, size, since))
    return tuple(out)


def _lineage(obj: dict, where: str) -> Lineage | None:
    keys = ("remote", "seq", "prev", "published", "signer")
    present = [k for k in keys if k in obj]
    if not present:
        return None
    if len(present) != len(keys):
        raise FormatError(f"{where}: chain lineage is incomplete (it needs {', '.join(keys)})")
    remote, seq, prev, published, signer = (obj[k] for k in keys)
    if not isinstance(remote, str) or not _REMOTE_ID.fullmatch(remote):
        raise FormatError(f"{where}: malformed remote identity")
    if type(seq) is not int or not 1 <= seq <= MAX_SEQ:
        raise FormatError(f"{where}: malformed chain sequence number")
    if prev is None:
        if seq != 1:
            raise FormatError(f"{where}: a chain after the first one must name its predecessor")
    elif not isinstance(prev, str) or not _PREV.fullmatch(prev):
        raise FormatError(f"{where}: malformed previous-chain digest")
    if not isinstance(published, str) or not _TIME.fullmatch(published):
        raise FormatError(f"{where}: malformed publication time")
    if signer is not None and not (isinstance(signer, str) and _SIGNER.fullmatch(signer)):
        raise FormatError(f"{where}: malformed signer key id")
    return Lineage(remote, seq, prev, published, signer)


def _digest(s: object, where: str) -> bytes:
    """unhex(), faster: the round trip through bytes.hex() admits exactly
    the canonical form (32 lowercase hex digits)."""
    if type(s) is str and len(s) == 32:
        try:
            b = bytes.fromhex(s)
        except ValueError:
            b = None
        if b is not None and b.hex() == s:
            return b
    return unhex(s, where=where)  # raises the right error


def _entry(d: object, where: str) -> Entry:
    if not isinstance(d, dict):
        raise FormatError(f"{where}: malformed chain entry")
    try:
        parts = d["parts"]
        if not isinstance(parts, list) or not parts or len(parts) > 100_000:
            raise FormatError(f"{where}: chain entry has no parts")
        ps = []
        for p in parts:
            path = p["path"]
            # the names wdiff writes match _PART, which implies every rule of
            # validate_relpath; anything else is checked in full
            if not (isinstance(path, str) and _PART.fullmatch(path)):
                path = validate_relpath(path, where=where)
                if not path.startswith(OBJECTS + "/"):
                    raise FormatError(f"{where}: part {printable(path)} is outside {OBJECTS}/")
            size = p["size"]
            if type(size) is not int or size < 0:
                raise FormatError(f"{where}: part size is not a size")
            commit = p.get("commit")
            if commit is not None and not (type(commit) is str and _COMMIT.fullmatch(commit)):
                raise FormatError(f"{where}: part {printable(path)}: malformed commit")
            ps.append(Part(path, size, _digest(p["digest"], where), commit))
        label = d.get("label")
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL):
            raise FormatError(f"{where}: malformed label")
        created = d.get("created")
        if not isinstance(created, str) or len(created) > 64:
            raise FormatError(f"{where}: malformed creation time")
        parent = d["parent"]
        signature = d.get("signature")
        if signature is not None and not (isinstance(signature, str) and _PART.fullmatch(signature.removesuffix(".minisig"))):
            validate_relpath(signature, where=where)
            if not (isinstance(signature, str) and signature.startswith(OBJECTS + "/") and signature.endswith(".minisig")):
                raise FormatError(f"{where}: malformed signature path")
        return Entry(
            bundle=_digest(d["bundle"], where),
            version=_digest(d["version"], where),
            parent=_digest(parent, where) if parent is not None else None,
            parts=tuple(ps),
            created=created,
            label=label,
            signature=signature,
        )
    except (KeyError, TypeError):
        raise FormatError(f"{where}: malformed chain entry") from None
