"""Helpers for the threat-model tests: the real command line in a
subprocess, with per-user state kept inside the test's temporary directory,
resource limits and per-process measurements, the journal of an in-place
apply (planted, or left by a real one killed), and the few format operations
an attacker needs (minisign signatures, chain indexes, bundle indexes),
written here from the published formats (man/wdiff-format.5, minisign)
rather than imported from wdiff: these tests must hold whatever the package
looks like inside."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from factory import mutate, rand, tree, write_ckpt
from kit.cli import argv

#: a command that is not stuck finishes in well under 2 s on these small
#: inputs (0.2-0.6 s measured on 2 cores, four at once); one still running
#: after this long is blocked for good (an open() or read() on a FIFO never
#: returns). Raise it on a very slow machine: WDIFF_THREAT_HANG_S=20.
HANG_S = float(os.environ.get("WDIFF_THREAT_HANG_S", "8"))


@dataclass
class Run:
    args: list
    rc: int | None  # None: it hung and was killed
    stdout: str
    stderr: str
    elapsed: float
    maxrss_kib: int = 0  # peak resident set of this one process (Linux: KiB)
    cpu_s: float = 0.0  # user + system CPU time of this one process (all its threads)

    @property
    def hung(self) -> bool:
        return self.rc is None

    def __str__(self) -> str:
        state = "HUNG (killed)" if self.hung else f"exit {self.rc}"
        return (f"wdiff {' '.join(map(str, self.args))}: {state} after {self.elapsed:.2f} s, "
                f"{self.cpu_s:.2f} s CPU, peak RSS {self.maxrss_kib / 1024:.0f} MiB\n--- stdout\n{self.stdout[-3000:]}\n"
                f"--- stderr\n{self.stderr[-3000:]}")


def user_env(root: Path, *, trusted_keys=None, extra: dict | None = None) -> dict:
    """The environment of one user: every per-user place wdiff could keep
    state in (WDIFF_STATE_DIR, XDG_STATE_HOME, HOME) lies under ``root``, so
    two users are two roots and nothing leaks into the real home."""
    root = Path(root)
    for sub in ("state", "xdg-state", "home", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WDIFF_TRUSTED", "WDIFF_STATE"))}
    env.update(
        WDIFF_STATE_DIR=str(root / "state"),
        XDG_STATE_HOME=str(root / "xdg-state"),
        HOME=str(root / "home"),
        TMPDIR=str(root / "tmp"),
        PYTHONDONTWRITEBYTECODE="1",
        MALLOC_ARENA_MAX="2",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    env.setdefault("WDIFF_CACHE_DIR", str(root / "cache"))
    if trusted_keys:
        env["WDIFF_TRUSTED_KEYS"] = os.pathsep.join(str(k) for k in trusted_keys)
    env.update(extra or {})
    return env


# The command runs as the grandchild of the test: a small launcher forks it
# and reports its rusage. Linux carries a process's peak RSS across exec,
# and a child forked straight from pytest would start from pytest's own
# (hundreds of MiB late in a full run), so measuring the launcher's child
# is the only way to see wdiff's own peak.
_LAUNCHER = (
    "import os, resource, signal, sys\n"
    "fsize, as_, report = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "if fsize: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))\n"
    "if as_: resource.setrlimit(resource.RLIMIT_AS, (as_, as_))\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.executable, [sys.executable, '-m', 'wdiff', *sys.argv[4:]])\n"
    "for s in (signal.SIGINT, signal.SIGTERM):\n"
    "    signal.signal(s, lambda n, f: os.kill(pid, n))\n"
    "_, status, ru = os.wait4(pid, 0)\n"
    "with open(report, 'w') as f:\n"
    "    f.write(f'{ru.ru_maxrss} {ru.ru_utime + ru.ru_stime}')\n"
    "code = os.waitstatus_to_exitcode(status)\n"
    "if code < 0:\n"
    "    signal.signal(-code, signal.SIG_DFL)\n"
    "    os.kill(os.getpid(), -code)\n"
    "sys.exit(code)\n"
)


def start(args, env: dict, *, cwd=None, max_file_bytes: int = 0, max_address_space: int = 0) -> subprocess.Popen:
    """Start ``python -m wdiff ARGS`` under the launcher, which applies the
    limits and measures the command alone (see _LAUNCHER)."""
    import tempfile

    args = [str(a) for a in args]
    fd, report = tempfile.mkstemp(prefix="wdiff-rusage-")
    os.close(fd)
    cmd = [sys.executable, "-c", _LAUNCHER, str(max_file_bytes), str(max_address_space), report, *args]
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    p.rusage_report = report
    return p


def finish(p: subprocess.Popen, args, t0: float, timeout: float) -> Run:
    """Wait for ``p`` (killing it after ``timeout`` s), with its own rusage."""
    out: dict = {}

    def drain(name, stream):
        out[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
               for n, s in (("stdout", p.stdout), ("stderr", p.stderr))]
    for r in readers:
        r.start()
    hung = False
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            hung = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            pid, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.005)
    elapsed = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join(5)
    maxrss, cpu = ru.ru_maxrss, ru.ru_utime + ru.ru_stime  # the launcher's, if it could not report
    try:
        with open(p.rusage_report) as f:
            got = f.read().split()
        if len(got) == 2:
            maxrss, cpu = int(got[0]), float(got[1])
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(p.rusage_report)
    return Run([str(a) for a in args], None if hung else p.returncode,
               out.get("stdout", b"").decode("utf-8", "replace"), out.get("stderr", b"").decode("utf-8", "replace"),
               elapsed, maxrss, cpu)


def wdiff(*args, env: dict, timeout: float = 120, cwd=None, max_file_bytes: int = 0,
          max_address_space: int = 0) -> Run:
    t0 = time.monotonic()
    p = start(args, env, cwd=cwd, max_file_bytes=max_file_bytes, max_address_space=max_address_space)
    return finish(p, args, t0, timeout)


def wdiff_many(commands: list[list], env: dict, timeout: float = HANG_S) -> list[Run]:
    """Run several commands at once (each may hang: they share one wait)."""
    t0 = time.monotonic()
    procs = [(start(c, env), c) for c in commands]
    return [finish(p, c, t0, timeout) for p, c in procs]


def ok(run: Run) -> Run:
    assert run.rc == 0, str(run)
    return run


def dead_pid() -> int:
    """The PID of a process that has exited (until the kernel reuses it)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def dead_owner() -> str:
    """The PID-START tag (as wdiff.fsutil.owner_tag writes it) of a process that has exited."""
    return f"{dead_pid()}-1"


