"""The object stores with a conditional write, on top of the generic
fsspec store (objstore.py): S3 (ETag: If-Match / If-None-Match) and GCS
(ifGenerationMatch), and :func:`open_store`, which picks the store for a
parsed URL. See objstore.py's docstring for what each guarantees.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from ..errors import FormatError, NotFoundError, RemoteError
from ..progress import SILENT, Reporter
from .base import CHAIN, MAX_CHAIN_OBJECT, Upload, Writer
from .objstore import (CHUNK, MAX_PARTS, REVALIDATE, UPLOADERS, ObjectStore, _filesystem, _read_range, cache_control,
                       store_errors)


def open_store(url: str, spec: dict) -> Writer:
    protocol = spec["protocol"]
    fs = _filesystem(url, protocol)
    root = "/".join(p for p in (spec["bucket"], spec["prefix"]) if p)
    cls = {"s3": S3Store, "gs": GCSStore}.get(protocol, ObjectStore)
    return cls(url, fs, root)



# -- S3 ---------------------------------------------------------------------------------


class S3Store(ObjectStore):
    """S3 through s3fs's client: conditional chain writes (ETag), resumable
    multipart uploads. Bucket creation is the owner's business: a push to a
    bucket that does not exist is refused (not found)."""

    conditional = True

    def _split(self, key: str) -> tuple[str, str]:
        bucket, _, k = key.partition("/")
        return bucket, k

    def _call(self, method: str, what: str, *, conflict: bool = False, **kw):
        with store_errors(self.url, what, conflict=conflict):
            return self.fs.call_s3(method, **kw)

    def read_chain(self) -> tuple[bytes | None, object]:
        got = self._get_chain()
        if got is None:
            return None, (b"" if self._exists() else None)
        return got

    def _get_chain(self):
        """The chain's bytes and ETag from one GET (so the token is the
        ETag of exactly these bytes); None when there is none."""
        from fsspec.asyn import sync

        bucket, key = self._split(self._key(CHAIN))

        async def get():
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = resp["Body"]
            try:
                if int(resp.get("ContentLength") or 0) > MAX_CHAIN_OBJECT:
                    return None, resp["ETag"], True
                data = await body.read()
            finally:
                body.close()
            return data, resp["ETag"], False

        try:
            with store_errors(self.url, CHAIN):
                data, etag, big = sync(self.fs.loop, get)
        except NotFoundError:
            return None
        if big or len(data) > MAX_CHAIN_OBJECT:
            raise FormatError(f"{self.url}: chain index is larger than this wdiff accepts",
                              hint="start a new remote from a fresh anchor")
        return data, ("etag", etag)

    def _write_chain(self, chain: bytes, token: object) -> None:
        bucket, key = self._split(self._key(CHAIN))
        cond = {"IfMatch": token[1]} if isinstance(token, tuple) else {"IfNoneMatch": "*"}
        self._call("put_object", "write chain", conflict=True, Bucket=bucket, Key=key, Body=chain,
                   ContentType="application/json", CacheControl=REVALIDATE, **cond)

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        if token is None:  # nothing under the prefix: the bucket must exist
            bucket = self.root.split("/")[0]
            try:
                with store_errors(self.url, "bucket"):
                    self.fs.call_s3("head_bucket", Bucket=bucket)
            except NotFoundError:
                raise NotFoundError(f"{self.url}: no bucket {bucket!r}",
                                    hint="create the bucket first: a push does not create buckets") from None
        super().publish(uploads, chain, token, message=message, reporter=reporter)

    def _upload(self, u: Upload, reporter: Reporter) -> None:
        if self._stored(u):
            reporter.advance(u.length)
            return
        bucket, key = self._split(self._key(u.path))
        chunk = max(CHUNK, -(-u.length // MAX_PARTS))
        if u.length <= chunk:
            data = _read_range(u.source, u.offset, u.length)
            self._call("put_object", f"upload {u.path}", Bucket=bucket, Key=key, Body=data,
                       CacheControl=cache_control(u.path))
            reporter.advance(u.length)
            return
        try:
            self._multipart(u, bucket, key, chunk, reporter)
        except NotFoundError:
            # the upload went away under us: another push of the same bundle
            # completed it (then the object is there, whole) or aborted it
            self._sizes.pop(u.path, None)
            if not self._stored(u):
                raise RemoteError(f"{self.url}: the multipart upload of {u.path} was completed or aborted "
                                  "by someone else meanwhile", hint="run the push again") from None

    def _multipart(self, u: Upload, bucket: str, key: str, chunk: int, reporter: Reporter) -> None:
        upload_id, have = self._open_multipart(bucket, key, u.path)
        n = -(-u.length // chunk)

        def send(k: int) -> tuple[int, str, int]:
            off = k * chunk
            data = _read_range(u.source, u.offset + off, min(chunk, u.length - off))
            etag = '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'
            if have.get(k + 1) != (len(data), etag):  # not kept from an interrupted push
                etag = self._call("upload_part", f"upload {u.path}", Bucket=bucket, Key=key, UploadId=upload_id,
                                  PartNumber=k + 1, Body=data)["ETag"]
            return k, etag, len(data)

        # UPLOADERS chunks in flight (that many in memory); progress is
        # reported from this thread as each one is done
        etags: dict[int, str] = {}

        def collect(finished) -> None:
            for f in finished:
                j, etag, length = f.result()
                etags[j] = etag
                reporter.advance(length)

        with ThreadPoolExecutor(UPLOADERS, thread_name_prefix="wdiff-s3-upload") as pool:
            running: set = set()
            for k in range(n):
                if len(running) >= UPLOADERS:
                    finished, running = wait(running, return_when=FIRST_COMPLETED)
                    collect(finished)
                running.add(pool.submit(send, k))
            collect(wait(running).done)
        done = [{"PartNumber": k + 1, "ETag": etags[k]} for k in range(n)]
        self._call("complete_multipart_upload", f"upload {u.path}", Bucket=bucket, Key=key, UploadId=upload_id,
                   MultipartUpload={"Parts": done})

    def _open_multipart(self, bucket: str, key: str, path: str) -> tuple[str, dict]:
        """An unfinished multipart upload of ``key`` that an interrupted push
        left (its parts: number -> (size, ETag)), or a new one."""
        r = self._call("list_multipart_uploads", f"upload {path}", Bucket=bucket, Prefix=key)
        open_ = sorted((x for x in r.get("Uploads", []) if x.get("Key") == key),
                       key=lambda x: str(x.get("Initiated", "")))
        if open_:
            upload_id = open_[-1]["UploadId"]
            parts: dict = {}
            marker = 0
            while True:
                lp = self._call("list_parts", f"upload {path}", Bucket=bucket, Key=key, UploadId=upload_id,
                                PartNumberMarker=marker)
                for p in lp.get("Parts", []):
                    parts[int(p["PartNumber"])] = (int(p["Size"]), p["ETag"])
                if not lp.get("IsTruncated"):
                    return upload_id, parts
                marker = int(lp["NextPartNumberMarker"])
        r = self._call("create_multipart_upload", f"upload {path}", Bucket=bucket, Key=key,
                       CacheControl=cache_control(path))
        return r["UploadId"], {}


# -- GCS ---------------------------------------------------------------------------------


class GCSStore(ObjectStore):
    """GCS through gcsfs: the chain is written with ``ifGenerationMatch``
    (the generation it was read at; 0 when there was none). Not tested
    against a server here: no GCS emulator is packaged for offline tests."""

    conditional = True

    def read_chain(self) -> tuple[bytes | None, object]:
        key = self._key(CHAIN)
        for _ in range(5):  # generation, bytes, generation: the same twice, or read again
            try:
                with store_errors(self.url, CHAIN):
                    self.fs.invalidate_cache()
                    before = self.fs.info(key)
            except NotFoundError:
                return None, (b"" if self._exists() else None)
            self._check_info(CHAIN, before, max_size=MAX_CHAIN_OBJECT, chain=True)
            raw = self._cat_chain()
            with store_errors(self.url, CHAIN):
                self.fs.invalidate_cache()
                after = self.fs.info(key)
            if raw is not None and before.get("generation") == after.get("generation"):
                return raw, ("generation", str(before.get("generation")))
        raise RemoteError(f"{self.url}: the chain keeps changing while it is read", hint="try again")

    def _write_chain(self, chain: bytes, token: object) -> None:
        import json
        from urllib.parse import quote

        from fsspec.asyn import sync

        generation = token[1] if isinstance(token, tuple) else "0"
        bucket, _, key = self._key(CHAIN).partition("/")
        meta = json.dumps({"name": key, "cacheControl": REVALIDATE})
        body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
                "Content-Type: application/json\n\n").encode() + chain + b"\n--==0==--"
        path = f"{self.fs._location}/upload/storage/v1/b/{quote(bucket)}/o"

        async def put():
            return await self.fs._call("POST", path, uploadType="multipart", ifGenerationMatch=generation,
                                       headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                                       data=body, json_out=True)

        with store_errors(self.url, "write chain", conflict=True):
            sync(self.fs.loop, put)
