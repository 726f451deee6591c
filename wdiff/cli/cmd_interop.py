"""Commands that speak other systems' layouts: export (and pull's --layout,
in cmd_remotes.py, which renders its result here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import output as o
from .common import Json, Quiet, Remote, RequireSig, Threads, TrustedKeys, Verbose, _setup, app
from .help import epilog

LAYOUT_HELP = ("hf-delta: weight_vNNNNNN/ folders of zstd XOR or overwrite deltas, as slime writes "
               "them and SGLang's /pull_weights and NVIDIA ModelExpress read them.")


@app.command(epilog=epilog("export"))
def export(
    remote: Remote,
    output: Annotated[str, typer.Argument(metavar="OUT", help="Directory (created if missing) or object store (s3://BUCKET/PREFIX, ...) to write the versions into.", show_default=False)],
    layout: Annotated[str, typer.Option("--layout", metavar="LAYOUT", help=LAYOUT_HELP)] = "hf-delta",
    start: Annotated[Optional[str], typer.Option("--from", metavar="VERSION", help="The first version to write, into an empty OUT only [default: the anchor the head's history starts from].", show_default=False)] = None,
    to: Annotated[Optional[str], typer.Option("--to", metavar="VERSION", help="The last version to write: a fingerprint (or prefix), a label, or HEAD~N [default: the head].", show_default=False)] = None,
    work: Annotated[Optional[Path], typer.Option("--work", metavar="DIR", help="Where the two checkpoints each version is built from are pulled; kept for the next export [default: a temporary directory].", show_default=False)] = None,
    trusted_key: TrustedKeys = None,
    require_signature: RequireSig = False,
    token: Annotated[Optional[str], typer.Option("--token", metavar="TOKEN", help="Hugging Face token for a Hub remote [default: HF_TOKEN, or the stored login].", show_default=False)] = None,
    json_mode: Json = False,
    quiet: Quiet = False,
    verbose: Verbose = 0,
    threads: Threads = None,
) -> None:
    """Write a remote's versions in another system's layout.

    With --layout hf-delta, the versions of the chain's history, from its
    anchor (or --from) to the head (or --to), become OUT/weight_v000000/ (the
    first, full: a plain checkpoint directory), weight_v000001/, ... (each a
    delta against the one before, listing exactly the tensors that changed;
    written full where the layout cannot say what changed: tensors added,
    removed or reshaped, another config). Each version is built from
    checkpoints that wdiff's own pull verified, read back once written, and
    checked against the chain's digests before it becomes visible: in a
    directory it is renamed into place whole; in an object store a delta's
    index, then the ledger (.wdiff/export.json), goes up last. Run it again (from
    cron, after each push) and it adds the new versions and never rewrites
    one; an OUT whose last version is not on the chain's history is refused
    (status 5). Readers of the layout get no base digest, no signature and
    no positions past 4 GiB: see the hf-delta guide.
    """
    from ..interop.hfdelta.export import export as run_export

    out = _setup(json_mode, quiet, verbose)
    res = run_export(remote, output, layout=layout, start=start, to=to, work=work, trusted_keys=trusted_key,
                     require_signature=require_signature, token=token, threads=threads, reporter=out.reporter())
    if out.json:
        out.document(res.to_json())
        return
    for w in res.written:
        what = "full" if w.full else f"{w.encoding}, {w.tensors} tensor{'s' if w.tensors != 1 else ''}"
        out.result(f"wrote {w.name} ({w.fingerprint.hex()[:12]}): {what}, {o.size(w.bytes)}")
    n = res.before + len(res.written)
    if res.up_to_date:
        out.result(f"{o.name(res.output)} is up to date: {n} version{'s' if n != 1 else ''}, the last "
                   f"{res.head.hex()[:12] if res.head else '-'}")


def render_hfpull(out: o.Out, res) -> None:
    """The result of ``pull --layout hf-delta``."""
    if out.json:
        out.document(res.to_json())
        return
    if res.up_to_date:
        out.result(f"{o.name(res.directory)} is already at {o.name(res.after, 40)}")
        return
    start = f"from {o.name(res.seeded, 40)} (full)" if res.seeded else f"from {o.name(res.before or '-', 40)}"
    out.result(f"updated {o.name(res.directory)} to {o.name(res.after, 40)} ({res.fingerprint.hex()[:12]}) {start} "
               f"with {len(res.deltas)} delta{'s' if len(res.deltas) != 1 else ''}, {o.size(res.downloaded)} downloaded")
