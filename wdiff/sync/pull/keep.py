"""pull --atomic --keep N: the version directories that pull --atomic made
beside a link, and the removal of the oldest beyond N once the link has
been switched (a cron job would otherwise grow the disk by one whole
checkpoint per pull, for ever).

Only directories this mechanism made for this link are ever removed. They
are listed, oldest first, in ``PARENT/.LINK.wdiff-versions`` (PARENT: the
folder the versions are built in, beside the link's target, which may not
be the link's own folder; written temp + fsync + rename under the link's lock), each by name and by the device and
inode it had when it was made. The list is input: whoever can write the
parent can write it. A name in it is removed only if it is a plain name
(the pattern pull --atomic names versions with), is a plain directory
directly in the parent (reached relative to the parent's descriptor, never
through a link), is still the directory that was made (same device and
inode: a directory the user made or renamed there is not), the entry
carries a valid MAC (HMAC-SHA256, under a key kept in this user's state
directory, over the parent's device and inode, the link's name, the
directory's name, device and inode and the version built there: whoever
can write the parent cannot list a directory of theirs or the user's, nor
copy a list from elsewhere), the directory holds a ``.wdiff/state.json``
recording that version or another of the remote being pulled (the
remote's gc may have dropped the first), is not where the link points, and
no other wdiff holds its lock. Anything else is dropped from the list and left where it is.

A removal is crash-safe: the list first names the directory's temporary
name (``.LINK.wdiff-old-HEX``), the directory is renamed to it (so a
half-removed tree never looks like a version), removed, and then dropped
from the list; the next pull finishes what a killed one left. A new
version is listed as pending (no device and inode yet) before it is built,
so that one a pull killed before listing it is adopted by the next pull
(by the directory then at its name, still held to every check above)
instead of staying for ever.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass

from ...errors import BusyError, IntegrityError, WdiffError
from ...fsutil import (beside_lock_path, fsync_dir, io_error, locked_beside, open_regular, owner_tag, temp_name,
                       write_all)
from ...paths import STATE_DIR
from ...statedir import StateDir
from ...store import version_record
from ..trust import user_state_dir

SCHEMA = "wdiff-atomic-versions/1"
#: default --keep: the version the link points to and the one before it, for a rollback
DEFAULT_KEEP = 2
#: far more than any list of versions needs; a bigger file is not one wdiff wrote
LIMIT = 1024 * 1024
MAX_ENTRIES = 10_000
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
KEY_FILE = "atomic-versions.key"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Entry:
    name: str  # the version's directory, as pull --atomic named it
    dev: int
    ino: int
    version: str  # hex fingerprint of the version built there
    mac: str  # binds the above to this link's parent and this user's key
    trash: str = ""  # in ``removing``: the temporary name it is renamed to before removal

    def to_json(self) -> dict:
        doc = {"name": self.name, "dev": self.dev, "ino": self.ino, "version": self.version, "mac": self.mac}
        return doc | ({"trash": self.trash} if self.trash else {})


def list_name(link_name: str) -> str:
    return f".{link_name}.wdiff-versions"


class Versions:
    """The list of the versions made beside one link, opened relative to the
    link's parent directory. Use under the link's lock."""

    def __init__(self, link: str) -> None:
        self.link = os.path.abspath(link)
        link_dir, self.link_name = os.path.split(self.link)
        # the versions are built beside the link's target (pull_atomic), which
        # need not be the link's own folder: the list and every check live there
        self.parent = os.path.dirname(os.path.realpath(self.link))
        self._trash = re.compile(rf"\.{re.escape(self.link_name)}\.wdiff-old-[0-9a-f]{{16}}")
        try:
            self.fd = os.open(self.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise io_error(self.parent, e) from None
        self.versions: list[Entry] = []
        self.removing: list[Entry] = []
        try:
            st = os.fstat(self.fd)
            try:
                ls = os.stat(link_dir)
            except OSError as e:
                raise io_error(link_dir, e) from None
            # bound to both folders: two links of one name in two folders whose
            # versions share a folder keep two lists, and neither removes what
            # the other points to
            self.name = list_name(self.link_name) if (ls.st_dev, ls.st_ino) == (st.st_dev, st.st_ino) else \
                list_name(f"{self.link_name}-{ls.st_dev:x}-{ls.st_ino:x}")
            self._where = f"{SCHEMA}\0{st.st_dev}\0{st.st_ino}\0{ls.st_dev}\0{ls.st_ino}\0{self.link_name}\0".encode()
            self._sweep()
            try:
                self._key, self._no_key = user_key(), None
            except WdiffError as e:  # no list can be trusted, or written: nothing is removed
                self._key, self._no_key = b"", e
            else:
                self._load()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Versions:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the list ----------------------------------------------------------------------

    def _mac(self, name: str, dev: int, ino: int, version: str) -> str:
        return hmac.new(self._key, self._where + f"{name}\0{dev}\0{ino}\0{version}".encode(),
                        hashlib.sha256).hexdigest()

    def _sweep(self) -> None:
        """Under the link's lock no other writer of the list runs: its
        temporaries left by a killed pull are debris."""
        head = f"{self.name}-tmp-"
        with contextlib.suppress(OSError):
            for n in os.listdir(self.fd):
                if n.startswith(head):
                    with contextlib.suppress(OSError):
                        os.unlink(n, dir_fd=self.fd)

    def _load(self) -> None:
        """Read the list; a file that is not one wdiff wrote (not a regular
        file, too large, not this link's, another user's) counts as an empty
        list, and an entry whose MAC does not hold is dropped: nothing is
        removed because of them. The list is rewritten by the next save."""
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return
            raw = os.read(fd, LIMIT + 1)
        except OSError:
            return
        finally:
            os.close(fd)
        try:
            doc = json.loads(raw.decode("utf-8")) if len(raw) <= LIMIT else None
        except (UnicodeDecodeError, ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("link") != self.link_name:
            return
        ok = [e for e in _entries(doc.get("versions")) + _entries(doc.get("removing"))
              if hmac.compare_digest(e.mac, self._mac(e.name, e.dev, e.ino, e.version))]
        self.versions = [e for e in ok if not e.trash]
        self.removing = [e for e in ok if e.trash and self._trash.fullmatch(e.trash)]

    def save(self) -> None:
        doc = {"schema": SCHEMA, "link": self.link_name, "versions": [e.to_json() for e in self.versions],
               "removing": [e.to_json() for e in self.removing]}
        data = json.dumps(doc, indent=1).encode("utf-8") + b"\n"
        tmp = f"{self.name}-tmp-{owner_tag()}-{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=self.fd)
            try:
                write_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            os.fsync(self.fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise io_error(os.path.join(self.parent, self.name), e) from None

    def pend(self, path: str, version: bytes) -> None:
        """List ``path`` (a name free beside the link, about to be built) as
        pending (device and inode 0: it has none yet), so that a pull killed
        between its build and :meth:`add` leaves a version the next pull
        still knows as ours (:meth:`adopt`) instead of a whole checkpoint
        no pull would ever remove. Best effort, like :meth:`add`."""
        if self._no_key:
            return
        name, v = os.path.basename(path), version.hex()
        with contextlib.suppress(WdiffError, OSError):
            pending = Entry(name, 0, 0, v, self._mac(name, 0, 0, v))
            self.versions = [e for e in self.versions if e.name != name] + [pending]
            self.save()

    def unpend(self, path: str) -> None:
        """Drop the pending entry of ``path`` (its build failed: nothing of ours is there)."""
        name = os.path.basename(path)
        if any(e.name == name and e.ino == 0 for e in self.versions):
            self.versions = [e for e in self.versions if not (e.name == name and e.ino == 0)]
            with contextlib.suppress(WdiffError, OSError):
                self.save()

    def adopt(self) -> None:
        """A pending entry left by a killed pull: the plain directory now at
        its name is listed with its device and inode (the checks of a
        removal, a record of a version of the remote and nothing but its
        files as a pull wrote them, still apply); a name with none is dropped."""
        out = []
        for e in self.versions:
            if e.ino == 0:
                try:
                    st = os.stat(e.name, dir_fd=self.fd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    continue
                e = Entry(e.name, st.st_dev, st.st_ino, e.version, self._mac(e.name, st.st_dev, st.st_ino, e.version))
            out.append(e)
        self.versions = out

    def add(self, path: str, version: bytes, previous: str, reporter) -> None:
        """Record ``path`` (a directory just made beside the link) as the
        newest version, and ``previous`` (the link's target until now, when
        listed) as the one before it: the version kept for a rollback is
        the one the link left, even when the user had pointed it back at an
        older one. The version is whole already: a list that cannot be
        written costs a warning (that directory is never removed), not the pull."""
        name = os.path.basename(path)
        if self._no_key:
            return
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            v = version.hex()
            entry = Entry(name, st.st_dev, st.st_ino, v, self._mac(name, st.st_dev, st.st_ino, v))
            try:
                was = os.stat(previous, follow_symlinks=False)
                left = [e for e in self.versions if (e.dev, e.ino) == (was.st_dev, was.st_ino)]
            except OSError:
                left = []
            rest = [e for e in self.versions if e.name != name and e not in left]
            self.versions = rest + left + [entry]
            self.save()
        except (WdiffError, OSError) as e:
            reporter.warn(f"{e} ({path} is not listed: pull --atomic will never remove it)")

    # -- removal -----------------------------------------------------------------------

    def _is(self, name: str, e: Entry) -> bool:
        """Whether ``name`` is (still) the plain directory ``e`` recorded."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == (e.dev, e.ino)

    def finish(self) -> list[str]:
        """Finish the removals a killed pull left: remove the temporary
        directories still there; a version not yet renamed goes back to the
        front of the list (it is judged again like the others)."""
        done, back = [], []
        for e in self.removing:
            if self._is(e.trash, e):
                if self._remove_tree(e.trash, e):
                    done.append(os.path.join(self.parent, e.name))
            elif self._is(e.name, e):
                back.append(Entry(e.name, e.dev, e.ino, e.version, e.mac))
        if self.removing:
            names = {b.name for b in back}
            self.versions = back + [v for v in self.versions if v.name not in names]
            self.removing = []
            self.save()
        return done

    def prune(self, keep: int, *, known, reporter) -> list[str]:
        """Remove the oldest recorded versions beyond ``keep`` (counting the
        one the link points to; 0 keeps all), each only if it
        passes every check in the module's docstring; ``known``: the
        versions of the remote. The paths removed, oldest first. The pull
        has succeeded by now: a removal that fails is a warning, and the
        next pull tries again."""
        if self._no_key:
            reporter.warn(f"{self._no_key} (no old version is removed)")
            return []
        try:
            removed = self.finish()
            self.adopt()
            here = self._target()
            valid = [e for e in self.versions if self._is(e.name, e)]
            if len(valid) != len(self.versions):  # gone, or no longer the directory that was made
                self.versions = valid
                self.save()
        except (WdiffError, OSError) as e:
            reporter.warn(f"{e} (old versions are left for the next pull to remove)")
            return []
        others = [e for e in valid if (e.dev, e.ino) != here]
        victims = others[: max(0, len(others) - (keep - 1))] if keep > 0 else []
        for e in victims:
            try:
                ok = self._version_of(e, known)
                if ok is not True:  # not a version of this remote (any more), or holds the user's work
                    self.versions = [v for v in self.versions if v != e]
                    self.save()
                    if isinstance(ok, str):
                        reporter.warn(f"{os.path.join(self.parent, e.name)} holds {ok}, which is not the version's: "
                                      "it is left in place, and no pull will remove it")
                elif self._remove(e):
                    removed.append(os.path.join(self.parent, e.name))
            except WdiffError as err:
                reporter.warn(f"{err} (an old version is left for the next pull to remove)")
        return removed

    def _target(self) -> tuple[int, int] | None:
        """(device, inode) of the directory the link points to now."""
        try:
            st = os.stat(self.link)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _version_of(self, e: Entry, known) -> bool | str:
        """Whether ``e`` holds a record of a version in ``known`` (the
        remote's chain) or of the version built there (one the remote's gc
        may have dropped since), reached without following a link, and
        nothing else: the first path in it that is not a file of that
        version as the pull wrote it (a file the user added, a file changed
        since, a link) is returned instead, and the directory stays."""
        try:
            fd = os.open(e.name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (e.dev, e.ino):
                return False
            top = StateDir(fd, os.path.join(self.parent, e.name), st.st_uid)
            fd = -1
            with top:
                state = top.sub(STATE_DIR, create=False)
                if state is None:
                    return False
                with state:
                    rec = version_record.read(state)
                    if rec is None or not (rec.version in known or rec.version.hex() == e.version):
                        return False
                    stamp = os.stat(version_record.NAME, dir_fd=state.fd, follow_symlinks=False).st_mtime_ns
                return _foreign(top.fd, rec, stamp) or True
        except WdiffError:
            return False
        except OSError as err:
            raise io_error(os.path.join(self.parent, e.name), err) from None
        finally:
            if fd >= 0:
                os.close(fd)

    def _remove(self, e: Entry) -> bool:
        """Rename ``e`` to a temporary name, then remove it, under its own
        lock (a pull or apply into that directory holds it: then it stays)."""
        path = os.path.join(self.parent, e.name)
        gone = Entry(e.name, e.dev, e.ino, e.version, e.mac, trash=f".{self.link_name}.wdiff-old-{secrets.token_hex(8)}")
        try:
            # the lock a pull or apply of that directory takes (beside its real
            # path), found without following the name itself: it may be a link by now
            lock = beside_lock_path(os.path.join(os.path.realpath(self.parent), e.name), follow=False)
            with locked_beside(lock, what=path):
                if not self._is(e.name, e) or self._target() in (None, (e.dev, e.ino)):
                    return False  # gone, replaced, or where the link points (now, whoever moved it)
                self.removing.append(gone)
                self.versions = [v for v in self.versions if v != e]
                self.save()
                try:
                    os.rename(e.name, gone.trash, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                    os.fsync(self.fd)
                except OSError as err:
                    raise io_error(path, err) from None
                if not self._is(gone.trash, e):
                    # whoever can write the parent put another directory in its
                    # place between the check and the rename: give it its name back
                    with contextlib.suppress(OSError):
                        if not os.path.lexists(os.path.join(self.parent, e.name)):
                            os.rename(gone.trash, e.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                    self.removing = [r for r in self.removing if r != gone]
                    self.save()
                    raise IntegrityError(f"{path} was replaced while it was being removed; it is left in place")
        except BusyError:
            return False
        done = self._remove_tree(gone.trash, e)
        self.removing = [r for r in self.removing if r != gone]
        self.save()
        return done

    def _remove_tree(self, name: str, e: Entry) -> bool:
        """Remove the directory ``e`` recorded, now at ``name``: opened
        relative to the parent's descriptor without following a link, checked
        to be that directory (same device and inode), emptied through that
        descriptor only (a link inside is removed, never followed), and its
        then empty name removed. Whatever is put at ``name`` meanwhile (a
        race by whoever can write the parent) is never emptied: only an
        empty directory could be removed by that name. False where ``name``
        is not (or no longer) that directory: it is left."""
        where = os.path.join(self.parent, name)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                return False  # a link or a file at its name now: not the directory made
            raise io_error(where, err) from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (e.dev, e.ino):
                return False
            _empty(fd, 0)
            os.rmdir(name, dir_fd=self.fd)
        except OSError as err:
            raise io_error(where, err) from None
        finally:
            os.close(fd)
        return True


#: deeper than any checkpoint's folders; a deeper tree is left (and reported)
MAX_DEPTH = 128


def _empty(fd: int, depth: int) -> None:
    """Remove everything in the directory open at ``fd``, through
    descriptors only, following no link."""
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, f"folders nested deeper than {MAX_DEPTH}")
    with os.scandir(fd) as it:
        names = [(d.name, d.is_dir(follow_symlinks=False)) for d in it]
    for name, folder in names:
        if not folder:
            os.unlink(name, dir_fd=fd)
            continue
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            _empty(sub, depth + 1)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=fd)


def _foreign(fd: int, rec: version_record.Record, stamp: int) -> str | None:
    """The first entry of the version directory open at ``fd`` that is not a
    file of ``rec`` as the pull left it (listed, a regular file of its size,
    not modified after the record, stamped ``stamp``, was written), or a
    folder none of them needs; None when there is none. ``.wdiff/`` is
    wdiff's own. The walk follows no link and stops at the first foreign
    entry, so it costs at most one entry more than the version has."""
    sizes = {r.path: r.size for r in rec.files}
    folders = {p.rsplit("/", k)[0] for p in sizes for k in range(1, p.count("/") + 1)}
    todo = [(os.dup(fd), "")]
    try:
        while todo:
            dfd, prefix = todo.pop()
            try:
                with os.scandir(dfd) as it:
                    for d in it:
                        rel = prefix + d.name
                        if rel == STATE_DIR:
                            continue
                        st = d.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode) and rel in folders:
                            todo.append((os.open(d.name, _DIR_FLAGS, dir_fd=dfd), rel + "/"))
                        elif not (stat.S_ISREG(st.st_mode) and sizes.get(rel) == st.st_size
                                  and st.st_mtime_ns <= stamp):
                            return rel + ("/" if stat.S_ISDIR(st.st_mode) else "")
            finally:
                os.close(dfd)
    finally:
        for dfd, _ in todo:
            os.close(dfd)
    return None


