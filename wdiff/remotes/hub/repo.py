"""Hub model and dataset repositories: git-versioned, atomic commits (see
the package's docstring)."""

from __future__ import annotations

import os
import re
import shutil
import time

from ...errors import AuthError, ConflictError, IntegrityError, NotFoundError, RemoteError
from ...progress import SILENT, Reporter
from ..base import CHAIN, Upload, Writer, check_deletable, check_fetch_args, check_prefix
from .transfer import (
    _bar_class,
    _check_downloaded,
    _Counted,
    _pumped,
    _refuse_large_chain,
    _refuse_status,
    _resume_get,
    _routed_xet_upload_progress,
    _Slice,
    _Staging,
    absent,
    hub_errors,
)

REPO_ROOT = "wdiff"
CARD = "README.md"
MAX_FILES_PER_COMMIT = 80  # the Hub asks for fewer than 100
COMMIT_RETRIES = 2
#: commits that touch objects only (store, delete) move the branch without
#: changing the chain; a publish that meets one (HTTP 412) builds on it when
#: the chain there is still the one it read, this many times
CHAIN_UNCHANGED_RETRIES = 8
_SHA = re.compile(r"[0-9a-f]{40}")

class _NewBranch:
    """The chain token of a branch a push will create, from ``start``."""

    def __init__(self, start: str) -> None:
        self.start = start


