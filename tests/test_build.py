"""The test suite imports the source tree, so the C kernels are tested only
when the extension was built in place (pip install -e, as .ci/run does).
In CI (CI=true) a missing extension fails here instead of passing quietly
on the numpy twins alone."""

import os

import pytest

from wdiff.codec import kernels


def test_ci_builds_the_extension():
    if os.environ.get("CI") and not kernels.available():
        pytest.fail("the C extension was not built: install with pip install -e '.[test]'")
    if kernels.available():
        assert kernels.native() == (os.environ.get("WDIFF_NATIVE", "1") != "0")


def _compiler() -> str | None:
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CI") and _compiler() is None, reason="no C compiler")
def test_portable_subset_builds_and_agrees_with_numpy(tmp_path):
    """WDIFF_PORTABLE builds the extension with no GNU C construct (strict
    ISO C11, every pedantic warning an error), and that build passes the
    kernel tests against the numpy twins, as the full build does."""
    import subprocess
    import sys
    import sysconfig
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    so = tmp_path / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    sources = sorted(str(p) for p in (root / "wdiff" / "codec" / "native").glob("*.c"))
    cmd = [_compiler(), "-shared", "-fPIC", "-O1", "-std=c11", "-pedantic-errors", "-Wall", "-Werror",
           "-Wno-unused-parameter", "-DWDIFF_PORTABLE=1", f"-I{sysconfig.get_paths()['include']}",
           *sources, "-o", str(so), "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    runner = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('wdiff.codec._native', {str(so)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert m.FEATURES == '', m.FEATURES\n"
        "sys.modules['wdiff.codec._native'] = m\n"
        "from wdiff.codec import kernels\n"
        "assert kernels.native() and 'portable' in kernels.features(), kernels.features()\n"
        "import pytest\n"
        f"sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', {str(root / 'tests' / 'test_kernels.py')!r},\n"
        f"  {str(root / 'tests' / 'test_codec_v2.py') + '::test_bucket_kernels_match_their_numpy_twins'!r}]))\n"
    )
    env = dict(os.environ, WDIFF_NATIVE="1")
    r = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, cwd=root, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " passed" in r.stdout


def test_kernels_check_the_c_contract():
    """kernels.py refuses a C extension whose shared constants differ (a stale
    build), and names what differs."""
    import types

    fake = types.SimpleNamespace(**kernels.CONTRACT)
    assert kernels.contract_mismatch(fake) is None
    fake.MAX_RICE = kernels.MAX_RICE + 1
    assert "MAX_RICE" in kernels.contract_mismatch(fake)
    if kernels.available():
        assert kernels.contract_mismatch(kernels._native) is None


def test_version_names_the_vector_kernels_this_cpu_runs():
    """``wdiff --version`` says which of the built kernels the CPU at hand
    runs, as the CPU's own flags say (Linux: /proc/cpuinfo)."""
    if not kernels.available() or "avx2-dispatch" not in kernels._native.FEATURES:
        pytest.skip("no AVX2 kernels built")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags")
    want = ("AVX2 and AVX-512BW" if {"avx2", "bmi1", "popcnt", "avx512f", "avx512bw"} <= flags
            else "AVX2" if {"avx2", "bmi1", "popcnt"} <= flags else "portable loops (no AVX2)")
    was = kernels.set_native(True)
    try:
        assert kernels.features().endswith(f"; this CPU: {want}"), kernels.features()
    finally:
        kernels.set_native(was)


@pytest.mark.skipif(not os.environ.get("CI") and _compiler() is None, reason="no C compiler")
def test_setup_leaves_out_the_flags_a_compiler_refuses(tmp_path):
    """setup.py tries each GNU-style flag on the compiler at hand before it
    uses it: a compiler that refuses one (here -Wextra, as a compiler of
    another family might) still builds the extension, without that flag
    and with the others. (The real compiler, at -O0 to keep this short.)"""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    log, cc = tmp_path / "cc.log", tmp_path / "cc"
    cc.write_text("#!/bin/sh\n"
                  f'echo "$*" >> "{log}"\n'
                  'for a in "$@"; do [ "$a" = -Wextra ] && { echo "cc: unknown option -Wextra" >&2; exit 1; }; done\n'
                  f'exec "{_compiler()}" "$@" -O0\n')
    cc.chmod(0o755)
    lib = tmp_path / "lib"
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(lib),
                        "--build-temp", str(tmp_path / "tmp")], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, CC=str(cc)), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    sources = [line for line in log.read_text().splitlines() if " -c wdiff/codec/native/" in line]
    assert len(sources) == len(list((root / "wdiff" / "codec" / "native").glob("*.c"))), sources
    assert all("-Wextra" not in s.split() and "-std=c11" in s.split() for s in sources), sources
    (so,) = (lib / "wdiff" / "codec").glob("_native*")
    check = ("import importlib.util\n"
             f"spec = importlib.util.spec_from_file_location('wdiff.codec._native', {str(so)!r})\n"
             "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
             "from wdiff.codec import kernels\n"
             "assert kernels.contract_mismatch(m) is None, kernels.contract_mismatch(m)\n")
    r = subprocess.run([sys.executable, "-c", check], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
