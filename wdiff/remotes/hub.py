"""Hugging Face Hub remotes: model and dataset repositories, and Storage
Buckets. The only module that imports huggingface_hub.

Repositories are git-versioned: a push is one commit holding the parts and
the new ``chain.json``, made with ``parent_commit`` set to the commit the
chain was read at, so of two concurrent pushers one wins and the other gets
HTTP 412 (ConflictError). Everything lives under ``wdiff/`` in the repo (or
the subfolder the URL names), so a repository can hold a model card or a
full checkpoint beside the chain. Downloads are pinned to the commit the
chain was read at.

A push creates what is missing: the repository (private unless asked
otherwise, and it says so), the branch the URL names (from the default
branch's head, as ``hf upload --revision`` does, so the new branch starts
with the default branch's chain), and, in the first commit of a chain, a
model card (README.md, tagged ``wdiff``) when the repository has none; a
card that exists is never touched.

Parts are uploaded one file at a time before the commit that names them,
and their bytes are reported as they move: counted from the reads of a file
object under LFS, from hf_xet's progress callback under Xet. Parts are
downloaded over HTTP into the caller's file, continuing with a Range request
from the bytes an interrupted run left there. huggingface_hub's own
progress bars are never turned off for the process: wdiff hands its calls a
bar class of its own (``tqdm_class``) that draws nothing and feeds the
Reporter.

Buckets are mutable and have no transactions: parts are written first under
names no chain refers to yet, the chain is read again, and only then written;
a push that died halfway leaves unreferenced parts that a rerun reuses.

Authentication is huggingface_hub's own (HF_TOKEN, ``hf auth login``), or a
token handed in, which goes to huggingface_hub only; wdiff never logs or
prints a token. huggingface_hub checks only the size of
what it downloads: wdiff verifies every part against its own digest.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import queue
import re
import shutil
import tempfile
import threading
import time

import xxhash

from ..errors import AuthError, ConflictError, FormatError, IntegrityError, NotFoundError, RemoteError, WdiffError
from ..progress import SILENT, Reporter
from .base import CHAIN, MAX_CHAIN_OBJECT, Upload, Writer, check_fetch_args, read_chain_file

REPO_ROOT = "wdiff"
CARD = "README.md"
MAX_FILES_PER_COMMIT = 80  # the Hub asks for fewer than 100
COMMIT_RETRIES = 2
_SHA = re.compile(r"[0-9a-f]{40}")


def open_hub(url: str, spec: dict, *, token: str | None = None, private: bool = True,
             create: bool = False) -> Writer:
    if spec["kind"] == "bucket":
        return BucketStore(url, spec["repo_id"], spec["prefix"], token=token, private=private)
    return RepoStore(url, spec["repo_id"], spec["kind"], spec["revision"], subfolder=spec.get("subfolder") or "",
                     token=token, private=private, create=create)


@contextlib.contextmanager
def hub_errors(url: str, what: str):
    """Map huggingface_hub's exceptions to wdiff's, in one place."""
    from huggingface_hub import errors as he

    try:
        yield
    except WdiffError:
        raise
    except _not_found() as e:
        raise NotFoundError(f"{url}: {what}: not found ({type(e).__name__})") from None
    except he.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status in (401, 403):
            raise AuthError(
                f"{url}: {what}: the Hub refused the credentials (HTTP {status})",
                hint="set HF_TOKEN or run `hf auth login` with a token that can access the repository",
            ) from None
        if status == 412:
            raise ConflictError(f"{url}: {what}: someone else pushed meanwhile", hint="run the push again") from None
        if status == 404:
            raise NotFoundError(f"{url}: {what}: not found") from None
        raise RemoteError(f"{url}: {what}: HTTP {status}: {_short(e)}", hint="the Hub may be busy; try again") from None
    except Exception as e:  # noqa: BLE001 - network layers (httpx2, hf_xet) raise their own types
        raise RemoteError(f"{url}: {what}: {type(e).__name__}: {_short(e)}", hint="check the network; try again") from None


def _not_found() -> tuple:
    from huggingface_hub import errors as he

    names = ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "BucketNotFoundError")
    return tuple(getattr(he, n) for n in names if hasattr(he, n))


def _refuse_large_chain(url: str, size: int) -> None:
    if size > MAX_CHAIN_OBJECT:
        raise FormatError(f"{url}: chain index is larger than this wdiff accepts",
                          hint="start a new remote from a fresh anchor")


def _check_downloaded(url: str, path: str, got: str, size: int | None, max_size: int | None) -> None:
    """What arrived must be a plain file of the size the chain gives (or
    within the bound): the metadata asked before the download is the
    server's word, this is ours."""
    from ..fsutil import open_regular

    with open_regular(got, max_size=max_size, what=f"{url}: {path}") as f:
        have = os.fstat(f.fileno()).st_size
    if size is not None and have != size:
        raise RemoteError(f"{url}: {path}: downloaded {have} bytes, expected {size}")


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


