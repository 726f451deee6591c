"""Where codec v2's bytes go, against the information the benchmark counts:
``python -m wdiff.bench.sections A B [A B ...]``.

For each pair of checkpoint directories (the benchmark keeps the ones it
generates with ``--dir D --keep``: D/A and D/B-adam0.5, ...), every tensor
with a bucket function is cut into the 4 MiB chunks the benchmark's entropy
uses, and each chunk with a change is encoded as a CSPARSE record. The
table prints, in bits per changed element, what each part of the record
costs: the bucket table, the movers (changed words whose bucket differs
between the two sides, listed first over the whole chunk so that either
side can list the rest), the other positions, and the values; beside them
the order-0 information of positions and values given the base's bucket
(:func:`wdiff.codec.conditioned.conditional_entropy`, the benchmark's
"entropy given the base"), and the ratio of the record payloads, then of
payloads plus one record header each, to it.

It measures the codec, not pack: pack keeps per chunk the smallest of its
candidates (CSPARSE nearly always wins on a training step), and its bundle
also holds an index.
"""

from __future__ import annotations

import argparse
import sys

from ..codec import conditioned
from ..codec.chunk import CSPARSE, encode_as
from ..format import records as fmt
from .scenarios import changed_chunks

#: the chunk the benchmark's entropy is counted over (its yardstick: fixed,
#: whatever chunk a pack uses)
CHUNK = 4 << 20


def sections(a_dir: str, b_dir: str) -> dict:
    """Totals over the pair: changed elements, movers, records, and bits of
    each part and of the two entropies."""
    t = dict(changed=0, movers=0, records=0, table=0.0, mover_bits=0.0, positions=0.0, values=0.0,
             e_positions=0.0, e_values=0.0)
    for _, fn, a, b, k in changed_chunks(a_dir, b_dir, CHUNK, same_shape=True):
        if fn is None:
            continue
        enc = encode_as(CSPARSE, a, b, 1, bucket=fn)
        table, bits, values = enc.parts
        k_m, at = conditioned.read_varint(table, 0)
        r_m, at = conditioned.read_varint(table, at)
        unary_m, _ = conditioned.read_varint(table, at)
        movers = 8 * unary_m + k_m * r_m
        ep, ev = conditioned.conditional_entropy(fn, a, b)
        t["changed"] += k
        t["movers"] += k_m
        t["records"] += 1
        t["table"] += 8 * len(table)
        t["mover_bits"] += movers
        t["positions"] += 8 * len(bits) - movers
        t["values"] += 8 * len(values)
        t["e_positions"] += ep
        t["e_values"] += ev
    return t


def row(label: str, t: dict) -> str:
    k = t["changed"] or 1
    payload = t["table"] + t["mover_bits"] + t["positions"] + t["values"]
    entropy = t["e_positions"] + t["e_values"]
    headers = 8 * fmt.RECORD.size * t["records"]
    cells = [label, f"{t['changed']:,}", f"{100 * t['movers'] / k:.2f}%"]
    cells += [f"{t[c] / k:.3f}" for c in ("table", "mover_bits", "positions", "values", "e_positions", "e_values")]
    cells += [f"{payload / entropy:.4f}" if entropy else "-", f"{(payload + headers) / entropy:.4f}" if entropy else "-"]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| pair | changed | movers | table | movers' positions | other positions | values "
          "| entropy: positions | entropy: values | payloads / entropy | with record headers |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench.sections", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="A B", help="pairs of checkpoint directories, base then target")
    args = ap.parse_args(argv)
    if len(args.dirs) % 2:
        ap.error("give the directories in pairs: A B [A B ...]")
    print("bits per changed element, CSPARSE on every 4 MiB chunk with a change")
    print(HEADER)
    for a, b in zip(args.dirs[::2], args.dirs[1::2]):
        print(row(b, sections(a, b)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
