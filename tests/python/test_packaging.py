"""The package as people install it: a wheel from the in-tree backend, an
offline pip install into bare venvs (no setuptools, no wheel), and the
library found without SPARQ_LIB."""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import sparq
from conftest import BUILD, ROOT

PKG = os.path.join(ROOT, "python")


def _env(preload=False, **over):
    """The environment for a child; without preload, minus LD_PRELOAD: the
    sanitizer runtimes a sanitizer build's tests preload only slow venv and
    pip down (a minute), and only a process that loads libsparq needs them."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    if not preload:
        env.pop("LD_PRELOAD", None)
    env.update(over)
    return env


def test_wheel_is_complete(tmp_path):
    """The in-tree backend's wheel: the package, METADATA, WHEEL and a RECORD
    whose hashes are the files' (what pip checks)."""
    sys.path.insert(0, os.path.join(PKG, "_build"))
    try:
        import sparq_build
    finally:
        sys.path.pop(0)
    name = sparq_build.build_wheel(str(tmp_path))
    assert name.startswith("sparq-" + sparq.__version__ + "-py3-none-")
    with zipfile.ZipFile(str(tmp_path / name)) as z:
        names = set(z.namelist())
        info = "sparq-%s.dist-info/" % sparq.__version__
        for f in ("sparq/__init__.py", "sparq/_lib.py", "sparq/core.py", "sparq/llama.py",
                  info + "METADATA", info + "WHEEL", info + "RECORD"):
            assert f in names
        assert not any("__pycache__" in n for n in names)
        meta = z.read(info + "METADATA").decode()
        assert "Name: sparq\n" in meta and "Requires-Python: >=3.9" in meta
        rows = [r.split(",") for r in z.read(info + "RECORD").decode().splitlines()]
        assert {r[0] for r in rows} == names
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                continue
            data = z.read(path)
            h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + h and int(size) == len(data)


def _interpreters():
    """CPython >= 3.9 interpreters to install into: python3 on PATH when it
    is not Debian's /usr/bin/python3 (pyenv's, say: no setuptools, no
    wheel), and Debian's own in a bare venv."""
    out = []
    for exe in (shutil.which("python3"), "/usr/bin/python3"):
        if not exe or not os.access(exe, os.X_OK):
            continue
        r = subprocess.run([exe, "-c", "import sys, venv, ensurepip; print(sys.executable);"
                            "print(sys.version_info >= (3, 9))"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True, env=_env())
        lines = r.stdout.split()
        if r.returncode != 0 or len(lines) != 2 or lines[1] != "True":
            continue
        real = os.path.realpath(lines[0])
        if real not in [i[1] for i in out]:
            out.append((exe, real))
    return out


_NON_DEBIAN = [i for i in _interpreters() if not os.path.basename(i[1]).startswith("python3")
               or not i[1].startswith("/usr/bin/")]


@pytest.mark.skipif(not _NON_DEBIAN, reason="a CPython >= 3.9 with venv other than Debian's /usr/bin/python3 "
                    "is not on this machine's PATH (pyenv's, say)")
def test_pip_install_offline_non_debian(tmp_path):
    _install_and_import(_NON_DEBIAN[0][1], tmp_path)


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK) or
                    subprocess.run(["/usr/bin/python3", "-c", "import ensurepip"],
                                   stderr=subprocess.DEVNULL).returncode != 0,
                    reason="Debian's python3 with ensurepip is not on this machine (python3-venv)")
def test_pip_install_offline_debian_bare_venv(tmp_path):
    _install_and_import("/usr/bin/python3", tmp_path)


def _install_and_import(python, tmp_path):
    venv = str(tmp_path / "venv")
    subprocess.run([python, "-m", "venv", venv], check=True, env=_env())
    vpy = os.path.join(venv, "bin", "python")
    # a bare venv: neither setuptools' wheel support nor `wheel` to lean on
    assert subprocess.run([vpy, "-c", "import wheel"], stderr=subprocess.DEVNULL).returncode != 0
    pip = [vpy, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "-q"]
    for extra in ([], ["--no-build-isolation", "--force-reinstall"]):
        r = subprocess.run(pip + extra + [PKG], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, env=_env(), cwd=str(tmp_path))
        assert r.returncode == 0, r.stdout
    lib = os.path.realpath(os.path.join(BUILD, "libsparq.so.0"))
    code = ("import sparq, sparq._lib as L; assert sparq.__file__.startswith(%r), sparq.__file__;"
            "print(sparq.version(), L.load()._name)" % venv)
    r = subprocess.run([vpy, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, env=_env(True, SPARQ_LIB=lib), cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout
    assert r.stdout.split() == [sparq.version(), lib]
    if os.path.realpath(BUILD) == os.path.realpath(os.path.join(ROOT, "build")):
        # installed, used from inside the checkout: the checkout's build/ is found
        env = _env(True)
        env.pop("SPARQ_LIB", None)
        r = subprocess.run([vpy, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, env=env, cwd=os.path.join(ROOT, "tests"))
        assert r.returncode == 0, r.stdout
        assert os.path.realpath(r.stdout.split()[1]) == lib


def test_import_from_checkout_finds_build(tmp_path):
    """`import sparq` from python/ of a checkout loads what `make` built in
    build/ without SPARQ_LIB, wherever the program runs from."""
    lib = os.path.realpath(os.path.join(ROOT, "build", "libsparq.so.0"))
    if not os.path.exists(lib):
        pytest.skip("build without build/libsparq.so.0 (SPARQ_BUILD=%s)" % BUILD)
    env = _env(True, PYTHONPATH=PKG)
    env.pop("SPARQ_LIB", None)
    code = "import sparq, sparq._lib as L; print(L.load()._name); print(sparq.version())"
    for cwd in (str(tmp_path), PKG):
        r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, env=env, cwd=cwd)
        assert r.returncode == 0, r.stdout
        assert os.path.realpath(r.stdout.split()[0]) == lib