class _Staging:
    """Part files cut out of a bundle for stores that upload whole files."""

    def __init__(self) -> None:
        self.dir: str | None = None

    def file_for(self, u: Upload) -> str:
        if u.offset == 0 and os.path.getsize(u.source) == u.length:
            return u.source
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix=".wdiff-parts-", dir=os.path.dirname(os.path.abspath(u.source)))
        dest = os.path.join(self.dir, u.path.replace("/", "_"))
        with open(u.source, "rb") as f, open(dest, "wb") as out:
            f.seek(u.offset)
            left = u.length
            while left:
                piece = f.read(min(8 << 20, left))
                out.write(piece)
                left -= len(piece)
        return dest

    def cleanup(self) -> None:
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


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
            return raw, _NewBranch(start)
        self._sha = sha
        if sha is None:
            self._fresh = True
            return None, None
        raw = self._download_chain(sha)
        self._fresh = raw is None
        return raw, sha

    def _download_chain(self, sha: str) -> bytes | None:
        from huggingface_hub import errors as he
        from huggingface_hub import hf_hub_download

        try:
            size = self._size(CHAIN, sha)
        except NotFoundError:
            size = None
        if size is None:
            return None
        _refuse_large_chain(self.url, size)
        with tempfile.TemporaryDirectory(prefix="wdiff-chain-") as tmp:
            try:
                with hub_errors(self.url, CHAIN):
                    path = hf_hub_download(self.repo_id, self._remote(CHAIN), repo_type=self.repo_type,
                                           revision=sha, local_dir=tmp, token=self._token,
                                           tqdm_class=_bar_class(None))
            except NotFoundError:
                return None
            except he.EntryNotFoundError:  # pragma: no cover - mapped above
                return None
            return read_chain_file(path, self.url)

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
              reporter: Reporter = SILENT) -> None:
        check_fetch_args(size, max_size)
        if self._sha is None:
            self.read_chain()
        if max_size is not None:
            # a small object of unknown size: ask its size first, so that a
            # hostile repository cannot make us download without end
            have = self._size(path, self._sha)
            if have is None:
                raise NotFoundError(f"{self.url}: object {path} is missing")
            if have > max_size:
                raise IntegrityError(f"{self.url}: {path}: {have} bytes, more than the {max_size} this object may have")
            self._fetch_small(path, dest, size, max_size, reporter)
            return
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.repo_id, self._remote(path), repo_type=self.repo_type, revision=self._sha)
        _resume_get(self.url, path, url, build_hf_headers(token=self._token), dest, size, reporter)

    def _fetch_small(self, path: str, dest: str, size: int | None, max_size: int | None, reporter: Reporter) -> None:
        """An object of unknown size (a signature): whole, through the client,
        and checked against its bound once it has arrived."""
        from huggingface_hub import hf_hub_download

        landing = os.path.join(os.path.dirname(os.path.abspath(dest)), ".hub-download")
        os.makedirs(landing, exist_ok=True)
        try:
            with hub_errors(self.url, path):
                got = hf_hub_download(self.repo_id, self._remote(path), repo_type=self.repo_type,
                                      revision=self._sha, local_dir=landing, token=self._token,
                                      tqdm_class=_bar_class(None))
            _check_downloaded(self.url, path, got, size, max_size)
            os.replace(got, dest)
            reporter.advance(os.path.getsize(dest))
        finally:
            shutil.rmtree(landing, ignore_errors=True)

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        from huggingface_hub import CommitOperationAdd

        parent = self._prepare(token, reporter)
        staging = _Staging()
        ops: list = []
        opened = ops[:]  # every upload's operation, for closing its file objects
        try:
            for u in uploads:
                ops.append(self._upload(u, staging, reporter))
                opened.append(ops[-1])
            # the Hub takes fewer than 100 files per commit: parts go ahead in batches,
            # each conditional on the previous commit; the chain rides with the last batch
            while len(ops) >= MAX_FILES_PER_COMMIT:
                batch, ops = ops[: MAX_FILES_PER_COMMIT - 1], ops[MAX_FILES_PER_COMMIT - 1 :]
                parent = self._commit(batch, parent, message + " (parts)")
            ops.append(CommitOperationAdd(path_in_repo=self._remote(CHAIN), path_or_fileobj=chain))
            if self._fresh and not self._has(CARD, parent):
                ops.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=model_card(self).encode()))
            self._commit(ops, parent, message)
        finally:
            for op in opened:
                if isinstance(op.path_or_fileobj, _Slice):
                    op.path_or_fileobj.close()
            staging.cleanup()

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

    def _commit(self, ops: list, parent: str, message: str) -> str:
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