class RepoStore(Writer):
    def __init__(self, url: str, repo_id: str, repo_type: str, revision: str, *, subfolder: str = "",
                 token: str | None = None, private: bool = True, create: bool = False) -> None:
        from huggingface_hub import HfApi

        self.url = url
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.revision = revision
        self.root = subfolder or REPO_ROOT
        self.private = private
        self.create = create  # a pusher: a missing branch reads as one to create
        self._token = token  # None: huggingface_hub's own (HF_TOKEN, stored login)
        self.api = HfApi(token=token)
        self._sha: str | None = None  # the commit the chain was read at
        self._fresh = False  # no chain when it was read: the next commit starts one
        self._raw: bytes | None = None  # the chain as read at _sha

    def _remote(self, path: str) -> str:
        return f"{self.root}/{path}"

    def _head(self, revision: str | None = None) -> str | None:
        """The commit a revision (default: the URL's) points at; None when
        there is no repository."""
        from huggingface_hub import errors as he

        revision = revision or self.revision
        try:
            with hub_errors(self.url, "repository"):
                try:
                    return self.api.repo_info(self.repo_id, repo_type=self.repo_type, revision=revision).sha
                except he.RepositoryNotFoundError:
                    return None
        except NotFoundError:
            raise NotFoundError(f"{self.url}: revision {revision!r} not found") from None

    def read_chain(self) -> tuple[bytes | None, object]:
        try:
            sha = self._head()
        except NotFoundError:
            if not self.create or _SHA.fullmatch(self.revision):
                raise
            # a push to a branch that does not exist yet: it will start at the
            # default branch's head, and so does its chain
            start = self._head("main")
            if start is None:  # the repository went away meanwhile
                self._sha, self._fresh = None, True
                return None, None
            self._sha = start
            raw = self._download_chain(start)
            self._fresh = raw is None
            self._raw = raw
            return raw, _NewBranch(start)
        self._sha = sha
        if sha is None:
            self._fresh = True
            return None, None
        raw = self._download_chain(sha)
        self._fresh = raw is None
        self._raw = raw
        return raw, sha

    def why_absent(self) -> tuple[str, str]:
        return absent(self.url, "dataset repository" if self.repo_type == "dataset" else "repository", self._token)

    def _download_chain(self, sha: str) -> bytes | None:
        """The chain at commit ``sha`` (None when there is none there), in
        one GET of its ``/resolve`` URL, read up to the bound wdiff accepts
        whatever length the server announces or sends."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session

        url = hf_hub_url(self.repo_id, self._remote(CHAIN), repo_type=self.repo_type, revision=sha)
        with hub_errors(self.url, CHAIN):
            with get_session().stream("GET", url, headers=build_hf_headers(token=self._token),
                                      follow_redirects=True) as r:
                if r.status_code == 404:
                    return None  # no chain at this commit (or no repository any more)
                if r.status_code != 200:
                    _refuse_status(self.url, CHAIN, r.status_code)
                announced = r.headers.get("Content-Length")
                if announced is not None and announced.isdigit():
                    _refuse_large_chain(self.url, int(announced))
                raw = bytearray()
                for piece in r.iter_bytes():
                    raw += piece
                    _refuse_large_chain(self.url, len(raw))
        return bytes(raw)

    def _size(self, path: str, revision: str) -> int | None:
        """The size of object ``path`` at ``revision``, from the tree
        metadata (no download); None when it does not exist."""
        with hub_errors(self.url, path):
            infos = self.api.get_paths_info(self.repo_id, [self._remote(path)], repo_type=self.repo_type,
                                            revision=revision)
        for i in infos:
            if i.path == self._remote(path):
                return getattr(i, "size", None)
        return None

    def fetch(self, path: str, dest: str, *, size: int | None = None, max_size: int | None = None,
              reporter: Reporter = SILENT, at: str | None = None) -> None:
        check_fetch_args(size, max_size)
        revision = self._revision(at)
        if max_size is not None:
            # a small object of unknown size: ask its size first, so that a
            # hostile repository cannot make us download without end
            have = self._size(path, revision)
            if have is None:
                raise NotFoundError(f"{self.url}: object {path} is missing")
            if have > max_size:
                raise IntegrityError(f"{self.url}: {path}: {have} bytes, more than the {max_size} this object may have")
            self._fetch_small(path, dest, size, max_size, reporter, revision)
            return
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.repo_id, self._remote(path), repo_type=self.repo_type, revision=revision)
        _resume_get(self.url, path, url, build_hf_headers(token=self._token), dest, size, reporter)

    def fetch_range(self, path: str, offset: int, length: int, *, size: int, at: str | None = None) -> bytes:
        """One Range request at the commit the chain was read; at most
        ``length`` bytes are read whatever the server sends. A server that
        ignores the Range, or an object of another size, is refused rather
        than downloaded whole (the caller then fetches whole objects)."""
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError("a range outside the object")
        if length == 0:
            return b""
        revision = self._revision(at)
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        url = hf_hub_url(self.repo_id, self._remote(path), repo_type=self.repo_type, revision=revision)
        headers = {**build_hf_headers(token=self._token), "Range": f"bytes={offset}-{offset + length - 1}"}
        with hub_errors(self.url, path):
            with get_session().stream("GET", url, headers=headers, follow_redirects=True) as r:
                if r.status_code != 206:
                    if r.status_code < 400:
                        raise NotImplementedError(f"{self.url}: the server ignored a Range request for {path}")
                    r.read()
                    hf_raise_for_status(r)
                total = (r.headers.get("Content-Range") or "").rpartition("/")[2]
                if total != str(size):
                    raise IntegrityError(f"{self.url}: {path} is not {size} bytes long (damaged remote)")
                data = bytearray()
                for piece in r.iter_bytes():
                    data += piece
                    if len(data) > length:
                        break
        if len(data) != length:
            raise IntegrityError(f"{self.url}: {path}: a range of {length} bytes came back as {len(data)}")
        return bytes(data)

    def _revision(self, at: str | None) -> str:
        """Where an object is read: the commit that added it, when the chain
        recorded one (the same URL for every puller, for ever: what a fleet's
        cache keys on), else the commit the chain was read at."""
        if at is not None:
            if not _SHA.fullmatch(at):
                raise ValueError(f"not a commit id: {at!r}")
            return at
        if self._sha is None:
            self.read_chain()
        return self._sha

    def _fetch_small(self, path: str, dest: str, size: int | None, max_size: int | None, reporter: Reporter,
                     revision: str) -> None:
        """An object of unknown size (a signature): whole, through the client,
        and checked against its bound once it has arrived."""
        from huggingface_hub import hf_hub_download

        landing = os.path.join(os.path.dirname(os.path.abspath(dest)), ".hub-download")
        os.makedirs(landing, exist_ok=True)
        try:
            with hub_errors(self.url, path):
                got = hf_hub_download(self.repo_id, self._remote(path), repo_type=self.repo_type,
                                      revision=revision, local_dir=landing, token=self._token,
                                      tqdm_class=_bar_class(None))
            _check_downloaded(self.url, path, got, size, max_size)
            os.replace(got, dest)
            reporter.advance(os.path.getsize(dest))
        finally:
            shutil.rmtree(landing, ignore_errors=True)

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        self.publish_placed(uploads, lambda placed: (chain, []), token, message=message, reporter=reporter)

    def publish_placed(self, uploads: list[Upload], make_chain, token: object, *, message: str,
                       reporter: Reporter = SILENT) -> bytes:
        """The parts first, in commits of fewer than 100 files, each built on
        the one before (on the commit the chain was read at, for the
        first); then the chain, which ``make_chain`` makes knowing the commit
        that holds each part, in a commit whose parent is the last of those.
        Every commit is conditional: a head that moved on without changing
        the chain (objects stored or deleted) is built on, one that changed
        it is a conflict. A crash between leaves only parts no chain names."""
        from huggingface_hub import CommitOperationAdd

        parent = self._prepare(token, reporter)
        chain_read = isinstance(token, str)
        staging = _Staging()
        ops: list = []
        try:
            for u in uploads:
                ops.append((u.path, self._upload(u, staging, reporter)))
            placed: dict[str, str] = {}
            for k in range(0, len(ops), MAX_FILES_PER_COMMIT):
                batch = ops[k : k + MAX_FILES_PER_COMMIT]
                parent = self._commit([op for _, op in batch], parent, message + " (parts)", chain_read=chain_read)
                placed.update((path, parent) for path, _ in batch)
            if ops:
                # a commit of parts the branch already holds is no commit at
                # all: huggingface_hub then answers with the branch's head,
                # which may carry someone else's chain by now
                self._check_chain_at(parent)
            chain, more = make_chain(placed)
            tail = []
            for u in more:
                tail.append(self._upload(u, staging, reporter))
                ops.append((u.path, tail[-1]))
            tail.append(CommitOperationAdd(path_in_repo=self._remote(CHAIN), path_or_fileobj=chain))
            if self._fresh and not self._has(CARD, parent):
                tail.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=model_card(self).encode()))
            self._commit(tail, parent, message, chain_read=not self._fresh and chain_read)
            return chain
        finally:
            for _, op in ops:
                if isinstance(op.path_or_fileobj, _Slice):
                    op.path_or_fileobj.close()
            staging.cleanup()

    def _check_chain_at(self, sha: str) -> None:
        """The chain at ``sha`` must still be the one this push read."""
        if self._download_chain(sha) != (None if self._fresh else self._raw):
            raise ConflictError(f"{self.url}: someone else pushed meanwhile", hint="run the push again")

    def _prepare(self, token: object, reporter: Reporter) -> str:
        """The commit to build on, creating the repository and the branch
        when they do not exist yet."""
        if isinstance(token, _NewBranch):
            self._create_branch(token.start)
            return token.start
        if token is not None:
            return token  # type: ignore[return-value]
        # no repository when the chain was read: create it, and make sure it is still empty
        self._create_repo(reporter)
        try:
            parent = self._head()
        except NotFoundError:  # the URL names a branch the new repository lacks
            parent = self._head("main")
            if parent is None:
                raise ConflictError(f"{self.url}: the repository went away meanwhile", hint="run the push again") from None
            self._create_branch(parent)
        if parent is None or self._download_chain(parent) is not None:
            raise ConflictError(f"{self.url}: someone else pushed meanwhile", hint="run the push again")
        self._fresh = True
        return parent

    def _create_repo(self, reporter: Reporter) -> None:
        from huggingface_hub import errors as he

        with hub_errors(self.url, "create repository"):
            try:
                self.api.create_repo(self.repo_id, repo_type=self.repo_type, private=self.private)
            except he.HfHubHTTPError as e:
                if e.response is not None and e.response.status_code == 409:
                    return  # created meanwhile by someone else: not ours to announce
                raise
        what = "dataset repository" if self.repo_type == "dataset" else "repository"
        if self.private:
            reporter.warn(f"created the private {what} {self.repo_id}: only accounts with access to it can pull "
                          "(push with --public, or private=False, to create a public one)")
        else:
            reporter.warn(f"created the public {what} {self.repo_id}: anyone can pull it")

    def _create_branch(self, start: str) -> None:
        with hub_errors(self.url, f"create branch {self.revision}"):
            self.api.create_branch(self.repo_id, branch=self.revision, revision=start, repo_type=self.repo_type,
                                   exist_ok=True)

    def _has(self, path: str, sha: str) -> bool:
        with hub_errors(self.url, path):
            return bool(self.api.get_paths_info(self.repo_id, [path], repo_type=self.repo_type, revision=sha))

    def _upload(self, u: Upload, staging: _Staging, reporter: Reporter):
        """Upload one object ahead of the commit (a no-op for small files,
        which ride inline in the commit), reporting its bytes as they move;
        returns its commit operation."""
        from huggingface_hub import CommitOperationAdd
        from huggingface_hub.utils._runtime import is_xet_available

        reporter.file(u.path, u.length)
        xet = is_xet_available()
        # Xet reads paths (a file object would send it back to LFS); LFS reads
        # a file object, which counts what it reads and needs no staged copy
        source = _Slice(u.source, u.offset, u.length) if not xet else None
        op = CommitOperationAdd(path_in_repo=self._remote(u.path),
                                path_or_fileobj=source if source is not None else staging.file_for(u))
        counted = _Counted(u.length)

        def work(sink) -> None:
            counted.sink = sink
            if source is not None:
                source.sink = counted
            with _routed_xet_upload_progress(counted):
                self.api.preupload_lfs_files(self.repo_id, [op], repo_type=self.repo_type, revision=self.revision)

        try:
            with hub_errors(self.url, "upload"):
                _pumped(reporter, work)
        finally:
            if source is not None:
                source.sink = None
        reporter.advance(u.length - counted.done)  # already on the Hub, or bytes no hook saw
        return op

    def _commit(self, ops: list, parent: str | None, message: str, *, chain_read: bool = False) -> str:
        """Commit ``ops`` on ``parent`` (None: on whatever the head is). With
        ``chain_read``, a head that moved on without changing the chain (a
        store or delete commit) is built on instead of refused."""
        for _ in range(CHAIN_UNCHANGED_RETRIES):
            try:
                return self._commit_once(ops, parent, message)
            except ConflictError:
                if not chain_read or parent is None:
                    raise
                head = self._head()
                if head is None or head == parent or self._download_chain(head) != self._raw:
                    raise
                parent = head
        return self._commit_once(ops, parent, message)

    def _commit_once(self, ops: list, parent: str | None, message: str) -> str:
        for attempt in range(COMMIT_RETRIES + 1):
            try:
                with hub_errors(self.url, "commit"):
                    info = self.api.create_commit(
                        self.repo_id, operations=ops, commit_message=message, repo_type=self.repo_type,
                        revision=self.revision, parent_commit=parent,
                    )
                return info.oid
            except RemoteError as e:
                if isinstance(e, (AuthError, ConflictError)) or attempt == COMMIT_RETRIES:
                    raise
                time.sleep(1 + attempt)  # the client does not retry commits; the same operations can be resent
        raise AssertionError("unreachable")


    # -- objects without the chain: listing, staging, removal ---------------------------

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        from huggingface_hub.hf_api import RepoFile

        prefix = check_prefix(prefix)
        sha = self._sha or self._head()
        if sha is None:
            return []
        base = self._remote(prefix) if prefix else self.root
        try:
            with hub_errors(self.url, "list"):
                items = [i for i in self.api.list_repo_tree(self.repo_id, base, recursive=True, revision=sha,
                                                            repo_type=self.repo_type) if isinstance(i, RepoFile)]
        except NotFoundError:
            return []
        cut = len(self.root) + 1
        return sorted((i.path[cut:], i.size) for i in items if i.path.startswith(self.root + "/"))

    def store(self, uploads: list[Upload], *, reporter: Reporter = SILENT) -> None:
        if any(u.path == CHAIN for u in uploads):
            raise ValueError("the chain index is written by publish only")
        if not uploads:
            return
        if self._head() is None:
            raise NotFoundError(f"{self.url}: no such repository", hint="push an anchor first")
        staging = _Staging()
        ops: list = []
        try:
            for u in uploads:
                ops.append(self._upload(u, staging, reporter))
            # not conditional: objects are named by content, and the chain is untouched
            for k in range(0, len(ops), MAX_FILES_PER_COMMIT):
                self._commit(ops[k : k + MAX_FILES_PER_COMMIT], None, "wdiff: store objects")
        finally:
            for op in ops:
                if isinstance(op.path_or_fileobj, _Slice):
                    op.path_or_fileobj.close()
            staging.cleanup()

    def delete(self, paths: list[str]) -> None:
        from huggingface_hub import CommitOperationDelete

        check_deletable(paths)
        if not paths:
            return
        head = self._head()
        if head is None:
            return
        with hub_errors(self.url, "delete"):
            infos = self.api.get_paths_info(self.repo_id, [self._remote(p) for p in paths], repo_type=self.repo_type,
                                            revision=head)
        from huggingface_hub.hf_api import RepoFile

        present = sorted(i.path for i in infos if isinstance(i, RepoFile))
        for k in range(0, len(present), MAX_FILES_PER_COMMIT):
            ops = [CommitOperationDelete(path_in_repo=p) for p in present[k : k + MAX_FILES_PER_COMMIT]]
            self._commit(ops, None, "wdiff gc: delete unreferenced objects")


def model_card(store: RepoStore) -> str:
    """The README.md a chain's first push puts in a repository that has none."""
    prefix = "datasets/" if store.repo_type == "dataset" else ""
    url = f"hf://{prefix}{store.repo_id}"
    if store.revision != "main":
        url += f"@{store.revision}"
    if store.root != REPO_ROOT:
        url += f"/{store.root}"
    return f"""---
tags:
- wdiff
---

# {store.repo_id}

This repository is a [wdiff](https://pypi.org/project/wdiff/) remote: a chain of
model checkpoint versions stored as verified delta bundles. `{store.root}/chain.json`
lists every version (an anchor, a whole checkpoint, or a delta from the version
before it) with the sizes and digests of its parts under `{store.root}/objects/`.
The files are not a checkpoint themselves: wdiff rebuilds one from them, bit for
bit, and checks it against the digests before it uses it.

To get the newest version into a directory (and, run again, to bring that
directory up to date by downloading only what changed):

```sh
pip install wdiff
wdiff pull {url} ./checkpoint
```

`wdiff log {url}` lists the versions; `wdiff pull {url} ./checkpoint --to VERSION`
fetches an older one. For a private repository, log in first (`hf auth login`)
or set `HF_TOKEN`.

This card was written by the first `wdiff push`; wdiff never changes it again,
so edit it as you like.
"""
