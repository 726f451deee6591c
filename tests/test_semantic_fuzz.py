"""A semantic fuzzer for bundles: hostile but well-formed bundles, every
digest recomputed, written by an implementation of the format spec
(tests/specbundle.py), not by wdiff's own writer.

Byte flips are caught by digests (tests/test_corruption.py). An attacker
who controls a bundle recomputes them all, and the target digests the final
check compares against are in the bundle too. So the invariant is:

    whatever a well-formed bundle says, ``wdiff apply`` either refuses it
    with a documented exit code (3, 4, 5, 9), OUT absent and nothing outside
    OUT changed (the base least of all, in copy mode), or exits 0 having
    written exactly the target the bundle's own index states: every path,
    and for each file the size, kind and digest the index gives. Never an
    unexpected error (the CLI's exit 2), a hang, a huge allocation, or a
    file outside OUT. With --in-place, a refused apply leaves the base
    byte-identical and no transaction behind.

Each case is also read by the reference reader (specbundle.read), and the
verdicts compared: the table that the run prints lists where wdiff is more
lenient or stricter than the spec.

``WDIFF_FUZZ_N`` (default 2000) sets the number of mutated bundles,
``WDIFF_FUZZ_SEED`` the seed, ``WDIFF_FUZZ_REPORT`` a JSON file for the
statistics. The default run takes about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

import fuzzlib as fz
import specbundle as sb
from kit.trees import snapshot
import wdiff

N = int(os.environ.get("WDIFF_FUZZ_N", "2000"))
SEED = os.environ.get("WDIFF_FUZZ_SEED", "1")
INPLACE_EVERY = 10  # one refused case in ten, and every accepted one, is also applied --in-place
CLI_EVERY = 100  # one in a hundred also through the command line, and odd ones
CLI_MAX = 60
SLOW_S = 5.0
HUGE_RSS_MB = 1024


#: man/wdiff-format.5, EXAMPLES: the anchor of an empty checkpoint
EMPTY_ANCHOR = """
89 57 44 49 46 46 0d 0a 01 00 00 00 00 00 00 00 28 b5 2f fd 20 f0 c5 05 00 e2 4d 2a 19 60 cf 03
3c ed 88 9c 59 08 83 61 7b c0 25 09 4b 83 02 13 3b 50 90 41 20 56 99 3b 61 10 1c 90 7f df 5c 79
1b a2 e3 e8 ea fc d4 24 1e 51 ff b0 d3 1a c9 43 6a 14 f6 3d 4a b8 59 a1 34 ea 2c 3c fa c6 37 4b
f9 1b 7c ad b7 45 89 ae ff b9 d6 b1 e8 fb 9b 2c b7 b7 cc ed 91 bc 8a c0 f7 88 82 0e ce 41 a4 22
c9 f1 06 57 54 e8 a4 4c 12 8f be f5 37 b7 6e 3c 45 d4 9b 8b ae 7f 5b d3 b1 e8 ba e6 88 7e f6 e6
ff 54 3c cd c0 da 5b 2b 8f be 25 94 23 eb 0d 1e 06 f2 dc 10 fd af ab 19 87 46 cf f4 f6 3c 13 8e
fe 5a 4e c7 02 03 00 74 46 e1 55 c2 45 d5 b6 9c 01 10 00 00 00 00 00 00 00 c1 00 00 00 00 00 00
00 f0 00 00 00 00 00 00 00 92 e7 0c 9e 45 ee 30 61 38 00 c8 2c 12 d4 84 19 57 44 49 46 46 45 4e
44
"""


def _fast_tmp(tmp_path_factory) -> str:
    """A directory on tmpfs when there is one: wdiff fsyncs every file and
    directory it writes, and thousands of applies on a disk spend most of
    their time waiting for it."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return tempfile.mkdtemp(prefix="wdiff-semfuzz-", dir=shm)
    return str(tmp_path_factory.mktemp("semfuzz"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = _fast_tmp(tmp_path_factory)
    saved = os.environ.get("WDIFF_CACHE_DIR")
    os.environ["WDIFF_CACHE_DIR"] = os.path.join(root, "cache")
    try:
        scenarios = fz.make_scenarios(os.path.join(root, "ckpts"))
        work = os.path.join(root, "work")
        os.makedirs(work)
        yield root, work, scenarios
    finally:
        if saved is None:
            os.environ.pop("WDIFF_CACHE_DIR", None)
        else:
            os.environ["WDIFF_CACHE_DIR"] = saved
        shutil.rmtree(root, ignore_errors=True)


# -- the reader and writer against the spec's own examples and wdiff's bundles -----------------


def test_spec_vectors():
    assert sb.H(b"").hex() == "99aa06d3014798d86001c324468d497f"
    assert sb.H(b"abc").hex() == "06b05ab6733a618578af5f94892f3950"
    assert sb.D(b"abc").hex() == "f758394eebabb2bb51ee911f78f31836"
    assert sb.D(bytes(range(256)) * 8192).hex() == "36d47623c39055cedc199c72e909504e"
    assert sb.fingerprint([]).hex() == "3bd5a6db02c44f35c6e95fbf7ed242bf"
    assert sb.fingerprint([("config.json", "file", 3, sb.D(b"abc"))]).hex() == "d1ed894932fd223010454fb66bff65ce"
    text = b'{"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}'
    st = len(text).to_bytes(8, "little") + text + b"abc"
    f = sb.file_info("m.safetensors", st)
    assert (f.kind, f.header.size, sb.H(f.header_bytes).hex(), f.digest.hex()) == (
        "safetensors", 61, "c1d2c5865018981a6e87331f1f093128", "c0f98206be40cef6d2ec4ecccd3c6eb2")
    ck = sb.Checkpoint([f])
    assert ck.fingerprint.hex() == "eef5f96397c08fcc07b0356508d59d5d"
    b = sb.pack(None, ck, random.Random(0))
    assert [r.computed_digest().hex() for r in b.records] == ["fc3aeea478bc997987f482d7a9a6b29e",
                                                              "7c478d36a4548d5dfe92e6f5e65d36ee"]
    assert b.records[1].sections[0].hex() == "28b52ffd2003190000616263"
    assert sb.chain_digest(b.records).hex() == "4adce8dbc10a28f1af0ee2770c3b4f96"
    assert sum(len(r.to_bytes()) for r in b.records) == 306
    # the empty anchor, byte for byte
    empty = bytes.fromhex(EMPTY_ANCHOR)
    assert len(empty) == 257
    assert sb.read(empty, None) == {}
    assert sb.serialize(sb.parse(empty)) == empty


def test_wdiff_bundles_round_trip(world):
    """Parsing a bundle wdiff wrote and writing it back gives the same bytes:
    the reader and writer here agree with wdiff on every field."""
    _, _, scenarios = world
    for sc in scenarios:
        label, data = sc.bundles[0]
        assert sb.serialize(sb.parse(data)) == data, sc.name
        assert sb.read(data, sc.base) == {f.path: f.data for f in sc.target.files}, sc.name


def test_wdiff_applies_spec_written_bundles(world, tmp_path):
    """Bundles from the spec's writer, with choices wdiff never makes (any
    codec, Rice parameters 0..40, chunks of several tensors, block-aligned
    pieces, sources "bundle" where "base" would do): wdiff must apply them."""
    _, _, scenarios = world
    k = 0
    for sc in scenarios:
        for seed in range(6 if sc.name != "big" else 2):
            spec = sb.pack(sc.base, sc.target, random.Random(1000 + seed), level=3)
            data = sb.serialize(spec, level=3)
            p = tmp_path / f"s{k}.wdb"
            p.write_bytes(data)
            out = tmp_path / f"o{k}"
            wdiff.apply(p, sc.base_dir, out)
            assert fz.check_output(str(out), spec.index) == [], (sc.name, seed)
            k += 1


# -- the fuzzer ------------------------------------------------------------------------------------


def loose_index(data: bytes):
    """The index of a bundle, for checking what was written, without the
    spec reader's checks (None when it cannot be read at all)."""
    try:
        ioff, ilen, iraw = sb.FOOTER.unpack_from(data, len(data) - 48)[:3]
        import zstandard

        raw = zstandard.ZstdDecompressor().decompressobj().decompress(data[ioff:ioff + ilen])
        return json.loads(raw)
    except Exception:  # noqa: BLE001
        return None


def _short(reason: str) -> str:
    return reason.split(":")[0][:60]


def one_case(i: int, sc, work: str, root: str, stats: fz.Stats, *, seed: str, inplace: bool, keep: list,
             kinds=None):
    rng = random.Random(f"{seed}:{i}")
    kind, data, label = fz.mutate(sc, rng, kinds=kinds)
    first = kind.split("+")[0]
    stats.n += 1
    for k in kind.split("+"):
        stats.kinds[k] += 1
    bpath = os.path.join(work, "b.wdb")
    with open(bpath, "wb") as f:
        f.write(data)
    out = os.path.join(work, "out")
    skip = {out, bpath, os.path.join(work, "ip"), os.path.join(work, "cli"), os.path.join(root, "cache")}
    before = fz.stat_tree(root, skip)
    evil = os.path.exists("/tmp/evil.json")
    oc = fz.run_apply(bpath, sc.base_dir, out)
    stats.outcomes[oc.status] += 1
    stats.by_kind.setdefault(first, fz.Counter())[oc.status] += 1
    stats.max_rss_growth_mb = max(stats.max_rss_growth_mb, oc.rss_growth_mb)
    index = loose_index(data)
    case = {"i": i, "scenario": sc.name, "bundle": label, "kind": kind, "status": oc.status, "error": oc.error[:300],
            "seconds": round(oc.seconds, 3)}
    stats.examples.setdefault(f"{first} -> {oc.status}", case)
    problems = []
    exposed = False
    if oc.status == 0:
        problems = fz.check_output(out, index) if index is not None else ["index unreadable"]
    else:
        exposed = os.path.lexists(out)
        if exposed:
            problems.append("refused, but OUT exists")
    if fz.stat_tree(root, skip) != before:
        problems.append("something outside OUT changed")
    if not evil and os.path.exists("/tmp/evil.json"):
        problems.append("/tmp/evil.json written")
        os.unlink("/tmp/evil.json")
    spec_status, spec_res = fz.spec_verdict(data, sc.base, sc.anchor)
    if oc.status == 0 and spec_status != 0:
        stats.lenient[f"{first}: {_short(spec_res)}"] += 1
        stats.lenient_examples.setdefault(f"{first}: {_short(spec_res)}", case)
    elif oc.status in fz.DOCUMENTED and spec_status == 0:
        stats.strict[f"{first}: {_short(oc.error)}"] += 1
        stats.strict_examples.setdefault(f"{first}: {_short(oc.error)}", case)
    elif oc.status in fz.DOCUMENTED and spec_status != oc.status:
        stats.code_mismatch[f"{oc.status}/{spec_status}"] += 1
        stats.examples.setdefault(f"{first} -> {oc.status}, spec {spec_status}", dict(case, spec=spec_res[:200]))
    if oc.status == 0 and spec_status == 0 and not problems:
        got = {p: open(os.path.join(out, p), "rb").read() for p in spec_res}
        if got != spec_res:
            problems.append("OUT differs from the spec reader's result")
    if oc.status == "crash" and fz.known_crash(oc.error):
        stats.known[fz.known_crash(oc.error)] += 1
        stats.known_examples.setdefault(fz.known_crash(oc.error), case)
    elif oc.status in ("crash",) or oc.status == "hang":
        case["problems"] = problems
        stats.crashes.append(case)
    elif oc.status == 2:
        # the one usage error a bundle may cause here: an anchor turned delta,
        # applied (as the anchor it was) without a base
        stats.usage.append(case)
        if not (sc.anchor and "needs its base checkpoint" in oc.error):
            stats.crashes.append(case)
    elif oc.status not in fz.DOCUMENTED and oc.status != 0:
        stats.crashes.append(case)
    if oc.seconds > SLOW_S or oc.rss_growth_mb > HUGE_RSS_MB:
        stats.slow.append(case)
    if problems:
        bug = fz.known_bug("copy", index, oc, problems, exposed, out)
        case["problems"] = problems
        if bug:
            stats.known[bug] += 1
            stats.known_examples.setdefault(bug, case)
        else:
            stats.wrong.append(case)
    # through the command line too: the first case of each (kind, outcome),
    # every odd one, and one in CLI_EVERY
    sig = (first, oc.status)
    odd = problems or oc.status not in (0, 3, 4, 5, 9) or (oc.status != 0 and spec_status == 0)
    if len(keep) < CLI_MAX and (sig not in {k[4] for k in keep} or odd or i % CLI_EVERY == 0):
        keep.append((i, sc, data, oc.status, sig))
    shutil.rmtree(out, ignore_errors=True)
    # in place: every bundle copy mode accepted, and one in INPLACE_EVERY others
    if (inplace or oc.status == 0) and not sc.anchor:
        ip_status = inplace_case(i, sc, work, data, index, stats, kind)
        if oc.status == 0 and ip_status != 0:
            stats.code_mismatch[f"copy 0 / in-place {ip_status}"] += 1
            stats.examples.setdefault(f"{first}: copy 0, in-place {ip_status}", case)


def inplace_case(i, sc, work, data, index, stats, kind=""):
    ip = os.path.join(work, "ip")
    shutil.rmtree(ip, ignore_errors=True)
    shutil.copytree(sc.base_dir, ip)
    before = snapshot(ip, content="bytes")
    bpath = os.path.join(work, "b.wdb")
    oc = fz.run_apply(bpath, ip, None, in_place=True)
    stats.inplace[oc.status] += 1
    case = {"i": i, "scenario": sc.name, "kind": kind, "mode": "inplace", "status": oc.status, "error": oc.error[:300]}
    problems = []
    after = {p: v for p, v in snapshot(ip, content="bytes").items() if not (p == ".wdiff" or p.startswith(".wdiff/"))}
    if oc.status == 0:
        problems = fz.check_output(ip, index) if index is not None else ["index unreadable"]
    else:
        if after != before:
            problems.append("refused, but the checkpoint changed")
        if os.path.exists(os.path.join(ip, ".wdiff", "txn")):
            problems.append("refused, but a transaction was left behind")
    if oc.status == "crash" and fz.known_crash(oc.error):
        stats.known[fz.known_crash(oc.error)] += 1
    elif oc.status == "crash" or oc.status == "hang" or (oc.status not in fz.DOCUMENTED and oc.status not in (0, 2)):
        stats.crashes.append(case)
    if problems:
        case["problems"] = problems
        bug = fz.known_bug("inplace", index, oc, problems, False)
        if bug:
            stats.known[bug] += 1
            stats.known_examples.setdefault(bug, case)
        else:
            stats.wrong.append(case)
    shutil.rmtree(ip, ignore_errors=True)
    return oc.status


def cli_check(world_root, keep, stats):
    """The command line gives the same exit codes, never exit 2 with
    'unexpected error', and `wdiff info` never crashes either."""
    d = os.path.join(world_root, "work", "cli")
    os.makedirs(d, exist_ok=True)

    def run(item):
        i, sc, data, status, _ = item
        b = os.path.join(d, f"{i}.wdb")
        with open(b, "wb") as f:
            f.write(data)
        out = os.path.join(d, f"out{i}")
        args = [fz.WDIFF, "apply", b] + ([sc.base_dir] if sc.base_dir else []) + ["-o", out]
        env = dict(os.environ, WDIFF_THREADS="2")
        a = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        n = subprocess.run([fz.WDIFF, "info", b], capture_output=True, text=True, timeout=120, env=env)
        shutil.rmtree(out, ignore_errors=True)
        return i, sc.name, status, a.returncode, a.stderr.strip()[-300:], n.returncode, n.stderr.strip()[-300:]

    with ThreadPoolExecutor(2) as ex:
        for i, name, status, arc, aerr, irc, ierr in ex.map(run, keep):
            expect = 2 if status == "crash" else status
            row = {"i": i, "scenario": name, "in_process": status, "apply_rc": arc, "info_rc": irc,
                   "apply_err": aerr, "info_err": ierr}
            stats.cli.append(row)
            known = fz.known_crash(aerr) if status == "crash" else None
            if known and arc == 2 and irc in (0, 3, 4) and "unexpected error" not in ierr:
                row["known"] = known
            elif arc != expect or "unexpected error" in aerr or irc not in (0, 3, 4) or "unexpected error" in ierr:
                row["bad"] = True


def fuzz(world, n: int, seed: str, *, only=None, kinds=None, cli_max: int = CLI_MAX, cover: bool = False) -> fz.Stats:
    """n mutated cases; with ``cover``, the first len(kinds) of them one of
    each kind (so that every kind runs, whatever the draw)."""
    import time

    root, work, scenarios = world
    if only:
        scenarios = [sc for sc in scenarios if sc.name in only]
    stats = fz.Stats()
    weights = [sc.weight for sc in scenarios]
    pick = random.Random(f"{seed}:scenarios")
    keep: list = []
    t0 = time.perf_counter()
    # a huge allocation becomes a MemoryError (reported as a crash), not the
    # OOM killer: at most 8 GiB more address space than the process has now
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
    if vm:
        resource.setrlimit(resource.RLIMIT_AS, (vm + (8 << 30), hard))
    try:
        for i in range(n):
            sc = pick.choices(scenarios, weights)[0]
            ks = [kinds[i]] if cover and kinds and i < len(kinds) else kinds
            one_case(i, sc, work, root, stats, seed=seed, inplace=i % INPLACE_EVERY == 0, keep=keep, kinds=ks)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    cli_check(root, keep[:cli_max], stats)
    stats.seconds = time.perf_counter() - t0
    report = os.environ.get("WDIFF_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({
                "n": stats.n, "seconds": stats.seconds, "kinds": stats.kinds, "outcomes": {str(k): v for k, v in stats.outcomes.items()},
                "inplace": {str(k): v for k, v in stats.inplace.items()},
                "by_kind": {k: {str(s): c for s, c in v.items()} for k, v in stats.by_kind.items()},
                "wrong": stats.wrong, "crashes": stats.crashes, "usage": stats.usage[:50], "slow": stats.slow,
                "known": stats.known, "known_examples": stats.known_examples,
                "lenient": stats.lenient, "strict": stats.strict, "lenient_examples": stats.lenient_examples,
                "strict_examples": stats.strict_examples, "code_mismatch": stats.code_mismatch, "cli": stats.cli,
                "max_rss_growth_mb": stats.max_rss_growth_mb, "examples": stats.examples,
            }, f, indent=1, default=str)
    return stats


@pytest.mark.slow
def test_semantic_fuzz(world):
    stats = fuzz(world, N, SEED)
    print("\n" + stats.table())
    assert stats.n >= min(N, 2000)
    assert not stats.wrong, json.dumps(stats.wrong[:5], indent=1, default=str)
    assert not stats.crashes, json.dumps(stats.crashes[:5], indent=1, default=str)
    assert not [c for c in stats.cli if c.get("bad")], json.dumps([c for c in stats.cli if c.get("bad")][:5], indent=1)
    assert not [c for c in stats.slow if c["seconds"] > 30], stats.slow


#: the mutations of format version 3 (codec v2, DELTA records)
V3_KINDS = [k for k in fz.MUTATIONS if k.startswith(("v3.", "delta."))]


@pytest.mark.slow
def test_semantic_fuzz_v3(world):
    """The version 3 mutations only, on the version 3 scenario, so that each
    of them runs in every suite run (the run above spreads them thin)."""
    stats = fuzz(world, max(150, N // 10), SEED + ":v3", only={"v3"}, kinds=V3_KINDS, cli_max=12, cover=True)
    print("\n" + stats.table())
    assert not stats.wrong, json.dumps(stats.wrong[:5], indent=1, default=str)
    assert not stats.crashes, json.dumps(stats.crashes[:5], indent=1, default=str)
    assert not [c for c in stats.cli if c.get("bad")], json.dumps([c for c in stats.cli if c.get("bad")][:5], indent=1)
    for k in V3_KINDS:
        assert stats.kinds[k] > 0, k
    # value sections and RSPARSE's row lists leave a reader no latitude:
    # wdiff and the spec agree
    split = [k for k in list(stats.lenient) + list(stats.strict)
             if k.startswith(("v3.value_section:", "v3.dense_values:", "v3.rows:"))]
    assert not split, (split, stats.lenient_examples, stats.strict_examples)
    # valid re-encodings and restatements are accepted, and give the bytes the
    # spec reader gives (one_case compares them)
    assert sum(c.get(0, 0) for k, c in stats.by_kind.items()) > 0


@pytest.mark.slow
def test_value_section_refusals_and_agreement(world, tmp_path):
    """Codec v2's range-coded value section: each variant of the
    v3.value_section mutation, on records of every codec that has one
    (MSPARSE, MBITMAP, CSPARSE, RSPARSE), makes the spec reader refuse for the reason
    it is about (shorter than 5 bytes, first byte not 0, reading past the
    end, bytes left unread, code >= range) or accept the valid ones; and
    wdiff gives the same verdict: the same status, or both accept with the
    same bytes."""
    _, _, scenarios = world
    sc = next(s for s in scenarios if s.name == "v3")
    seen = set()
    k = 0
    for variant, (_, why) in fz.VALUE_VARIANTS.items():
        for label, data in sc.bundles:
            ctx = fz.Ctx(sc, sb.parse(data), random.Random(f"{variant}:{label}"))
            try:
                fz.m_v3_values(ctx, variant)
            except fz.Skip:
                continue
            r = next(r for r, o in zip(ctx.b.records, sb.parse(data).records) if r.sections != o.sections)
            seen.add((variant, r.codec))
            bad = sb.serialize(ctx.b)
            status, res = fz.spec_verdict(bad, sc.base, False)
            if why == "valid":
                assert status == 0, (variant, label, res)
            elif why != "either":
                assert status == 4, (variant, label)
                assert why in res or (variant == 2 and "shorter than 5 bytes" in res), (variant, res)
            p = tmp_path / f"{k}.wdb"
            p.write_bytes(bad)
            out = tmp_path / f"out{k}"
            k += 1
            oc = fz.run_apply(str(p), sc.base_dir, str(out))
            assert oc.status == status, (variant, label, r.codec, oc.error, res if status else "")
            if status == 0:
                assert {q: (out / q).read_bytes() for q in res} == res
                assert fz.check_output(str(out), ctx.b.index) == []
            else:
                assert not out.exists()
    assert {v for v, _ in seen} == set(fz.VALUE_VARIANTS), seen
    assert {c for _, c in seen} == {sb.MSPARSE, sb.MBITMAP, sb.CSPARSE, sb.RSPARSE}, seen


def _agree(sc, bad: bytes, tmp_path, k: int, what) -> tuple[int, object]:
    """The spec reader's verdict on ``bad``, and wdiff's the same: the same
    status, or both accept with the same bytes and the stated target."""
    status, res = fz.spec_verdict(bad, sc.base, False)
    p = tmp_path / f"{k}.wdb"
    p.write_bytes(bad)
    out = tmp_path / f"out{k}"
    oc = fz.run_apply(str(p), sc.base_dir, str(out))
    assert oc.status == status, (what, oc.error, res if status else "")
    if status == 0:
        assert {q: (out / q).read_bytes() for q in res} == res, what
    else:
        assert not out.exists(), what
    return status, res


@pytest.mark.slow
def test_rsparse_row_list_refusals_and_agreement(world, tmp_path):
    """RSPARSE's row list: each variant of the v3.rows mutation (R = 0 or
    above n, o >= R, k_r = 0 or above N_r, a row listed without a change,
    u_r off by one, a byte more or less after the remainder stream, padding
    bits set, r_r above 40, a changed row left out, a non-minimal varint, a
    row at N_r, streams past section 0, and valid restatements) makes the
    spec reader refuse for the rule it is about, or accept the valid ones;
    wdiff gives the same verdict. Then RSPARSE's CSPARSE part: its table,
    movers and value section broken as CSPARSE's are, the same verdicts."""
    _, _, scenarios = world
    sc = next(s for s in scenarios if s.name == "v3")
    rs = [(label, data) for label, data in sc.bundles
          if any(r.type == sb.CHUNK and r.codec == sb.RSPARSE for r in sb.parse(data).records)]
    assert rs and rs[0][0] == "wdiff", [label for label, _ in rs]  # wdiff itself writes RSPARSE there
    seen, k = set(), 0
    for variant, (_, why) in fz.ROW_VARIANTS.items():
        for label, data in rs:
            ctx = fz.Ctx(sc, sb.parse(data), random.Random(f"{variant}:{label}"))
            try:
                fz.m_v3_rows(ctx, variant)
            except fz.Skip:
                continue
            seen.add(variant)
            status, res = _agree(sc, sb.serialize(ctx.b), tmp_path, k, (variant, label))
            k += 1
            if why == "valid":
                assert status == 0, (variant, label, res)
            elif why != "either":
                assert status == 4, (variant, label)
                assert why == "refused" or why in res, (variant, res)
    assert seen == set(fz.ROW_VARIANTS), set(fz.ROW_VARIANTS) - seen
    statuses = set()
    for name, mut in (("table", fz.m_v3_table), ("movers", fz.m_v3_movers)):
        for seed in range(8):
            label, data = rs[seed % len(rs)]
            ctx = fz.Ctx(sc, sb.parse(data), random.Random(f"{name}:{seed}"))
            try:
                mut(ctx, codec=sb.RSPARSE)
            except fz.Skip:
                continue
            statuses.add(_agree(sc, sb.serialize(ctx.b), tmp_path, k, (name, seed, label))[0])
            k += 1
    for variant in fz.VALUE_VARIANTS:
        label, data = rs[variant % len(rs)]
        ctx = fz.Ctx(sc, sb.parse(data), random.Random(f"values:{variant}"))
        try:
            fz.m_v3_values(ctx, variant, codec=sb.RSPARSE)
        except fz.Skip:
            continue
        statuses.add(_agree(sc, sb.serialize(ctx.b), tmp_path, k, ("values", variant, label))[0])
        k += 1
    assert statuses == {0, 4}, statuses


@pytest.mark.parametrize("codec", [sb.CSPARSE, sb.RSPARSE])
@pytest.mark.parametrize("native", [True, False])
def test_csparse_entry_count_past_the_chunk_is_refused(world, tmp_path, native, codec):
    """Found by test_semantic_fuzz_v3 (v3.csparse_table, case 62): the first
    complemented entry of a CSPARSE table claims c = 2^20 unchanged words,
    more than the chunk holds; every reader must refuse it (4). The same in
    RSPARSE's CSPARSE part, past its subchunk."""
    from wdiff.codec import kernels

    ctx = _ctx(world, "v3")
    for r in ctx.b.records:
        if r.type != sb.CHUNK or r.codec != codec:
            continue
        rows, _ = fz._row_prefix(r, (r.hi - r.lo) // r.word)
        mv, ents, u, rest = fz._table(bytes(r.sections[0])[len(rows):])
        comp = [e for e in ents if e[2] & 1]
        if comp:
            break
    else:
        pytest.fail(f"no codec {codec} record with a complemented entry in the v3 bundle")
    comp[0][1] += 1 << 20
    r.sections[0] = rows + (b"".join(sb.varint(x) for x in mv) + sb.varint(len(ents))
                     + b"".join(sb.varint(a) + sb.varint(b) + sb.varint(m) for a, b, m in ents) + sb.varint(u) + rest)
    r.lens = None
    data = sb.serialize(ctx.b)
    status, why = fz.spec_verdict(data, ctx.sc.base, False)
    assert status == 4, why
    (tmp_path / "b.wdb").write_bytes(data)
    was = kernels.set_native(native)
    try:
        with pytest.raises(wdiff.WdiffError) as e:
            wdiff.apply(tmp_path / "b.wdb", ctx.sc.base_dir, tmp_path / "out")
    finally:
        kernels.set_native(was)
    assert e.value.exit_code == 4 and not (tmp_path / "out").exists()


# -- valid bundles in place ----------------------------------------------------------------------


def test_inplace_applies_valid_bundles(world, tmp_path):
    """Every unmutated bundle (wdiff's and the spec writer's) applied in
    place gives exactly the target, including a file that becomes a
    directory and a directory that becomes a file."""
    _, _, scenarios = world
    for sc in scenarios:
        if sc.anchor:
            continue
        for label, data in sc.bundles:
            ip = tmp_path / f"{sc.name}-{label}"
            shutil.copytree(sc.base_dir, ip)
            b = tmp_path / f"{sc.name}-{label}.wdb"
            b.write_bytes(data)
            wdiff.apply(b, ip, in_place=True)
            assert fz.check_output(str(ip), sb.parse(data).index) == [], (sc.name, label)


# -- the bugs this fuzzer found, one test each -------------------------------------------------------


def _ctx(world, name, label="wdiff"):
    _, _, scenarios = world
    sc = next(s for s in scenarios if s.name == name)
    data = dict(sc.bundles)[label]
    return fz.Ctx(sc, sb.parse(data), random.Random(0))


def _index_of(ctx, path):
    return next(j for j, f in enumerate(ctx.files) if f["path"] == path)


def test_inplace_checks_companion_files_from_the_base(world, tmp_path):
    """config.json changed between base and target; the hostile bundle says
    its source is "base" (and drops its FILE record) while keeping the
    target's digest. Both modes must refuse (4) or write what the index
    states; in place, wdiff once exited 0 and left the base's config.json
    (a regression test: decode_index now refuses such an index)."""
    ctx = _ctx(world, "sparse")
    j = _index_of(ctx, "config.json")
    ctx.files[j]["source"] = "base"
    ctx.b.records = [r for r in ctx.b.records if not (r.type == sb.FILE and r.file == j)]
    data = sb.serialize(ctx.b)
    bundle = tmp_path / "b.wdb"
    bundle.write_bytes(data)
    with pytest.raises(wdiff.WdiffError) as e:  # copy mode is right
        wdiff.apply(bundle, ctx.sc.base_dir, tmp_path / "out")
    assert e.value.exit_code == 4 and not (tmp_path / "out").exists()
    ip = tmp_path / "ip"
    shutil.copytree(ctx.sc.base_dir, ip)
    before = snapshot(ip, content="bytes")
    try:
        wdiff.apply(bundle, ip, in_place=True)
    except wdiff.WdiffError as e:
        assert e.exit_code == 4
        assert {p: v for p, v in snapshot(ip, content="bytes").items() if not p.startswith(".wdiff")} == before
    else:
        assert fz.check_output(str(ip), ctx.b.index) == []


@pytest.mark.parametrize("delta", [1, -1, 1 << 20])
def test_companion_file_size_is_checked(world, tmp_path, delta):
    """The shard index is unchanged (source "base"); the bundle states
    another size for it (fingerprint recomputed). wdiff once exited 0 and
    wrote the 240-byte file, so OUT's fingerprint was not target.fingerprint
    (a regression test)."""
    ctx = _ctx(world, "dense")
    j = _index_of(ctx, "model.safetensors.index.json")
    assert ctx.files[j]["source"] == "base"
    ctx.files[j]["size"] += delta
    bundle = tmp_path / "b.wdb"
    bundle.write_bytes(sb.serialize(ctx.b))
    out = tmp_path / "out"
    try:
        wdiff.apply(bundle, ctx.sc.base_dir, out)
    except wdiff.WdiffError as e:
        assert e.exit_code == 4 and not out.exists()
    else:
        assert fz.check_output(str(out), ctx.b.index) == []


def _kind_confusion(world, tmp_path, tensor_name):
    """tokenizer.json becomes tokenizer.safetensors, kind "file", carried by
    a FILE record whose bytes are a strict tensor file."""
    ctx = _ctx(world, "sparse")
    j = _index_of(ctx, "tokenizer.json")
    ctx.set_file(j, sb.write_st([(tensor_name, "U8", (4,), b"abcd")]))
    ctx.rename(j, "tokenizer.safetensors")
    bundle = tmp_path / "b.wdb"
    bundle.write_bytes(sb.serialize(ctx.b))
    return ctx, bundle


def test_companion_kind_matches_its_bytes(world, tmp_path):
    ctx, bundle = _kind_confusion(world, tmp_path, "kc_unique")
    out = tmp_path / "out"
    try:
        wdiff.apply(bundle, ctx.sc.base_dir, out)
    except wdiff.WdiffError as e:
        assert e.exit_code == 4 and not out.exists()
    else:
        assert fz.check_output(str(out), ctx.b.index) == []


@pytest.mark.parametrize("how", ["duplicate-tensor-name", "deep-path"])
def test_refusal_leaves_no_output(world, tmp_path, how):
    out = tmp_path / "out"
    if how == "duplicate-tensor-name":
        # a companion *.safetensors whose bytes hold a tensor named like one
        # of model.safetensors: OUT is no valid checkpoint
        ctx, bundle = _kind_confusion(world, tmp_path, "w0")
    else:
        # a companion file 40 directories down: valid by the path rules,
        # deeper than the 32 levels wdiff accepts in a checkpoint
        ctx = _ctx(world, "sparse")
        ctx.rename(_index_of(ctx, "tokenizer.json"), "/".join(["d"] * 40) + "/tokenizer.json")
        ctx.files[_index_of(ctx, "/".join(["d"] * 40) + "/tokenizer.json")]["source"] = "bundle"
        ctx.set_file(_index_of(ctx, "/".join(["d"] * 40) + "/tokenizer.json"), b'{"vocab": {}}')
        bundle = tmp_path / "b.wdb"
        bundle.write_bytes(sb.serialize(ctx.b))
    try:
        wdiff.apply(bundle, ctx.sc.base_dir, out)
    except wdiff.WdiffError:
        assert not out.exists(), sorted(os.listdir(out))
    else:
        assert fz.check_output(str(out), ctx.b.index) == []


def test_uncovered_tensor_is_refused_before_allocation(world, tmp_path):
    """A tensor of 2^50 bytes with no base source and no record: the spec
    says refuse (every byte of such a tensor must be covered)."""
    ctx = _ctx(world, "anchor")
    j = _index_of(ctx, "a.safetensors")
    obj, hb = ctx.header_json(j)
    end = max(v["data_offsets"][1] for k, v in obj.items() if k != "__metadata__")
    extra = 1 << 50
    obj["zz_huge"] = {"dtype": "U8", "shape": [extra], "data_offsets": [end, end + extra]}
    ctx.files[j]["size"] += extra
    ctx.set_header(j, fz.Ctx.st_header(obj), tensors_from_region=False)
    ctx.files[j]["tensors"].append(sb.H(b"").hex())  # any digest: nothing may reach it
    bundle = tmp_path / "b.wdb"
    bundle.write_bytes(sb.serialize(ctx.b))
    assert fz.spec_verdict(bundle.read_bytes(), None, True)[0] == 4
    with pytest.raises(wdiff.WdiffError) as e:
        wdiff.apply(bundle, None, tmp_path / "out")
    assert e.value.exit_code == 4, str(e.value)  # was 9: "File too large" / "No space left on device"


def test_manifest_cache_is_not_listed_per_file(world, tmp_path, monkeypatch):
    ctx = _ctx(world, "anchor")
    j = len(ctx.files)
    for k in range(1000):
        ctx.files.append({"path": f"zzz/f{k:05d}", "kind": "file", "size": 0, "digest": sb.D(b"").hex(),
                          "source": "bundle"})
        ctx.b.records.append(sb.Rec(sb.FILE, sb.ZSTD, 1, 0, j + k, 0, 0, 0, sb.ZERO, sb.D(b""), [sb.Z(b""), b"", b""]))
    bundle = tmp_path / "b.wdb"
    bundle.write_bytes(sb.serialize(ctx.b))
    cache = os.environ["WDIFF_CACHE_DIR"]
    calls = []
    real = os.listdir

    def listdir(p="."):
        # a folder listed by its descriptor counts as well
        where = os.readlink(f"/proc/self/fd/{p}") if isinstance(p, int) else os.fspath(p)
        if os.path.abspath(where) == os.path.abspath(cache):
            calls.append(p)
        return real(p)

    monkeypatch.setattr(os, "listdir", listdir)
    wdiff.apply(bundle, None, tmp_path / "out")
    monkeypatch.undo()
    assert fz.check_output(str(tmp_path / "out"), ctx.b.index) == []
    assert len(calls) <= 10, f"the cache directory was listed {len(calls)} times for {len(ctx.files)} files"


@pytest.mark.parametrize("in_place", [False, True])
def test_false_base_digest_on_the_right_base_is_an_integrity_error(world, tmp_path, in_place):
    """A CHUNK record whose base digest is false, applied to the bundle's
    own base (its fingerprint is base.fingerprint): the bundle is
    inconsistent (4), not made for another base (5, which wdiff once gave)."""
    ctx = _ctx(world, "sparse")
    rec = next(r for r in ctx.b.records if r.type == sb.CHUNK and r.base != sb.ZERO)
    rec.base = bytes(b ^ 0xFF for b in rec.base)
    bundle = tmp_path / "b.wdb"
    bundle.write_bytes(sb.serialize(ctx.b))
    base = ctx.sc.base_dir
    if in_place:
        base = tmp_path / "ip"
        shutil.copytree(ctx.sc.base_dir, base)
    with pytest.raises(wdiff.WdiffError) as e:
        wdiff.apply(bundle, base, None if in_place else tmp_path / "out", in_place=in_place)
    assert e.value.exit_code == 4, str(e.value)
    assert not (tmp_path / "out").exists()