class BucketStore(Writer):
    def __init__(self, url: str, bucket_id: str, prefix: str, *, token: str | None = None,
                 private: bool = True) -> None:
        from huggingface_hub import HfApi

        self.url = url
        self.bucket_id = bucket_id
        self.prefix = prefix
        self.private = private
        self.api = HfApi(token=token)

    def _remote(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def _exists(self, paths: list[str]) -> dict[str, int] | None:
        """Sizes of the objects among ``paths`` that exist; None when the
        bucket itself does not."""
        if not paths:
            return {}
        try:
            with hub_errors(self.url, "bucket"):
                infos = list(self.api.get_bucket_paths_info(self.bucket_id, [self._remote(p) for p in paths]))
        except NotFoundError:
            return None
        back = {self._remote(p): p for p in paths}
        return {back[i.path]: i.size for i in infos if i.path in back and getattr(i, "size", None) is not None}

    def read_chain(self) -> tuple[bytes | None, object]:
        have = self._exists([CHAIN])
        if have is None:
            return None, None
        if CHAIN not in have:
            return None, b""
        _refuse_large_chain(self.url, have[CHAIN])
        with tempfile.TemporaryDirectory(prefix="wdiff-chain-") as tmp:
            dest = os.path.join(tmp, CHAIN)
            with hub_errors(self.url, CHAIN):
                self.api.download_bucket_files(self.bucket_id, [(self._remote(CHAIN), dest)], raise_on_missing_files=True)
            raw = read_chain_file(dest, self.url)
        return raw, xxhash.xxh3_128_digest(raw)

    def fetch(self, path: str, dest: str, *, size: int | None = None, max_size: int | None = None,
              reporter: Reporter = SILENT) -> None:
        check_fetch_args(size, max_size)
        if os.path.exists(dest):
            os.unlink(dest)  # no ranged resume through the bucket API: parts are the resume unit
        if max_size is not None:
            have = (self._exists([path]) or {}).get(path)
            if have is None:
                raise NotFoundError(f"{self.url}: object {path} is missing")
            if have > max_size:
                raise IntegrityError(f"{self.url}: {path}: {have} bytes, more than the {max_size} this object may have")
        try:
            with hub_errors(self.url, path):
                self.api.download_bucket_files(self.bucket_id, [(self._remote(path), dest)], raise_on_missing_files=True)
            _check_downloaded(self.url, path, dest, size, max_size)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(dest)
            raise
        reporter.advance(os.path.getsize(dest))

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        try:
            with hub_errors(self.url, "bucket"):
                self.api.bucket_info(self.bucket_id)
        except NotFoundError:
            with hub_errors(self.url, "create bucket"):
                self.api.create_bucket(self.bucket_id, private=self.private, exist_ok=True)
            reporter.warn(f"created the {'private' if self.private else 'public'} bucket {self.bucket_id}"
                          + (" (push with --public, or private=False, to create a public one)" if self.private else ""))
        self._check(token)
        have = self._exists([u.path for u in uploads]) or {}
        todo = [u for u in uploads if have.get(u.path) != u.length]  # a rerun reuses parts already stored
        staging = _Staging()
        try:
            if todo:
                adds = [(staging.file_for(u), self._remote(u.path)) for u in todo]
                counted = _Counted(sum(u.length for u in todo))

                def work(sink) -> None:
                    counted.sink = sink
                    with _routed_xet_upload_progress(counted):
                        self.api.batch_bucket_files(self.bucket_id, add=adds)

                with hub_errors(self.url, "upload"):
                    _pumped(reporter, work)
                reporter.advance(counted.total - counted.done)
            reporter.advance(sum(u.length for u in uploads if u not in todo))
            self._check(token)  # parts first, then the chain, if nobody got in between
            with hub_errors(self.url, "upload chain"):
                self.api.batch_bucket_files(self.bucket_id, add=[(chain, self._remote(CHAIN))])
        finally:
            staging.cleanup()

    def _check(self, token: object) -> None:
        _, current = self.read_chain()
        if current != token and not (token is None and current == b""):
            raise ConflictError(f"{self.url}: the chain changed since it was read (another push?)", hint="run the push again")


# -- transfers: resumable downloads, and progress without huggingface_hub's bars ----------


def _resume_get(where: str, path: str, url: str, headers: dict, dest: str, size: int, reporter: Reporter) -> None:
    """Download ``url`` (``size`` bytes) into ``dest``, continuing from the
    bytes an interrupted run left there with a Range request. The caller
    checks the whole file's digest and discards it when it does not match."""
    from huggingface_hub.file_download import http_get

    have = os.path.getsize(dest) if os.path.exists(dest) else 0
    if have > size:  # not a prefix of this object
        os.unlink(dest)
        have = 0
    reporter.file(path, size)
    if have:
        reporter.advance(have)
    if have == size:
        return
    with hub_errors(where, path), open(dest, "ab") as f:
        # http_get sends "Range: bytes=have-", starts over (truncating) if the
        # server ignores it, retries a broken stream from where it stopped,
        # and checks the final size
        http_get(url, f, resume_size=have, headers=headers, expected_size=size,
                 displayed_filename=os.path.basename(path), tqdm_class=_bar_class(reporter.advance))
    got = os.path.getsize(dest)
    if got != size:
        raise RemoteError(f"{where}: {path}: downloaded {got} bytes, expected {size}")


def _bar_class(advance):
    """A stand-in for tqdm, for huggingface_hub's per-call ``tqdm_class``:
    it draws nothing and hands byte counts to ``advance`` (None: drops them)."""

    class _Bar:
        def __init__(self, *args, **kwargs) -> None:
            self.n = kwargs.get("initial") or 0
            self.total = kwargs.get("total")

        def update(self, n=1) -> None:
            self.n += n or 0
            if advance is not None and n and n > 0:
                advance(int(n))

        def set_postfix_str(self, *args, **kwargs) -> None:
            pass

        def set_description(self, *args, **kwargs) -> None:
            pass

        def refresh(self, *args, **kwargs) -> None:
            pass

        def close(self) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    return _Bar


class _Counted:
    """Bytes of one transfer, from any thread, never more than ``total``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.sink = None
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            n = min(n, self.total - self.done)
            if n <= 0:
                return
            self.done += n
        if self.sink is not None:
            self.sink(n)


def _pumped(reporter: Reporter, work) -> None:
    """Run ``work(sink)`` on a helper thread while this one hands what it
    passes to ``sink`` (from any thread: hf_xet calls back from its own) to
    ``reporter.advance``: reporters are called from the operation's thread
    only. The helper's exception is raised here. Nothing is committed on the
    helper: an interrupted upload leaves only objects no chain names."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work(q.put)
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            failure.append(e)
        finally:
            q.put(None)

    t = threading.Thread(target=run, name="wdiff-hub-upload", daemon=True)
    t.start()
    while (n := q.get()) is not None:
        reporter.advance(n)
    t.join()
    if failure:
        raise failure[0]


class _Slice(io.BufferedIOBase):
    """``length`` bytes of a file from ``offset``, as a seekable file object
    that counts what the uploader reads (into ``sink``, when set)."""

    def __init__(self, path: str, offset: int, length: int) -> None:
        super().__init__()
        self._f = open(path, "rb")
        self._offset, self._length, self._pos = offset, length, 0
        self.sink = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + pos))
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        left = self._length - self._pos
        n = left if n is None or n < 0 else min(n, left)
        if n <= 0:
            return b""
        self._f.seek(self._offset + self._pos)
        data = self._f.read(n)
        self._pos += len(data)
        if data and self.sink is not None:
            self.sink(len(data))
        return data

    def read1(self, n: int = -1) -> bytes:
        return self.read(n)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


