"""`--web.config.file`: TLS and basic auth in the format Prometheus exporters share.

The file is exporter-toolkit's (prometheus/exporter-toolkit, docs/web-configuration.md):

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
      client_ca_file: ca.crt
      min_version: TLS12             # TLS10..TLS13; default TLS12, as the toolkit's
      max_version: TLS13
      prefer_server_cipher_suites: true
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':')

Keys are checked strictly, as the toolkit does: an unknown key is an error, not silently
ignored. Settings the toolkit has that OpenSSL through Python cannot honour the same way
(`cipher_suites`, `curve_preferences`, `client_allowed_sans`, `RequestClientCert`,
`RequireAnyClientCert`, inline `cert`/`key`) are refused with a message saying so, never
ignored: a security setting that silently does nothing is worse than an error.

The file and the certificates it names are read as runtime/hostfiles.py reads a
configuration file: never blocking (a FIFO or /dev/zero in its place is refused, as is a
file over 1 MiB). Re-reading it while the exporter runs is web/reload.py's.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from exporter.runtime.hostfiles import read_config

log = logging.getLogger("exporter.webconfig")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
ALLOWED_HEADERS = {
    "Content-Security-Policy": None,
    "X-Frame-Options": {"deny", "sameorigin"},
    "X-Content-Type-Options": {"nosniff"},
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
"""The toolkit's allowed response headers (and the values it allows, where it limits them)."""

_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
}
_REFUSED_TLS_KEYS = {
    "cipher_suites": "Python's ssl module uses OpenSSL cipher names; leave it out",
    "curve_preferences": "not settable through Python's ssl module; leave it out",
    "client_allowed_sans": "not supported here; use a dedicated client CA instead",
    "cert": "inline certificates are not supported; use cert_file",
    "key": "inline keys are not supported; use key_file",
}


BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
"""What bcrypt accepts as a hash (cost 4-31, 22 characters of salt, 31 of hash): checked
by its shape, not by running bcrypt, which at cost 12 took a quarter of a second per user on
every reload."""


class WebConfigError(ValueError):
    """The web config file is unusable; the message names the key."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED
    prefer_server_cipher_suites: bool = True

    def files(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


@dataclass(frozen=True, slots=True)
class WebConfig:
    tls: TlsConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    """User name -> bcrypt hash."""
    headers: Mapping[str, str] = field(default_factory=dict)
    ssl_context: ssl.SSLContext | None = None

    @property
    def auth(self) -> bool:
        return bool(self.users)


def _mapping(doc: Any, where: str) -> Mapping[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise WebConfigError(f"{where}: expected a mapping, got {type(doc).__name__}")
    return doc


def _strict(doc: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise WebConfigError(f"{where}: unknown key {unknown[0]!r}")


def parse_web_config(text: str, directory: Path) -> WebConfig:
    """The file's text -> WebConfig (with its SSLContext built, so bad certs fail here)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"not YAML: {str(exc).splitlines()[0]}") from exc
    doc = _mapping(doc, "web config")
    _strict(doc, {"tls_server_config", "http_server_config", "basic_auth_users"}, "web config")
    tls = _tls(_mapping(doc.get("tls_server_config"), "tls_server_config"), directory)
    users = _users(_mapping(doc.get("basic_auth_users"), "basic_auth_users"))
    headers = _headers(_mapping(doc.get("http_server_config"), "http_server_config"))
    return WebConfig(tls, users, headers, None if tls is None else ssl_context(tls))


