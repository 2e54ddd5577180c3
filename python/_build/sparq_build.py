"""A PEP 517 build backend for the sparq package, stdlib only.

pip builds a project through its backend; setuptools' needs the `wheel`
package (or setuptools >= 70.1) to make a wheel, and neither is in a fresh
venv offline. The package is pure Python, so writing the wheel by hand is
short: a zip of the package plus METADATA, WHEEL and RECORD (PEP 427).
build_editable (PEP 660) installs a .pth file that points at this tree.

The metadata comes from pyproject.toml's [project] table (read with tomllib
where the interpreter has it, else with the small reader below, enough for
the flat string keys this file uses).
"""
import base64
import hashlib
import io
import os
import re
import sysconfig
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "sparq"


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
        return tomllib.loads(raw.decode("utf-8"))["project"]
    except ImportError:
        pass
    # Python < 3.11: the [project] table's `key = "string"` lines and
    # optional-dependencies' `name = ["a", "b"]` lines.
    proj, table = {}, None
    for line in raw.decode("utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            table = line.strip("[]").strip()
            continue
        m = re.match(r'([A-Za-z0-9_-]+)\s*=\s*(.*)$', line)
        if not m:
            continue
        key, val = m.group(1), m.group(2).strip()
        if table == "project":
            if val.startswith('"'):
                proj[key] = val[1:val.index('"', 1)]
            elif key == "license":
                t = re.search(r'text\s*=\s*"([^"]*)"', val)
                proj[key] = {"text": t.group(1)} if t else {}
        elif table == "project.optional-dependencies":
            proj.setdefault("optional-dependencies", {})[key] = re.findall(r'"([^"]*)"', val)
    return proj


def _name_version():
    p = _project()
    return p["name"], p["version"]


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"]]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: %s" % lic["text"])
    for extra, reqs in sorted((p.get("optional-dependencies") or {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for r in reqs:
            lines.append('Requires-Dist: %s; extra == "%s"' % (r, extra))
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str) and os.path.exists(os.path.join(ROOT, readme)):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


def _package_files():
    """(path in the wheel, path on disk) of the package: its .py files and a
    libsparq.so* copied beside them, if any (then the wheel is platform's)."""
    out, binary = [], False
    pkg = os.path.join(ROOT, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        full = os.path.join(pkg, name)
        if not os.path.isfile(full):
            continue
        if name.endswith(".py") or name == "py.typed":
            out.append((PACKAGE + "/" + name, full))
        elif name.startswith("libsparq.so"):
            out.append((PACKAGE + "/" + name, full))
            binary = True
    return out, binary


def _tag(binary):
    if not binary:
        return "py3-none-any"
    return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _wheel_text(binary):
    return ("Wheel-Version: 1.0\nGenerator: sparq_build\nRoot-Is-Purelib: %s\nTag: %s\n" %
            ("false" if binary else "true", _tag(binary)))


def _date():
    # reproducible: SOURCE_DATE_EPOCH when set, else a fixed date (zip's floor is 1980)
    t = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    return time.gmtime(max(t, 315532800))[:6]


def _write_wheel(wheel_directory, entries, binary):
    """entries: (name in the zip, bytes, executable?); adds the dist-info files."""
    name, version = _name_version()
    dist = "%s-%s" % (name.replace("-", "_"), version)
    info = dist + ".dist-info"
    entries = list(entries) + [
        (info + "/METADATA", _metadata().encode("utf-8"), False),
        (info + "/WHEEL", _wheel_text(binary).encode(), False),
        (info + "/top_level.txt", (PACKAGE + "\n").encode(), False),
    ]
    record = []
    for arc, data, _ in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
    record.append(info + "/RECORD,,")
    entries.append((info + "/RECORD", ("\n".join(record) + "\n").encode(), False))
    filename = "%s-%s.whl" % (dist, _tag(binary))
    path = os.path.join(wheel_directory, filename)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data, exe in entries:
            zi = zipfile.ZipInfo(arc, _date())
            zi.external_attr = (0o755 if exe else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return filename


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- PEP 517 hooks ---------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    name, version = _name_version()
    info = "%s-%s.dist-info" % (name.replace("-", "_"), version)
    d = os.path.join(metadata_directory, info)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    _, binary = _package_files()
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(_wheel_text(binary))
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files, binary = _package_files()
    entries = [(arc, _read(p), arc.split("/")[-1].startswith("libsparq.so")) for arc, p in files]
    return _write_wheel(wheel_directory, entries, binary)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # a .pth line puts this tree on sys.path: edits show without reinstalling
    pth = (ROOT + "\n").encode()
    return _write_wheel(wheel_directory, [("_sparq_editable.pth", pth, False)], False)


def build_sdist(sdist_directory, config_settings=None):
    name, version = _name_version()
    base = "%s-%s" % (name, version)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    files = ["pyproject.toml", "README.md", "_build/sparq_build.py"]
    files += [arc for arc, p in _package_files()[0] if arc.endswith(".py")]
    pkg_info = _metadata().encode("utf-8")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            data = _read(os.path.join(ROOT, rel))
            ti = tarfile.TarInfo(base + "/" + rel)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 315532800
            tar.addfile(ti, io.BytesIO(data))
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size, ti.mode, ti.mtime = len(pkg_info), 0o644, 315532800
        tar.addfile(ti, io.BytesIO(pkg_info))
    return base + ".tar.gz"
