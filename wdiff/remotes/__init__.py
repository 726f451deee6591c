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

__all__ = ["Reader", "Upload", "Writer", "open_remote", "parse_remote", "suggest"]

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"


def parse_remote(url: str) -> dict:
    """Split a remote URL into its parts; raises UsageError if unsupported."""
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


def suggest(url: str | os.PathLike) -> str | None:
    """A hint for a remote that was not found: ``you/model`` is read as a
    relative directory, but was most likely meant as a Hub repository."""
    url = os.fspath(url)
    if "://" in url or os.path.isabs(url) or os.path.lexists(url):
        return None
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

        return LocalStore(spec["path"], url)
    if spec["kind"] == "objstore":
        from .stores import open_store

        return open_store(url, spec)
    from .hub import open_hub

    return open_hub(url, spec, token=token, private=private, create=create)
