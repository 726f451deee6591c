"""Remotes: where bundles and the chain index live.

:func:`open_remote` is the one place that understands remote URLs:

``/path``, ``./path``, ``file:///path``      a local directory
``hf://ORG/NAME[@REV][/SUBFOLDER]``           a Hub model repository (chain in
                                              SUBFOLDER, default ``wdiff``)
``hf://models/ORG/NAME[@REV][/SUBFOLDER]``     the same, explicitly
``hf://datasets/ORG/NAME[@REV][/SUBFOLDER]``   a Hub dataset repository
``hf://buckets/ORG/NAME[/PREFIX]``            a Hub Storage Bucket
``s3://BUCKET[/PREFIX]``                      an S3 (or S3-compatible) bucket
``gs://BUCKET[/PREFIX]``, ``az://CONTAINER[/PREFIX]``, ``abfs://...``, any other
fsspec URL                                    an object store through fsspec

Only the Hub module imports huggingface_hub, and only when a Hub URL is used;
only the object-store modules (objstore.py, stores.py) import fsspec and its
stores.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlparse

from ..errors import UsageError
from .base import Reader, Upload, Writer

__all__ = ["Reader", "Upload", "Writer", "missing_remote", "near_url", "open_remote", "parse_remote", "suggest"]

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
#: schemes a remote URL is written with, when a user drops a slash or two
_NEAR = re.compile(r"(hf|s3|s3a|gs|gcs|az|abfs|abfss)(?::/?|//)(?!/)(.+)", re.I | re.S)
#: the Hub's web address of a repository, pasted from a browser
_WEB = re.compile(r"(?:https?:/{1,2})?(?:www\.)?(?:huggingface\.co|hf\.co)/(?:(datasets|buckets)/)?"
                  rf"({_NAME}/{_NAME})(?:/tree/([^/]+))?/*", re.I)


def parse_remote(url: str) -> dict:
    """Split a remote URL into its parts; raises UsageError if unsupported."""
    web = _WEB.fullmatch(url) if "://" in url else None
    if web:
        raise UsageError(f"{url} is the repository's web page, not a remote", hint=f"did you mean {near_url(url)}?")
    if url.startswith("hf://"):
        rest = url[len("hf://"):]
        kind = "model"
        for prefix, k in (("models/", "model"), ("datasets/", "dataset"), ("buckets/", "bucket")):
            if rest.startswith(prefix):
                kind, rest = k, rest[len(prefix):]
                break
        if kind == "bucket":
            m = re.fullmatch(rf"({_NAME})/({_NAME})(?:/(.*))?", rest)
            if not m:
                raise UsageError(f"{url}: expected hf://buckets/ORG/NAME[/PREFIX]")
            return {"kind": "bucket", "repo_id": f"{m.group(1)}/{m.group(2)}", "prefix": _folder(url, m.group(3))}
        m = re.fullmatch(rf"({_NAME})/({_NAME})(?:@([^/]+))?(?:/(.*))?", rest)
        if not m:
            raise UsageError(f"{url}: expected hf://[datasets/]ORG/NAME[@REVISION][/SUBFOLDER]")
        return {"kind": kind, "repo_id": f"{m.group(1)}/{m.group(2)}", "revision": m.group(3) or "main",
                "subfolder": _folder(url, m.group(4))}
    if "://" in url and not url.startswith("file://"):
        from .objstore import parse

        return parse(url)
    if "://" in url:
        p = urlparse(url)
        if p.netloc not in ("", "localhost"):
            raise UsageError(f"{url}: unsupported remote (use a directory, file://, hf://, s3://, gs://, az:// "
                             "or another fsspec store URL)")
        return {"kind": "local", "path": unquote(p.path)}
    return {"kind": "local", "path": url}


def near_url(text: str | os.PathLike) -> str | None:
    """The remote URL that ``text`` was most likely meant to be, when it is
    not one: ``hf:/ORG/NAME`` or ``hf:ORG/NAME`` (one slash or none, which
    is what a path type keeps of ``hf://``: these read as local paths), or
    a Hub web address (``https://huggingface.co/ORG/NAME``); else None."""
    text = os.fspath(text)
    web = _WEB.fullmatch(text)
    if web:
        kind, repo, rev = web.groups()
        kind = kind.lower() if kind else None
        return f"hf://{kind + '/' if kind else ''}{repo}{'@' + rev if rev and kind != 'buckets' else ''}"
    m = _NEAR.fullmatch(text)
    if m and "://" not in text:
        return f"{m.group(1).lower()}://{m.group(2)}"
    return None


def missing_remote(store):
    """The NotFoundError for a remote of which ``store.read_chain()`` found
    no trace, with what the store can say about why (a Hub repository read
    without a token may be a private one: the Hub does not say which) and
    the next step."""
    from ..errors import NotFoundError

    said = store.why_absent()
    if said is not None:
        return NotFoundError(said[0], hint=said[1])
    return NotFoundError(f"{store.url}: no such remote", hint=suggest(store.url))


def suggest(url: str | os.PathLike) -> str | None:
    """A hint for a remote that was not found: ``you/model`` is read as a
    relative directory, but was most likely meant as a Hub repository."""
    url = os.fspath(url)
    if "://" in url or os.path.isabs(url) or os.path.lexists(url):
        return None
    fixed = near_url(url)
    if fixed is not None:
        return f"did you mean {fixed}? A remote without a scheme is a local directory"
    if re.fullmatch(rf"{_NAME}/{_NAME}(?:@[^/]+)?", url) and not url.startswith("."):
        return f"did you mean hf://{url}? A remote without a scheme is a local directory"
    return None


def _folder(url: str, raw: str | None) -> str:
    folder = (raw or "").strip("/")
    if folder and any(p in ("", ".", "..") for p in folder.split("/")):
        raise UsageError(f"{url}: bad folder {folder!r}")
    return folder


def open_remote(url: str | os.PathLike, *, token: str | None = None, private: bool = True,
                create: bool = False) -> Writer:
    """The store behind ``url``. Object stores take their credentials from
    their own configuration (for S3: AWS_* variables, profiles, instance
    metadata). For Hub remotes: ``token`` (default:
    huggingface_hub's own, HF_TOKEN or a stored login), ``private`` for a
    repository or bucket a push creates, and ``create`` for a pusher, to whom
    a branch that does not exist yet reads as one to create."""
    url = os.fspath(url)
    spec = parse_remote(url)
    if spec["kind"] == "local":
        from .local import LocalStore

        fixed = near_url(url)
        if fixed is not None and not os.path.lexists(spec["path"]):
            # hf:/org/name would become a local folder "hf:" (a push creates it)
            raise UsageError(f"{url} is not a remote URL: it would be read as a local path",
                             hint=f"did you mean {fixed}?")

        return LocalStore(spec["path"], url)
    if spec["kind"] == "objstore":
        from .stores import open_store

        return open_store(url, spec)
    from .hub import open_hub

    return open_hub(url, spec, token=token, private=private, create=create)