def files_over(root: Path, limit: int) -> list[str]:
    """Regular files under ``root`` larger than ``limit`` bytes (junk left behind)."""
    big = []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if st.st_size > limit:
                big.append(f"{p} ({st.st_size} bytes)")
    return big


# -- minisign, from its published format (Ed25519 over BLAKE2b-512: "ED") ------------------


def minisign(path: Path, secret_key_file: Path, trusted_comment: str, *, out: Path | None = None) -> Path:
    """Sign ``path`` with an unencrypted minisign secret key and an arbitrary
    trusted comment, as any holder of the key (or `minisign -S -t`) can."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = base64.b64decode(Path(secret_key_file).read_bytes().splitlines()[1])
    assert raw[:2] == b"Ed" and raw[2:4] == b"\0\0", "expects an unencrypted minisign key"
    key_id, seed = raw[54:62], raw[62:94]
    sk = Ed25519PrivateKey.from_private_bytes(seed)
    sig = sk.sign(hashlib.blake2b(Path(path).read_bytes(), digest_size=64).digest())
    global_sig = sk.sign(sig + trusted_comment.encode())
    out = Path(out) if out is not None else Path(str(path) + ".minisig")
    out.write_bytes(
        b"untrusted comment: signature from a test\n" + base64.b64encode(b"ED" + key_id + sig) + b"\n"
        + f"trusted comment: {trusted_comment}\n".encode() + base64.b64encode(global_sig) + b"\n"
    )
    return out


# -- chain indexes (man/wdiff-format.5, REMOTES) -------------------------------------------


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def read_chain(remote: Path) -> dict:
    return json.loads((Path(remote) / "chain.json").read_bytes())


def write_chain(remote: Path, chain: dict) -> bytes:
    raw = canonical(chain) + b"\n"
    (Path(remote) / "chain.json").write_bytes(raw)
    return raw


def chain_signature_object(raw: bytes) -> str:
    """Where a signed chain index keeps its signature: named by the XXH3-128
    of the index's bytes."""
    import xxhash

    h = xxhash.xxh3_128_hexdigest(raw)
    return f"signatures/{h[:2]}/chain-{h}.minisig"


