"""A real S3 implementation on 127.0.0.1 for the tests: moto's server (the S3
HTTP API, with conditional PUTs: If-Match / If-None-Match answer 412), plus a
small HTTP proxy in front of it that injects faults (an HTTP status on chosen
requests, a connection dropped partway through a response body).

moto's server checks a conditional PUT and then stores the object without a
lock, so two racing PUTs can both pass the check; S3 itself decides them
atomically. ``MotoS3`` serialises moto's PutObject and CompleteMultipartUpload
handlers (one lock, in this process), which gives the stand-in S3's guarantee;
everything else stays concurrent.
"""

from __future__ import annotations

import http.client
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACCESS_KEY = "AKIDWDIFFTESTS0000000"
SECRET_KEY = "wdiff-test-secret-0123456789abcdefghijklmn"


class MotoS3:
    """moto's ThreadedMotoServer on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        import logging

        _serialise_conditional_writes()
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def __enter__(self) -> MotoS3:
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    def new_bucket(self) -> str:
        name = f"wdiff-{uuid.uuid4().hex[:12]}"
        self._fs().mkdir(name)
        return name

    def allow_anonymous_reads(self, bucket: str) -> None:
        """A bucket policy that lets anyone GET objects and list the bucket,
        as an operator grants a fleet's cache (by source address, in real
        life). moto applies it to GET but not to HEAD (which S3 also grants
        with s3:GetObject); a caching proxy turns HEAD into GET anyway."""
        import json

        policy = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],
             "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}
        self._fs().call_s3("put_bucket_policy", Bucket=bucket, Policy=json.dumps(policy))

    def _fs(self):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=self.endpoint, key=ACCESS_KEY,
                                 secret=SECRET_KEY, use_listings_cache=False)

    def flip_byte(self, key: str) -> None:
        """Flip one bit in the middle of object ``key`` (BUCKET/PATH)."""
        fs = self._fs()
        data = bytearray(fs.cat_file(key))
        data[len(data) // 2] ^= 1
        fs.pipe_file(key, bytes(data))


_lock = threading.Lock()


def _serialise_conditional_writes() -> None:
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_wdiff_serialised", False):
        return
    for name in ("put_object", "_key_response_post"):
        real = getattr(S3Response, name, None)
        if real is None:
            continue

        def locked(self, *a, _real=real, **kw):
            with _lock:
                return _real(self, *a, **kw)

        setattr(S3Response, name, locked)
    S3Response._wdiff_serialised = True


def configure(monkeypatch, endpoint: str) -> None:
    """The standard AWS variables, pointing at the stand-in; nothing else."""
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask 169.254.169.254


class FaultProxy:
    """HTTP proxy to ``upstream`` (moto) that can fail or cut requests.

    ``fail(method, match, status, times)``: the next ``times`` requests whose
    method is ``method`` and whose ``PATH?QUERY RANGE`` (the Range header's
    value, or nothing) contains ``match`` are answered
    with ``status`` and an S3 error body, never reaching the server.
    ``drop(method, match, after, times)``: those requests are forwarded, and
    the response's headers (full Content-Length) and its first ``after`` body
    bytes are sent before the connection is closed.
    ``log``: (method, path+query, Range header, status, body bytes sent)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.split("://", 1)[1]
        self.faults: list[dict] = []
        self.log: list[tuple] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # noqa: D401 - quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        n = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if n == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(n)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _handle(self) -> None:
                body = self._body()
                rng = self.headers.get("Range")
                fault = proxy._take(self.command, f"{self.path} {rng or ''}")
                if fault is not None and fault["kind"] == "fail":
                    msg = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
                           b"<Message>injected by the test proxy</Message></Error>")
                    self.send_response(fault["status"])
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    proxy._record(self.command, self.path, rng, fault["status"], len(msg))
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "content-length")}
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection", "date", "server"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                if fault is not None:  # drop: headers, some of the body, then hang up
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data[: fault["after"]])
                    self.wfile.flush()
                    proxy._record(self.command, self.path, rng, resp.status, min(len(data), fault["after"]))
                    self.close_connection = True
                    return
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                proxy._record(self.command, self.path, rng, resp.status, len(data))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def fail(self, method: str, match: str, status: int = 503, times: int = 1) -> None:
        with self._lock:
            self.faults.append({"kind": "fail", "method": method, "match": match, "status": status, "times": times})

    def drop(self, method: str, match: str, after: int, times: int = 1) -> None:
        with self._lock:
            self.faults.append({"kind": "drop", "method": method, "match": match, "after": after, "times": times})

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def _take(self, method: str, path: str) -> dict | None:
        with self._lock:
            for f in self.faults:
                if f["method"] == method and f["match"] in path and f["times"] > 0:
                    f["times"] -= 1
                    return f
        return None

    def _record(self, *row) -> None:
        with self._lock:
            self.log.append(row)
