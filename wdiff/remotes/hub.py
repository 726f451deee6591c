"""Hugging Face Hub remotes: model and dataset repositories, and Storage
Buckets. The only module that imports huggingface_hub.

Repositories are git-versioned: a push is one commit holding the parts and
the new ``chain.json``, made with ``parent_commit`` set to the commit the
chain was read at, so of two concurrent pushers one wins and the other gets
HTTP 412 (ConflictError). Everything lives under ``wdiff/`` in the repo, so a
repository can hold a model card or a full checkpoint beside the chain.
Downloads are pinned to the commit the chain was read at.

Buckets are mutable and have no transactions: parts are written first under
names no chain refers to yet, the chain is read again, and only then written;
a push that died halfway leaves unreferenced parts that a rerun reuses.

Authentication is huggingface_hub's own (HF_TOKEN, ``hf auth login``); wdiff
never reads, logs or prints a token. huggingface_hub checks only the size of
what it downloads: wdiff verifies every part against its own digest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import xxhash

from ..errors import AuthError, ConflictError, FormatError, IntegrityError, NotFoundError, RemoteError, WdiffError
from ..progress import SILENT, Reporter
from .base import CHAIN, MAX_CHAIN_OBJECT, Upload, Writer, check_fetch_args, read_chain_file

REPO_ROOT = "wdiff"
MAX_FILES_PER_COMMIT = 80  # the Hub asks for fewer than 100
COMMIT_RETRIES = 2


def open_hub(url: str, spec: dict) -> Writer:
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # wdiff draws its own progress, and only on a terminal
    if spec["kind"] == "bucket":
        return BucketStore(url, spec["repo_id"], spec["prefix"])
    return RepoStore(url, spec["repo_id"], spec["kind"], spec["revision"])


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


class RepoStore(Writer):
    def __init__(self, url: str, repo_id: str, repo_type: str, revision: str) -> None:
        from huggingface_hub import HfApi

        self.url = url
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.revision = revision
        self.api = HfApi()
        self._sha: str | None = None  # the commit the chain was read at

    def _remote(self, path: str) -> str:
        return f"{REPO_ROOT}/{path}"

    def _head(self) -> str | None:
        """The commit the revision points at; None when there is no repository."""
        from huggingface_hub import errors as he

        try:
            with hub_errors(self.url, "repository"):
                try:
                    return self.api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision).sha
                except he.RepositoryNotFoundError:
                    return None
        except NotFoundError:
            raise NotFoundError(f"{self.url}: revision {self.revision!r} not found") from None

    def read_chain(self) -> tuple[bytes | None, object]:
        sha = self._head()
        self._sha = sha
        if sha is None:
            return None, None
        return self._download_chain(sha), sha

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
                                           revision=sha, local_dir=tmp)
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
        from huggingface_hub import hf_hub_download

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
        landing = os.path.join(os.path.dirname(os.path.abspath(dest)), ".hub-download")
        os.makedirs(landing, exist_ok=True)
        try:
            with hub_errors(self.url, path):
                got = hf_hub_download(self.repo_id, self._remote(path), repo_type=self.repo_type,
                                      revision=self._sha, local_dir=landing)
            _check_downloaded(self.url, path, got, size, max_size)
            os.replace(got, dest)
            reporter.advance(os.path.getsize(dest))
        finally:
            shutil.rmtree(landing, ignore_errors=True)

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        from huggingface_hub import CommitOperationAdd

        parent = token
        if parent is None:  # no repository when the chain was read: create it, and make sure it is still empty
            with hub_errors(self.url, "create repository"):
                self.api.create_repo(self.repo_id, repo_type=self.repo_type, exist_ok=True)
            parent = self._head()
            if parent is None or self._download_chain(parent) is not None:
                raise ConflictError(f"{self.url}: someone else pushed meanwhile", hint="run the push again")
        staging = _Staging()
        try:
            ops = [CommitOperationAdd(path_in_repo=self._remote(u.path), path_or_fileobj=staging.file_for(u)) for u in uploads]
            # the Hub takes fewer than 100 files per commit: parts go ahead in batches,
            # each conditional on the previous commit; the chain rides with the last batch
            while len(ops) >= MAX_FILES_PER_COMMIT:
                batch, ops = ops[: MAX_FILES_PER_COMMIT - 1], ops[MAX_FILES_PER_COMMIT - 1 :]
                parent = self._commit(batch, parent, message + " (parts)")
            ops.append(CommitOperationAdd(path_in_repo=self._remote(CHAIN), path_or_fileobj=chain))
            self._commit(ops, parent, message)
            reporter.advance(sum(u.length for u in uploads))
        finally:
            staging.cleanup()

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


class BucketStore(Writer):
    def __init__(self, url: str, bucket_id: str, prefix: str) -> None:
        from huggingface_hub import HfApi

        self.url = url
        self.bucket_id = bucket_id
        self.prefix = prefix
        self.api = HfApi()

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
                self.api.create_bucket(self.bucket_id, exist_ok=True)
        self._check(token)
        have = self._exists([u.path for u in uploads]) or {}
        todo = [u for u in uploads if have.get(u.path) != u.length]  # a rerun reuses parts already stored
        staging = _Staging()
        try:
            if todo:
                adds = [(staging.file_for(u), self._remote(u.path)) for u in todo]
                with hub_errors(self.url, "upload"):
                    self.api.batch_bucket_files(self.bucket_id, add=adds)
            reporter.advance(sum(u.length for u in uploads))
            self._check(token)  # parts first, then the chain, if nobody got in between
            with hub_errors(self.url, "upload chain"):
                self.api.batch_bucket_files(self.bucket_id, add=[(chain, self._remote(CHAIN))])
        finally:
            staging.cleanup()

    def _check(self, token: object) -> None:
        _, current = self.read_chain()
        if current != token and not (token is None and current == b""):
            raise ConflictError(f"{self.url}: the chain changed since it was read (another push?)", hint="run the push again")