# -- bundle indexes (man/wdiff-format.5, FILE LAYOUT and INDEX) ------------------------------


def _h(data: bytes) -> bytes:
    import xxhash

    return xxhash.xxh3_128_digest(data)


def fingerprint(files) -> str:
    """H("wdiff-checkpoint" 0x00 || E(f)...) with E(f) = u32 len(p) || p ||
    kind || u64 size || file digest."""
    s = bytearray(b"wdiff-checkpoint\0")
    for f in files:
        p = f["path"].encode()
        s += struct.pack("<I", len(p)) + p + (b"T" if f["kind"] == "safetensors" else b"F")
        s += struct.pack("<Q", f["size"]) + bytes.fromhex(f["digest"])
    return _h(bytes(s)).hex()


assert fingerprint([]) == "3bd5a6db02c44f35c6e95fbf7ed242bf"  # the spec's test vector


def read_index(bundle: Path) -> tuple[bytes, dict]:
    """(the bytes before the index, the parsed index)."""
    import zstandard

    data = Path(bundle).read_bytes()
    offset, length, raw_len = struct.unpack("<QQQ", data[-48:-24])
    assert data[-8:] == b"WDIFFEND"
    raw = zstandard.ZstdDecompressor().decompress(data[offset:offset + length], max_output_size=raw_len)
    return data[:offset], json.loads(raw)


def write_index(bundle: Path, head: bytes, index: dict) -> str:
    """Write a bundle whose index is ``index``: recompressed, with a new
    footer and so a new bundle id (returned, in hex); every digest is
    consistent."""
    import zstandard

    raw = canonical(index)
    packed = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
    footer = struct.pack("<QQQ", len(head), len(packed), len(raw)) + _h(packed) + b"WDIFFEND"
    Path(bundle).write_bytes(head + packed + footer)
    return _h(packed).hex()


# -- in-place applies: the journal a real one writes (wdiff/ops/apply/inplace.py) ---------------


def in_place_pair(root: Path, rng, shard_mib: int) -> tuple[Path, Path, dict, dict]:
    """A and B as an in-place apply meets them: shard 1 keeps its layout
    (patched in place; ``shard_mib`` MiB of BF16, enough that a SIGKILL sent
    when the journal appears lands before the apply ends, and "frozen", an
    F32 tensor between them: a unit of its own no record touches); shard 2
    changes (staged); config.json changes (staged), keep.txt stays, old.txt
    goes. Returns A, B, A's tensors and A's layout (write_ckpt's keywords),
    for a sibling version."""
    a = {f"w{i:02d}": rand(rng, "BF16", (512, 1024)) for i in range(shard_mib)}
    a["frozen"] = rand(rng, "F32", (256, 256))
    a["small"] = rand(rng, "F32", (100,))
    a["gone"] = rand(rng, "F32", (10,))
    b = {k: (v if k == "frozen" else mutate(v, 0.05, rng)) for k, v in a.items()}
    del b["gone"]
    b["added"] = rand(rng, "F16", (64, 64))
    big = ["frozen"] + [f"w{i:02d}" for i in range(shard_mib)]
    layout_a = {"groups": [big, ["small", "gone"]],
                "companions": {"config.json": b'{"step": 1}', "keep.txt": b"unchanged", "old.txt": b"removed by the bundle"}}
    layout_b = {"groups": [big, ["small", "added"]],
                "companions": {"config.json": b'{"step": 2}', "keep.txt": b"unchanged"}}
    return Path(write_ckpt(root / "A", a, **layout_a)), Path(write_ckpt(root / "B", b, **layout_b)), a, layout_a


