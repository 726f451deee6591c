"""Moving bytes to and from the Hub: the one place huggingface_hub's
exceptions become wdiff's, resumable downloads, part files cut out of a
bundle, and progress reporting without huggingface_hub's bars (see the
package's docstring)."""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import queue
import shutil
import tempfile
import threading

from ...errors import AuthError, ConflictError, FormatError, NotFoundError, RemoteError, WdiffError
from ...progress import Reporter
from ..base import MAX_CHAIN_OBJECT, Upload


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


def absent(url: str, what: str, token: str | None) -> tuple[str, str]:
    """Why a Hub repository or bucket reads as absent, and the next step.
    Asked without a token, the Hub answers a private repository exactly as
    a missing one (HTTP 401, "Repository not found"), so a message that
    said "no such remote" would send the owner of a private repository
    (what a first push makes) looking for a typo; ``hf download`` says the
    same. With a token, one that cannot read it gets a 404 too."""
    from huggingface_hub.utils import build_hf_headers

    sent = any(k.lower() == "authorization" for k in build_hf_headers(token=token))
    if not sent:
        return (f"{url}: no such {what}, or a private one: no Hub token was sent",
                "if it is private (a first push makes it so), log in with `hf auth login` or set HF_TOKEN; "
                "else check the name")
    return (f"{url}: no such {what}, or one this token cannot read",
            "check the name, and that the token (HF_TOKEN or `hf auth login`) belongs to an account that can read it")


def _not_found() -> tuple:
    from huggingface_hub import errors as he

    names = ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "BucketNotFoundError")
    return tuple(getattr(he, n) for n in names if hasattr(he, n))


def _refuse_large_chain(url: str, size: int) -> None:
    if size > MAX_CHAIN_OBJECT:
        raise FormatError(f"{url}: chain index is larger than this wdiff accepts",
                          hint="start a new remote from a fresh anchor")


def _refuse_status(url: str, what: str, status: int) -> None:
    """An HTTP error status read off a streamed response, whose body (the
    server's, any length) is not read."""
    if status in (401, 403):
        raise AuthError(f"{url}: {what}: the Hub refused the credentials (HTTP {status})",
                        hint="set HF_TOKEN or run `hf auth login` with a token that can access the repository")
    raise RemoteError(f"{url}: {what}: HTTP {status}", hint="the Hub may be busy; try again")


def _check_downloaded(url: str, path: str, got: str, size: int | None, max_size: int | None) -> None:
    """What arrived must be a plain file of the size the chain gives (or
    within the bound): the metadata asked before the download is the
    server's word, this is ours."""
    from ...fsutil import open_regular

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
