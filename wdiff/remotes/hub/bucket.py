"""Hub Storage Buckets: mutable, non-versioned, non-transactional (see the
package's docstring)."""

from __future__ import annotations

import contextlib
import os

import xxhash

from ...errors import ConflictError, IntegrityError, NotFoundError
from ...fsutil import scratch_dir
from ...progress import SILENT, Reporter
from ..base import CHAIN, Upload, Writer, check_deletable, check_fetch_args, check_prefix, read_chain_file
from .transfer import (
    _check_downloaded,
    _Counted,
    _pumped,
    _refuse_large_chain,
    _routed_xet_upload_progress,
    _Staging,
    absent,
    hub_errors,
)


class BucketStore(Writer):
    def __init__(self, url: str, bucket_id: str, prefix: str, *, token: str | None = None,
                 private: bool = True) -> None:
        from huggingface_hub import HfApi

        self.url = url
        self.bucket_id = bucket_id
        self.prefix = prefix
        self.private = private
        self._token = token  # None: huggingface_hub's own (HF_TOKEN, stored login)
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

    def why_absent(self) -> tuple[str, str]:
        return absent(self.url, "bucket", self._token)

    def read_chain(self) -> tuple[bytes | None, object]:
        have = self._exists([CHAIN])
        if have is None:
            return None, None
        if CHAIN not in have:
            return None, b""
        _refuse_large_chain(self.url, have[CHAIN])
        with scratch_dir("chain") as tmp:
            dest = os.path.join(tmp, CHAIN)
            with hub_errors(self.url, CHAIN):
                self.api.download_bucket_files(self.bucket_id, [(self._remote(CHAIN), dest)], raise_on_missing_files=True)
            raw = read_chain_file(dest, self.url)
        return raw, xxhash.xxh3_128_digest(raw)

    def fetch(self, path: str, dest: str, *, size: int | None = None, max_size: int | None = None,
              reporter: Reporter = SILENT, at: str | None = None) -> None:
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
        self._store(uploads, reporter)
        self._check(token)  # parts first, then the chain, if nobody got in between
        with hub_errors(self.url, "upload chain"):
            self.api.batch_bucket_files(self.bucket_id, add=[(chain, self._remote(CHAIN))])

    def _store(self, uploads: list[Upload], reporter: Reporter) -> None:
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
        finally:
            staging.cleanup()
    def _check(self, token: object) -> None:
        _, current = self.read_chain()
        if current != token and not (token is None and current == b""):
            raise ConflictError(f"{self.url}: the chain changed since it was read (another push?)", hint="run the push again")

    # -- objects without the chain: listing, staging, removal ---------------------------

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        from huggingface_hub import BucketFile

        prefix = check_prefix(prefix)
        base = self._remote(prefix) if prefix else self.prefix
        try:
            with hub_errors(self.url, "list"):
                items = [i for i in self.api.list_bucket_tree(self.bucket_id, prefix=base or None, recursive=True)
                         if isinstance(i, BucketFile)]
        except NotFoundError:
            return []
        cut = len(self.prefix) + 1 if self.prefix else 0
        want = (base + "/") if base else ""
        return sorted((i.path[cut:], i.size) for i in items if i.path.startswith(want))

    def store(self, uploads: list[Upload], *, reporter: Reporter = SILENT) -> None:
        if any(u.path == CHAIN for u in uploads):
            raise ValueError("the chain index is written by publish only")
        if uploads:
            self._store(uploads, reporter)

    def delete(self, paths: list[str]) -> None:
        check_deletable(paths)
        if not paths:
            return
        try:
            with hub_errors(self.url, "delete"):
                self.api.batch_bucket_files(self.bucket_id, delete=[self._remote(p) for p in paths])
        except NotFoundError:
            return  # no bucket: nothing to delete
