"""Hostile inputs cannot make wdiff exhaust memory: the peak RSS of a real
wdiff process stays under 256 MiB while it refuses each of them."""

import json
import struct
import subprocess
import sys

import pytest
import xxhash
import zstandard
from kit.cli import ok

from wdiff.format import records as fmt

LIMIT = 256 * 1024 * 1024


# The process reports its own high-water mark (VmHWM, which starts afresh at
# exec): rusage's maxrss would include the pages a fork inherits from pytest.
MEASURED = (
    "import sys\n"
    "from wdiff.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
    "sys.stderr.write('\\nVmHWM ' + hwm + '\\n')\n"
    "sys.exit(code)\n"
)


def run_measured(*args) -> tuple[int, int, bytes]:
    """(exit code, peak RSS in bytes, stderr) of the wdiff command line."""
    p = subprocess.run([sys.executable, "-c", MEASURED, *map(str, args)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=300)
    err, _, hwm = p.stderr.rpartition(b"\nVmHWM ")
    return p.returncode, int(hwm.split()[0]) * 1024, err


def write_bundle(path, index_raw: bytes) -> None:
    packed = zstandard.ZstdCompressor(level=1).compress(index_raw)
    body = fmt.pack_preamble()
    footer = fmt.Footer(len(body), len(packed), len(index_raw), xxhash.xxh3_128_digest(packed)).pack()
    path.write_bytes(body + packed + footer)


@pytest.mark.parametrize("kind", ["list", "object", "strings"])
def test_huge_index_is_refused_in_bounded_memory(tmp_path, kind):
    n = 4_000_000
    if kind == "list":
        raw = b"[" + b"0," * n + b"0]"
    elif kind == "object":
        raw = b"{" + b",".join(b'"%d":0' % i for i in range(n // 4)) + b"}"
    else:
        raw = b"[" + b",".join([b'"' + b"x" * 12 + b'"'] * (n // 2)) + b"]"
    raw = raw[: fmt.MAX_INDEX_BYTES]
    write_bundle(tmp_path / "x.wdb", raw)
    code, rss, err = run_measured("info", tmp_path / "x.wdb")
    assert code == 4, err
    assert rss < LIMIT, rss


def test_index_bomb_is_refused_in_bounded_memory(tmp_path):
    # a frame whose content is far larger than the footer says
    big = zstandard.ZstdCompressor(level=19).compress(b"\0" * (fmt.MAX_INDEX_BYTES))
    body = fmt.pack_preamble()
    footer = fmt.Footer(len(body), len(big), 2, xxhash.xxh3_128_digest(big)).pack()
    (tmp_path / "y.wdb").write_bytes(body + big + footer)
    code, rss, err = run_measured("info", tmp_path / "y.wdb")
    assert code == 4 and rss < LIMIT, (code, rss, err)


def test_header_with_a_million_entries(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    entries = ",".join(f'"t{i}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}' for i in range(1_000_000))
    body = ("{" + entries + "}").encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body)
    code, rss, err = run_measured("diff", "--stat", d, d)
    assert code == 0, err  # handled as an opaque file, with a warning
    assert b"opaque" in err
    assert rss < LIMIT, rss


@pytest.mark.slow
def test_chain_with_a_million_entries(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    entry = {"bundle": "0" * 32, "version": "1" * 32, "parent": None, "created": "x", "label": None,
             "parts": [{"path": "objects/00/x.wdb", "size": 1, "digest": "2" * 32}], "size": 1}
    text = json.dumps({"format": "wdiff-chain", "version": 1, "head": "1" * 32, "entries": [entry] * 1_000_000})
    (remote / "chain.json").write_text(text)
    code, rss, err = run_measured("log", remote)
    assert code == 4, err
    assert rss < LIMIT, rss


@pytest.mark.slow
def test_a_record_over_the_largest_chunk_decodes_in_a_few_times_its_size(tmp_path):
    """A hostile bundle may cover up to 64 MiB of a tensor with one record:
    one MBITMAP record changing every word of a 64 MiB U8 tensor (an 83 KB
    bundle) applies correctly. Its positions were unpacked to a byte per
    word and then listed as int64 (9 bytes a word: 973 MB peak); listed as
    uint32 from the bitmap directly, the peak is the base, the output, the
    positions and the values of that one chunk (450 MB), whatever the
    number of records."""
    import numpy as np

    import specbundle as sb
    from factory import T, write_ckpt
    from wdiff.codec.chunk import MBITMAP, encode_as

    nb = 64 << 20
    old = np.random.default_rng(3).integers(0, 256, nb, dtype=np.uint8)
    new = old + np.uint8(1)
    A = write_ckpt(tmp_path / "A", {"x": T("U8", (nb,), old.tobytes())})
    B = write_ckpt(tmp_path / "B", {"x": T("U8", (nb,), new.tobytes())})
    ok("pack", "-q", A, B, "-o", tmp_path / "ab.wdb")
    b = sb.parse((tmp_path / "ab.wdb").read_bytes())
    enc = encode_as(MBITMAP, old, new, 3)
    cov = list(sb.scan(A).files[0].header.tensors)
    rec = sb.Rec(sb.CHUNK, MBITMAP, 1, enc.param, 0, 0, nb, enc.count, sb._chunk_digest(cov, 0, nb, old.tobytes()),
                 sb._chunk_digest(cov, 0, nb, new.tobytes()), [*enc.parts, b""])
    b.records = [x for x in b.records if x.type != sb.CHUNK] + [rec]
    (tmp_path / "x.wdb").write_bytes(sb.serialize(b, level=3))
    del old, new
    code, peak, err = run_measured("apply", "-q", tmp_path / "x.wdb", A, "-o", tmp_path / "out", "--threads", "1")
    assert code == 0, err
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (tmp_path / "B" / "model.safetensors").read_bytes()
    assert peak < 640 * 1024 * 1024, peak
