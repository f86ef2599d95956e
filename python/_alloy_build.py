# SPDX-License-Identifier: Apache-2.0
"""A PEP 517/660 build backend for the pure-Python package `alloy` that needs nothing installed.

Builds a py3-none-any wheel of alloy/*.py, an sdist, and an editable wheel (a .pth file naming
this folder). Name and version come from pyproject.toml's [project] table.
"""

import base64
import hashlib
import io
import re
import tarfile
import zipfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent


def _project():
    text = (_ROOT / "pyproject.toml").read_text()
    table = text.split("[project]", 1)[1]
    fields = dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]*)"', table, re.MULTILINE))
    return fields


def _metadata():
    project = _project()
    return (
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
        f"Summary: {project['description']}\nRequires-Python: {project['requires-python']}\n"
        f"License: {project['license']}\n"
    )


def _wheel(directory, files):
    project = _project()
    dist_info = f"{project['name']}-{project['version']}.dist-info"
    files = dict(files)
    files[f"{dist_info}/METADATA"] = _metadata().encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: _alloy_build\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{project['name']}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(Path(directory) / name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return name


def _sources():
    return {
        f"alloy/{path.name}": path.read_bytes() for path in sorted((_ROOT / "alloy").glob("*.py"))
    }


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, _sources())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"alloy.pth": f"{_ROOT}\n".encode()})


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = f"{project['name']}-{project['version']}"
    files = {
        "pyproject.toml": (_ROOT / "pyproject.toml").read_bytes(),
        "_alloy_build.py": Path(__file__).read_bytes(),
        "PKG-INFO": _metadata().encode(),
    }
    files.update(_sources())
    with tarfile.open(Path(sdist_directory) / f"{base}.tar.gz", "w:gz") as sdist:
        for path, data in files.items():
            entry = tarfile.TarInfo(f"{base}/{path}")
            entry.size = len(data)
            sdist.addfile(entry, io.BytesIO(data))
    return f"{base}.tar.gz"