def journal_plan(info: dict, base: Path) -> tuple[list[int], dict[str, str], list[str]]:
    """What inplace._start derives from the bundle (``wdiff info --json``)
    and the base: the files patched in place, staged, and removed."""
    base_files = set(tree(base))
    patch, stage = [], {}
    for i, f in enumerate(info["files"]):
        if f["kind"] == "safetensors" and f["source"] == "base":
            patch.append(i)
        elif f["kind"] == "file" and f["source"] == "base" and f["path"] in base_files:
            continue
        else:
            stage[str(i)] = f["path"]
    target = {f["path"] for f in info["files"]}
    remove = sorted((p for p in base_files if p not in target), key=lambda p: p.encode())
    return patch, stage, remove


def legit_journal(info: dict, bundle: Path, base: Path, phase: str = "patch") -> dict:
    """The journal a real apply writes right after staging (the same bytes
    as a SIGKILLed one leaves, but for key order; test_state_dir checks)."""
    patch, stage, remove = journal_plan(info, base)
    return {
        "version": 1,
        "bundle_id": info["bundle_id"],
        "bundle_path": os.path.abspath(bundle),
        "base_fingerprint": info["base_fingerprint"],
        "target_fingerprint": info["target_fingerprint"],
        "phase": phase,
        "patch": patch,
        "stage": stage,
        "remove": remove,
    }


def staged_from(target: Path, journal: dict) -> dict[str, bytes]:
    """The staged files a real apply builds: the target's file i, whole."""
    return {i: (target / p).read_bytes() for i, p in journal["stage"].items()}


def plant(W: Path, journal, stage: dict[str, bytes] | None = None, *, raw: bytes | None = None) -> None:
    """A journal in DIR ``W`` (``raw`` bytes, or ``journal`` as JSON) and staged files."""
    txn = W / ".wdiff" / "txn"
    (txn / "stage").mkdir(parents=True, exist_ok=True)
    for name, data in (stage or {}).items():
        (txn / "stage" / name).write_bytes(data)
    (txn / "journal.json").write_bytes(raw if raw is not None else json.dumps(journal).encode())


def interrupt_in_place(A: Path, bundle: Path, W: Path, env: dict, tries: int = 10) -> dict:
    """A real interrupted in-place apply: ``W`` a fresh copy of ``A``, and
    `wdiff apply --in-place` SIGKILLed the moment its journal exists (after
    staging, during patch or commit), in the environment ``env``. Returns
    the journal it left."""
    journal = W / ".wdiff" / "txn" / "journal.json"
    for _ in range(tries):
        if W.exists():
            shutil.rmtree(W)
        shutil.copytree(A, W)
        p = subprocess.Popen(argv("apply", "-q", bundle, W, "--in-place"), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while p.poll() is None:
            if journal.exists():
                p.send_signal(signal.SIGKILL)
                break
        p.wait()
        if journal.exists():
            return json.loads(journal.read_bytes())
    raise AssertionError("could not interrupt a real in-place apply")


# -- inotify, to act at the moment a file is opened ------------------------------------------

IN_OPEN = 0x20


class OnOpen:
    """Call ``action`` once, the first time anyone opens ``name`` in ``directory``
    (Linux inotify through libc). Use as a context manager."""

    def __init__(self, directory: Path, name: str, action) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if self.libc.inotify_add_watch(self.fd, os.fsencode(str(directory)), IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        self.name, self.action = name.encode(), action
        self.fired = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        import select

        while not self._stop.is_set():
            r, _, _ = select.select([self.fd], [], [], 0.05)
            if not r:
                continue
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            pos = 0
            while pos + 16 <= len(buf):
                _wd, mask, _cookie, n = struct.unpack_from("iIII", buf, pos)
                name = buf[pos + 16:pos + 16 + n].rstrip(b"\0")
                pos += 16 + n
                if mask & IN_OPEN and name == self.name and not self.fired.is_set():
                    self.action()
                    self.fired.set()
                    return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        os.close(self.fd)
