"""Signatures: minisign-compatible Ed25519 over bundles and chain indexes."""

import shutil
import subprocess

import pytest
from factory import simple_pair, tree
from kit.cli import in_process

import wdiff
from wdiff.errors import IntegrityError, UsageError
from wdiff.format import signature as signing


@pytest.fixture
def keys(tmp_path):
    signing.generate(str(tmp_path / "key"))
    signing.generate(str(tmp_path / "other"))
    return tmp_path / "key", tmp_path / "key.pub", tmp_path / "other.pub"


def test_signed_bundle_applies_only_with_a_trusted_key(tmp_path, keys):
    key, pub, other = keys
    A, B = simple_pair(tmp_path)
    bundle = tmp_path / "d.wdb"
    wdiff.pack(A, B, bundle)
    with pytest.raises(IntegrityError):  # not signed yet
        wdiff.apply(bundle, A, tmp_path / "C", trusted_keys=[pub])
    in_process("sign", bundle, "--key", key, "-q", want=0)
    with pytest.raises(IntegrityError):
        wdiff.apply(bundle, A, tmp_path / "C", trusted_keys=[other])
    wdiff.apply(bundle, A, tmp_path / "C", trusted_keys=[pub])
    assert tree(tmp_path / "C") == tree(B)
    # a changed byte anywhere breaks the signature before anything is read
    data = bytearray(bundle.read_bytes())
    data[100] ^= 1
    bundle.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        wdiff.apply(bundle, A, tmp_path / "D", trusted_keys=[pub])
    assert not (tmp_path / "D").exists()
    with pytest.raises(UsageError):
        wdiff.apply(bundle, A, tmp_path / "D", require_signature=True)


def test_signed_push_and_trusting_pull(tmp_path, keys, monkeypatch):
    key, pub, other = keys
    A, B = simple_pair(tmp_path)
    remote = str(tmp_path / "remote")
    wdiff.push(A, remote, anchor=True, sign_key=key)
    wdiff.push(B, remote, base=A, sign_key=key)
    wdiff.pull(remote, tmp_path / "d", trusted_keys=[pub])
    assert tree(tmp_path / "d") == tree(B)
    with pytest.raises(IntegrityError):
        wdiff.pull(remote, tmp_path / "e", trusted_keys=[other])
    assert not (tmp_path / "e").exists()
    monkeypatch.setenv("WDIFF_TRUSTED_KEYS", str(pub))  # a configured key means signatures are required
    wdiff.pull(remote, tmp_path / "f")
    assert tree(tmp_path / "f") == tree(B)


def test_unsigned_or_tampered_remote_is_refused(tmp_path, keys):
    key, pub, other = keys
    A, B = simple_pair(tmp_path)
    remote = tmp_path / "remote"
    wdiff.push(A, remote, anchor=True, sign_key=key)
    before = (remote / "chain.json").read_bytes()
    with pytest.raises(IntegrityError, match="signed"):
        wdiff.push(B, remote, base=A)  # unsigned onto a signed chain: it would strip the signature
    assert (remote / "chain.json").read_bytes() == before
    # a remote whose chain nobody signed is refused by a pull that trusts a key
    unsigned = tmp_path / "unsigned"
    wdiff.push(A, unsigned, anchor=True)
    wdiff.push(B, unsigned, base=A)
    with pytest.raises(IntegrityError):
        wdiff.pull(unsigned, tmp_path / "d", trusted_keys=[pub])
    assert not (tmp_path / "d").exists()
    # tamper with a signed bundle on the remote: the chain still names it
    r2 = tmp_path / "remote2"
    wdiff.push(A, r2, anchor=True, sign_key=key)
    e = wdiff.log(r2).entries[0]
    # a valid signature of the same bytes, but made for something else: the
    # trusted comment must name this bundle, its base and its target
    written = signing.sign_file(str(r2 / e.parts[0].path), signing.load_secret(str(key)), "wdiff bundle forged")
    assert written == str(r2 / e.signature)
    with pytest.raises(IntegrityError):
        wdiff.pull(r2, tmp_path / "g", trusted_keys=[pub])


@pytest.mark.skipif(shutil.which("minisign") is None, reason="minisign is not installed")
def test_minisign_interoperates(tmp_path):
    """minisign checks what wdiff signs, and wdiff checks what minisign signs,
    with keys made by either."""
    A, B = simple_pair(tmp_path)
    bundle = tmp_path / "d.wdb"
    wdiff.pack(A, B, bundle)
    # a wdiff key, a wdiff signature, checked by minisign
    signing.generate(str(tmp_path / "wk"))
    signing.sign_file(str(bundle), signing.load_secret(str(tmp_path / "wk")), "made by wdiff")
    r = subprocess.run(["minisign", "-Vm", str(bundle), "-p", str(tmp_path / "wk.pub")], capture_output=True, text=True)
    assert r.returncode == 0 and "made by wdiff" in r.stdout, r.stderr
    # a minisign key and signature (prehashed), checked by wdiff
    subprocess.run(["minisign", "-G", "-W", "-p", str(tmp_path / "m.pub"), "-s", str(tmp_path / "m.key")],
                   check=True, capture_output=True)
    (tmp_path / "d.wdb.minisig").unlink()
    subprocess.run(["minisign", "-S", "-s", str(tmp_path / "m.key"), "-m", str(bundle), "-t", "made by minisign"],
                   check=True, capture_output=True)
    wdiff.apply(bundle, A, tmp_path / "C", trusted_keys=[tmp_path / "m.pub"])
    assert tree(tmp_path / "C") == tree(B)
    # minisign's key signs with wdiff too
    signing.sign_file(str(bundle), signing.load_secret(str(tmp_path / "m.key")), "wdiff with a minisign key")
    r = subprocess.run(["minisign", "-Vm", str(bundle), "-p", str(tmp_path / "m.pub")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