# huggingface_hub 2.4 gives an upload no per-call progress hook: under Xet it
# makes an XetUploadProgressReporter (tqdm bars on stderr) whenever progress
# bars are on, and passes its callback to hf_xet. wdiff routes that one class,
# for its own calls only (a context variable says which), to a counter that
# draws nothing; everyone else's uploads get huggingface_hub's bars as before.
# When bars are off (HF_HUB_DISABLE_PROGRESS_BARS=1) no callback exists and
# wdiff reports each file as a whole when it is done.
_upload_counter: contextvars.ContextVar = contextvars.ContextVar("wdiff_upload_counter", default=None)
_route_lock = threading.Lock()


@contextlib.contextmanager
def _routed_xet_upload_progress(counted: _Counted):
    _route_xet_upload_progress()
    reset = _upload_counter.set(counted)
    try:
        yield
    finally:
        _upload_counter.reset(reset)


def _route_xet_upload_progress() -> None:
    try:
        from huggingface_hub.utils import _xet_progress_reporting as xp
    except ImportError:  # pragma: no cover - another huggingface_hub: whole files only
        return
    with _route_lock:
        original = getattr(xp, "XetUploadProgressReporter", None)
        if original is None or getattr(original, "_wdiff_routed", False):
            return

        class XetUploadProgressReporter:
            _wdiff_routed = True
            __doc__ = original.__doc__

            def __new__(cls, *args, **kwargs):
                counted = _upload_counter.get()
                if counted is None:
                    return original(*args, **kwargs)
                return _XetUploadCounter(counted)

        xp.XetUploadProgressReporter = XetUploadProgressReporter


class _XetUploadCounter:
    """What huggingface_hub calls on its Xet upload reporter, counting the
    file bytes hf_xet has processed (deduplicated bytes count as done)."""

    def __init__(self, counted: _Counted) -> None:
        self.counted = counted
        self._seen = 0
        self._lock = threading.Lock()

    def update_progress(self, group_report, item_reports=None) -> None:
        done = int(getattr(group_report, "total_bytes_completed", 0) or 0)
        with self._lock:
            n, self._seen = done - self._seen, max(done, self._seen)
        if n > 0:
            self.counted(n)

    def reset_for_next_commit(self) -> None:
        with self._lock:
            self._seen = 0

    def close(self) -> None:
        pass