def user_key() -> bytes:
    """This user's key for the lists' MACs (``$WDIFF_STATE_DIR/atomic-versions.key``,
    32 random bytes made on first use). A key file that is not one wdiff
    made is an error: a MAC under a key someone else chose binds nothing."""
    d = user_state_dir()
    path = os.path.join(d, KEY_FILE)
    for _ in range(2):
        try:
            with open_regular(path, max_size=32) as f:
                key, owner = f.read(33), os.fstat(f.fileno()).st_uid
            if len(key) != 32 or owner != os.geteuid():
                raise IntegrityError(f"{path}: not a key wdiff made")
            return key
        except FileNotFoundError:
            pass
        except OSError as e:
            raise io_error(path, e) from None
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            tmp = temp_name(path)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                write_all(fd, secrets.token_bytes(32), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # never over a key another process made first
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
            fsync_dir(d)
        except OSError as e:
            raise io_error(path, e) from None
    raise IntegrityError(f"{path}: vanished while being made")


def _entries(raw) -> list[Entry]:
    """The well-formed entries of a list read from disk (others are dropped)."""
    out: list[Entry] = []
    if not isinstance(raw, list):
        return out
    for item in raw[:MAX_ENTRIES]:
        if not isinstance(item, dict):
            continue
        name, dev, ino, version, mac, trash = (item.get(k) for k in ("name", "dev", "ino", "version", "mac", "trash"))
        trash = "" if trash is None else trash
        if (isinstance(name, str) and SAFE_NAME.fullmatch(name) and isinstance(trash, str)
                and isinstance(version, str) and _HEX32.fullmatch(version)
                and isinstance(mac, str) and _HEX64.fullmatch(mac)
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (dev, ino))
                and all(x.name != name for x in out)):
            out.append(Entry(name, dev, ino, version, mac, trash))
    return out
