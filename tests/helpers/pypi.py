"""An offline PyPI: a find-links directory holding a tiny sdist pip can read without building anything."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

BACKEND = '''import os
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.makedirs(os.path.join(metadata_directory, "pkg-{v}.dist-info"))
    with open(os.path.join(metadata_directory, "pkg-{v}.dist-info", "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: pkg\\nVersion: {v}\\n")
    return "pkg-{v}.dist-info"
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("pip download never builds")
'''


def local_sdist(links: Path, version: str, a_c: bytes) -> str:
    """pkg-VERSION.tar.gz in a find-links directory pip reads offline (an in-tree backend that needs nothing
    installed); its sha256."""
    files = {f"pkg-{version}/pyproject.toml": b'[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                              b'backend-path = ["."]\n',
             f"pkg-{version}/backend.py": BACKEND.format(v=version).encode(),
             f"pkg-{version}/PKG-INFO": f"Metadata-Version: 2.1\nName: pkg\nVersion: {version}\n".encode(),
             f"pkg-{version}/vendor/up/src/a.c": a_c}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    links.mkdir(parents=True, exist_ok=True)
    (links / f"pkg-{version}.tar.gz").write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def sdist_pin(sha: str, include: str = "[src]", exclude: str = "") -> str:
    """vendor.yaml pinning local_sdist's pkg 1.0 by its sha256 and vendoring its vendor/up (include and exclude as
    YAML flow lists)."""
    return (f"components:\n  - name: up\n    kind: sdist\n    package: pkg\n    version: '1.0'\n    sha256: '{sha}'\n"
            f"    subdir: vendor/up\n    include: {include}\n" + (f"    exclude: {exclude}\n" if exclude else ""))
