"""Hugging Face Hub remotes: model and dataset repositories, and Storage
Buckets. The only module that imports huggingface_hub.

Repositories are git-versioned: a push is two commits, the parts first,
with ``parent_commit`` set to the commit the chain was read at, then the new
``chain.json`` on that commit, recording it as the commit that added each
new part; of two concurrent pushers one wins and the other gets HTTP 412
(ConflictError), and a push that dies between the two leaves only parts no
chain names (``wdiff gc`` removes them). Everything lives under ``wdiff/``
in the repo (or the subfolder the URL names), so a repository can hold a
model card or a full checkpoint beside the chain. The chain is read at the
commit the branch names, with one GET bounded by wdiff's limit; each part at
the commit the chain records for it (one URL for ever, which a fleet's
cache keeps), or, in a chain written before, at the chain's commit.

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

from ..base import Writer

__all__ = ["BucketStore", "RepoStore", "open_hub"]


def open_hub(url: str, spec: dict, *, token: str | None = None, private: bool = True,
             create: bool = False) -> Writer:
    from .bucket import BucketStore
    from .repo import RepoStore

    if spec["kind"] == "bucket":
        return BucketStore(url, spec["repo_id"], spec["prefix"], token=token, private=private)
    return RepoStore(url, spec["repo_id"], spec["kind"], spec["revision"], subfolder=spec.get("subfolder") or "",
                     token=token, private=private, create=create)


def __getattr__(name: str):
    # the stores by name (wdiff.remotes.hub.RepoStore) without importing
    # huggingface_hub's users before a Hub URL is opened
    if name == "RepoStore":
        from .repo import RepoStore

        return RepoStore
    if name == "BucketStore":
        from .bucket import BucketStore

        return BucketStore
    raise AttributeError(name)