def _tls(doc: Mapping[str, Any], directory: Path) -> TlsConfig | None:
    for refused, why in _REFUSED_TLS_KEYS.items():
        if refused in doc:
            raise WebConfigError(f"tls_server_config.{refused}: {why}")
    _strict(doc, _TLS_KEYS, "tls_server_config")
    if not doc:
        return None

    def path(key: str) -> Path | None:
        value = doc.get(key)
        if value in (None, ""):
            return None
        if not isinstance(value, str):
            raise WebConfigError(f"tls_server_config.{key}: expected a file path")
        return directory / value

    cert, key = path("cert_file"), path("key_file")
    if cert is None or key is None:
        raise WebConfigError("tls_server_config: cert_file and key_file are both required")
    auth_type = str(doc.get("client_auth_type") or "")
    if auth_type not in CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth_type!r} is not supported "
            f"(use one of {', '.join(k for k in CLIENT_AUTH if k)})"
        )
    ca = path("client_ca_file")
    if CLIENT_AUTH[auth_type] != ssl.CERT_NONE and ca is None:
        raise WebConfigError(
            f"tls_server_config: client_auth_type {auth_type} needs client_ca_file"
        )

    def version(key: str, default: ssl.TLSVersion) -> ssl.TLSVersion:
        value = doc.get(key)
        if value in (None, ""):
            return default
        if value not in TLS_VERSIONS:
            raise WebConfigError(
                f"tls_server_config.{key}: expected one of {', '.join(TLS_VERSIONS)}, got {value!r}"
            )
        return TLS_VERSIONS[value]

    prefer = doc.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise WebConfigError("tls_server_config.prefer_server_cipher_suites: expected true/false")
    return TlsConfig(
        cert_file=cert,
        key_file=key,
        client_auth=CLIENT_AUTH[auth_type],
        client_ca_file=ca,
        min_version=version("min_version", ssl.TLSVersion.TLSv1_2),
        max_version=version("max_version", ssl.TLSVersion.MAXIMUM_SUPPORTED),
        prefer_server_cipher_suites=prefer,
    )


def _users(doc: Mapping[str, Any]) -> dict[str, bytes]:
    users = {}
    for name, hashed in doc.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise WebConfigError(f"basic_auth_users: bad user name {name!r}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"basic_auth_users.{name}: expected a bcrypt hash ($2y$...)")
        if not BCRYPT_HASH.fullmatch(hashed):
            raise WebConfigError(f"basic_auth_users.{name}: not a valid bcrypt hash")
        users[name] = hashed.encode()
    return users


def _headers(doc: Mapping[str, Any]) -> dict[str, str]:
    _strict(doc, {"headers", "http2"}, "http_server_config")
    if not isinstance(doc.get("http2", True), bool):
        raise WebConfigError("http_server_config.http2: expected true/false")
    headers = {}
    for name, value in _mapping(doc.get("headers"), "http_server_config.headers").items():
        if name not in ALLOWED_HEADERS:
            raise WebConfigError(
                f"http_server_config.headers: {name!r} is not one of {', '.join(ALLOWED_HEADERS)}"
            )
        allowed = ALLOWED_HEADERS[name]
        text = str(value)
        if allowed is not None and text.lower() not in allowed:
            raise WebConfigError(f"http_server_config.headers.{name}: {text!r} is not allowed")
        if any(c in text for c in "\r\n\0"):
            raise WebConfigError(f"http_server_config.headers.{name}: control characters")
        headers[name] = text
    return headers


def ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    named = (("cert_file", tls.cert_file), ("key_file", tls.key_file),
             ("client_ca_file", tls.client_ca_file))  # fmt: skip
    for key, path in named:  # OpenSSL opens them blocking: a FIFO there would hang it
        if path is not None:
            _regular(f"tls_server_config.{key}", path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = tls.min_version
    ctx.maximum_version = tls.max_version
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(str(p) for p in tls.files())
        raise WebConfigError(f"tls_server_config ({files}): {exc}") from exc
    ctx.verify_mode = tls.client_auth
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


def _regular(key: str, path: Path) -> None:
    """ssl's loaders say `[Errno 2] No such file or directory` without the file, and open
    it blocking: the key and the path, said here first, and only a regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise WebConfigError(f"{key} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise WebConfigError(f"{key} {path} is not a regular file")


def read_web_config(path: Path) -> bytes:
    """The file's bytes, read without blocking (hostfiles.read_config)."""
    try:
        return read_config(path)
    except OSError as exc:
        raise WebConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc


def load_web_config(path: Path, *, allow_empty: bool = True) -> WebConfig:
    """The file's config. An empty file (no YAML document) is a valid empty config at start,
    as for the toolkit; `allow_empty=False` (a reload) refuses it."""
    return parse_bytes(read_web_config(path), path, allow_empty=allow_empty)


def parse_bytes(data: bytes, path: Path, *, allow_empty: bool) -> WebConfig:
    """The config in `data` (the file at `path`'s bytes)."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"cannot read {path}: not UTF-8 ({exc.reason})") from exc
    if not allow_empty and not _has_document(text):
        raise WebConfigError(f"{path} is empty")
    return parse_web_config(text, path.parent)


def _has_document(text: str) -> bool:
    try:
        return yaml.safe_load(text) is not None
    except yaml.YAMLError:
        return True  # not empty: parse_web_config says what is wrong
