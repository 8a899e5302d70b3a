"""Packaging: versions agree, `python -m flashattn` passes, import never pulls in torch, and the
wheel is py3-none-<platform> with one shared library that needs nothing from torch, Python or
libstdc++."""

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import flashattn

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))


def _header_version():
    with open(os.path.join(ROOT, "include", "flashattn.h")) as f:
        text = f.read()
    parts = [re.search(rf"#define FA_VERSION_{p} (\d+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def test_versions_agree():
    assert flashattn.library_version() == flashattn.__version__
    if os.path.exists(os.path.join(ROOT, "include", "flashattn.h")):
        assert _header_version() == flashattn.__version__


def test_installed_layout():
    """Under `make test` the tests run against the installed wheel: the package comes from
    site-packages and loads the libflashattn.so that sits next to it."""
    if os.environ.get("FLASHATTN_EXPECT_INSTALLED") != "1":
        pytest.skip("not running against an installed wheel (make python-test does)")
    pkg = os.path.dirname(os.path.abspath(flashattn.__file__))
    assert os.path.realpath(pkg).startswith(os.path.realpath(sysconfig.get_paths()["purelib"])) \
        or os.path.realpath(pkg).startswith(os.path.realpath(sysconfig.get_paths()["platlib"]))
    assert flashattn.library_path() == os.path.join(pkg, "libflashattn.so")


def test_python_m_flashattn_verifies():
    r = subprocess.run([sys.executable, "-m", "flashattn"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "✓ flashattn works" in r.stdout
    assert "✗" not in r.stdout


def test_import_does_not_import_torch():
    code = "import sys, flashattn; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def _wheel():
    path = os.environ.get("FLASHATTN_WHEEL")
    if path:
        return path
    wheels = sorted(glob.glob(os.path.join(ROOT, "dist", "flashattn-*.whl")), key=os.path.getmtime)
    if not wheels:
        pytest.skip("no wheel in dist/ (make wheel builds one)")
    return wheels[-1]


def test_wheel_is_py3_none_platform():
    name = os.path.basename(_wheel())
    m = re.fullmatch(r"flashattn-(?P<v>[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl",
                     name)
    assert m, name
    assert m["v"] == flashattn.__version__
    assert (m["py"], m["abi"]) == ("py3", "none"), f"{name}: must not be tied to one CPython"
    assert m["plat"] == sysconfig.get_platform().replace("-", "_").replace(".", "_")


def test_wheel_contents_and_shared_library_dependencies(tmp_path):
    if not shutil.which("readelf"):
        pytest.skip("readelf (binutils) not installed")
    with zipfile.ZipFile(_wheel()) as z:
        names = z.namelist()
        sos = [n for n in names if re.search(r"\.so(\.|$)", n)]
        assert sos == ["flashattn/libflashattn.so"], sos
        for n in ("flashattn/__init__.py", "flashattn/__main__.py", "flashattn/_lib.py",
                  "flashattn/_torch_api.py", "flashattn/reference.py",
                  "flashattn/bert_padding.py", "flashattn/integrations/transformers.py",
                  "flashattn/integrations/hf_kernel/__init__.py",
                  "flashattn/integrations/hf_kernel/metadata.json"):
            assert n in names
        assert not [n for n in names if n.startswith(("lib/", "include/", "bin/"))]
        z.extract(sos[0], tmp_path)
    so = str(tmp_path / sos[0])
    dyn = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    allowed = re.compile(r"^(libc|libm|libpthread|libdl|ld-linux[^.]*)\.so(\.\d+)*$")
    assert needed and all(allowed.match(n) for n in needed), needed
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", so], capture_output=True, text=True,
                          check=True).stdout
    undefined = [line.split()[-1] for line in syms.splitlines()
                 if " UND " in line and len(line.split()) >= 8]
    bad = [s for s in undefined
           if re.match(r"^(_?Py|_Z|c10|at::|torch|THP|__cxa|__gxx|_Unwind)", s)
           or "GLIBCXX" in s or "CXXABI" in s]
    assert not bad, f"symbols from Python, torch or libstdc++: {bad}"
    versions = subprocess.run(["readelf", "-V", so], capture_output=True, text=True).stdout
    assert "GLIBCXX" not in versions and "CXXABI" not in versions
    # Exported: only the C API.
    exported = [line.split()[-1] for line in syms.splitlines()
                if " UND " not in line and "GLOBAL" in line and "DEFAULT" in line]
    assert exported and all(s.startswith("fa_") for s in exported), exported


def test_readme_python_example_runs():
    """The README's Python quick start runs as written (it needs torch)."""
    readme = os.path.join(ROOT, "README.md")
    if not os.path.exists(readme):
        pytest.skip("README.md not found")
    pytest.importorskip("torch")
    with open(readme) as f:
        text = f.read()
    section = text[text.index("## Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "from flashattn import flash_attn_func" in code
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["q"].grad is not None and namespace["out"].shape == (2, 1024, 8, 64)
