"""LibreOffice, headless, as the office suite a translated file must open in: each format's slow test converts its
output to PDF with it (Debian's libreoffice-writer-nogui, -impress-nogui and -calc-nogui; .ci/run installs them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from servers import missing

SOFFICE = shutil.which("soffice") or "/usr/bin/soffice"


def to_pdf(data: bytes, suffix: str, tmp_path: Path) -> bytes:
    """The file converted to PDF by LibreOffice; the test fails with LibreOffice's words if it cannot convert it."""
    if not Path(SOFFICE).exists():
        missing("LibreOffice is not installed: apt-get install libreoffice-writer-nogui libreoffice-impress-nogui")
    source = tmp_path / f"translated{suffix}"
    source.write_bytes(data)
    out = tmp_path / "pdf"
    profile = (tmp_path / "profile").as_uri()  # its own profile: two tests never share (and lock) one
    command = [SOFFICE, f"-env:UserInstallation={profile}", "--headless", "--convert-to", "pdf", "--outdir", str(out)]
    done = subprocess.run([*command, str(source)], capture_output=True, text=True, timeout=180)
    pdf = out / "translated.pdf"
    assert done.returncode == 0 and pdf.exists(), f"LibreOffice could not convert it: {done.stdout}{done.stderr}"
    assert pdf.read_bytes().startswith(b"%PDF-")
    return pdf.read_bytes()
