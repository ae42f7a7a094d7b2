"""Certificates for a loopback cluster, made with openssl (docs/testing.md,
"Running Kubernetes 1.36 on one machine").

One EC P-256 CA; each pair is a key plus a CSR signed by the CA with an extension file
(`extendedKeyUsage=serverAuth,clientAuth`, and the SANs of a server). The service-account
token key is RSA 2048 (`genrsa`, `rsa -pubout`). Files are named `NAME.crt`/`NAME.key`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"
"""The cluster lives for one test session."""


@dataclass(frozen=True, slots=True)
class Pair:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {done.stderr.strip()}")


class Pki:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        _openssl(
            *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", DAYS),
            *("-subj", "/CN=kde-e2e-ca"),
            cwd=directory,
        )
        self.ca = directory / "ca.crt"
        self.ca_key = directory / "ca.key"

    def pair(self, name: str, subject: str, sans: tuple[str, ...] = ()) -> Pair:
        """A key and a CA-signed certificate for `subject` (`/CN=.../O=...`)."""
        ext = self.dir / f"{name}.ext"
        lines = ["extendedKeyUsage=serverAuth,clientAuth", "keyUsage=digitalSignature"]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
            *("-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject),
            cwd=self.dir,
        )
        _openssl(
            *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
            *("-CAcreateserial", "-days", DAYS, "-extfile", ext.name, "-out", f"{name}.crt"),
            cwd=self.dir,
        )
        return Pair(self.dir / f"{name}.crt", self.dir / f"{name}.key")

    def rsa(self, name: str) -> Pair:
        """An RSA key (`NAME.key`) and its public half (`NAME.pub`, in `cert`)."""
        _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=self.dir)
        _openssl("rsa", "-in", f"{name}.key", "-pubout", "-out", f"{name}.pub", cwd=self.dir)
        return Pair(self.dir / f"{name}.pub", self.dir / f"{name}.key")
