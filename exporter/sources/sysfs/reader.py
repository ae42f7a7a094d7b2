"""Checked reads under one sysfs root: the `Reader` every sysfs source reads through.

Rules learnt from node_exporter/procfs: read each file once per cycle with one small
read (broken drivers answer EAGAIN forever, and some attributes are slow to produce), and
let no single file fail a cycle: an unreadable, garbage or vanished file skips that one
field and is counted. A file that was never there is "not supported" (no series, no error):
only a file that was readable before and is not now counts as an error, so a driver that
lacks `power1_input` is quiet while a hwmon that starts failing is visible.

Values are checked, not just parsed: a number must be plain ASCII decimal (or 0x hex for
integers) and inside what the field can hold (`U64` unless the caller gives a physical range:
a percentage is 0..100, a temperature above absolute zero); anything else is a field error
for that one field, never an exception. Counters go through `Counters`
(`exporter.sources.sysfs.source`, on `exporter.sources.counters`' rule): held while a file is
briefly unreadable, reset only when a second read confirms it, so one bad read can neither
corrupt nor reverse a counter.

Nothing outside the root is read. sysfs has links of its own, and only these: a class
entry (`class/drm/card0`, `class/infiniband/mlx5_0`, `class/net/eth0`, `bus/pci/devices/*`),
and in a device directory `device`, `driver`, `subsystem`, `iommu_group`, `firmware_node`,
`physfn`/`virtfn<N>`, `hwmon` class entries (all made by `sysfs_create_link`:
`drivers/base/core.c` `device_add_class_symlinks`, `drivers/base/bus.c`,
`drivers/iommu/iommu.c`, `drivers/pci/iov.c`). Attributes (`product_name`,
`serial_number`, `unique_id`, `gpu_busy_percent`, IB `hca_type`, `ports/1/counters/*`,
hwmon `*_input`) are kernfs regular files, never links: a leaf is opened `O_NOFOLLOW`,
so a link planted there is a field error. The directory a file is read from, links
followed, must resolve under the root (a planted `device` link to `/etc` is refused too);
checked once per directory a cycle.
"""

from __future__ import annotations

import errno
import math
import os
import re
from pathlib import Path

from exporter.ids import pci_address

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
BUFFER_BYTES = 4096
"""One read of at most a page: what a sysfs attribute's show() can return."""

_KEYED_LINE = re.compile(r"^\s*(?P<key>[A-Za-z_]\w*)\s*:\s*(?P<value>[0-9]{1,20})\s*$", re.ASCII)
_INTEGER = re.compile(r"-?[0-9]{1,20}|0[xX][0-9a-fA-F]{1,16}")
_NUMBER = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?")

Bounds = tuple[float, float]
U64: Bounds = (0, 2**64 - 2)
"""What an unsigned 64-bit sysfs attribute can hold, the default for every integer; all ones
(2^64-1) is excluded: it is -1 (a driver's error value) printed with %llu, never a count."""
PERCENT: Bounds = (0, 100)
MILLI_CELSIUS: Bounds = (-273_150, 500_000)
"""hwmon temperatures: above absolute zero, below what any sensor reports before it fails."""
MICROWATTS: Bounds = (0, 10**10)
"""hwmon power: up to 10 kW, more than any one device draws."""
HERTZ: Bounds = (0, 10**11)
MEGAHERTZ: Bounds = (0, 10**5)


class Reader:
    """One cycle's reads under one sysfs root. Paths are relative to the root."""

    def __init__(self, root: Path, seen: set[str]) -> None:
        self.root = root
        self._prefix = os.fspath(root).rstrip("/") + "/"
        self.errors = 0
        self._seen = seen
        self._cache: dict[str, str | None] = {}
        self._dirs: dict[str, bool] = {}
        self._real_root: str | None = None

    def text(self, rel: str) -> str | None:
        """The file's content, stripped; None when absent or unreadable (counted)."""
        if rel in self._cache:
            return self._cache[rel]
        value = self._read(rel)
        self._cache[rel] = value
        return value

    def path(self, rel: str) -> str:
        """`root/rel` as text: a sysfs source reads some 60 files a device a cycle, and
        pathlib's join cost a third of that (an absolute `rel` stays itself, as with /)."""
        return rel if rel.startswith("/") else self._prefix + rel

    def inside(self, directory: str) -> bool:
        """Whether `directory` (links followed) is the root or under it."""
        known = self._dirs.get(directory)
        if known is None:
            if self._real_root is None:
                self._real_root = _resolved(os.fspath(self.root)).rstrip("/") + "/"
            real = _resolved(directory) + "/"
            known = self._dirs[directory] = real.startswith(self._real_root)
        return known

    def _read(self, rel: str) -> str | None:
        path = self.path(rel)
        if not self.inside(os.path.dirname(path)):
            self.errors += 1
            return None
        try:
            # O_NONBLOCK: a read that would block returns EAGAIN instead of hanging a worker;
            # O_NOFOLLOW: an attribute is never a link (see above).
            fd = os.open(path, _FLAGS)
        except FileNotFoundError:
            self._missing(rel)
            return None
        except OSError:
            self.errors += 1
            return None
        try:
            data = os.read(fd, BUFFER_BYTES)
        except OSError as exc:
            # EAGAIN (a driver with nothing to say), EIO, ENODATA (pcie_bw on APUs)...
            if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP) or rel in self._seen:
                self.errors += 1
            return None
        finally:
            os.close(fd)
        try:
            text = data.decode()
        except UnicodeDecodeError:
            self.errors += 1
            return None
        self._seen.add(rel)
        return text.strip()

    def _missing(self, rel: str) -> None:
        if rel in self._seen:
            self.errors += 1  # every cycle it stays away: that field is skipped each time

    def garbage(self) -> None:
        """The caller could not parse what it read: one more skipped field."""
        self.errors += 1

    def integer(self, rel: str, bounds: Bounds = U64) -> int | None:
        """A decimal or 0x-hex integer file within `bounds`; anything else is a field error."""
        text = self.text(rel)
        if text is None:
            return None
        value = parse_integer(text, bounds)
        if value is None:
            self.garbage()
        return value

    def first_integer(self, *alternatives: str, bounds: Bounds = U64) -> int | None:
        """The first of alternative files that exists (kernels name some things differently)."""
        for rel in alternatives:
            if self.exists(rel):
                return self.integer(rel, bounds)
        for rel in alternatives:
            self.text(rel)  # none there: counts one that was there before
        return None

    def number(self, rel: str, bounds: Bounds = U64) -> float | None:
        """A plain decimal file (`1.5`, no exponent, no inf/nan) within `bounds`."""
        text = self.text(rel)
        if text is None:
            return None
        value = parse_number(text, bounds)
        if value is None:
            self.garbage()
        return value

    def keyed(self, rel: str) -> dict[str, int] | None:
        """`key: value` lines (AMD RAS `ue: 0` / `ce: 3`); None when any line is garbage."""
        text = self.text(rel)
        if text is None:
            return None
        values: dict[str, int] = {}
        for line in text.splitlines():
            m = _KEYED_LINE.match(line)
            if not m:
                # e.g. "Query currently inaccessible" while RAS is busy
                self.garbage()
                return None
            count = int(m["value"])
            if count > U64[1]:
                self.garbage()
                return None
            values[m["key"].lower()] = count
        return values or None

    def listdir(self, rel: str) -> list[str]:
        """Sorted entries of a directory; [] when it does not exist."""
        path = self.path(rel)
        if not self.inside(path):
            self.errors += 1
            return []
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError:
            self.errors += 1
            return []

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.path(rel))

    def link_name(self, rel: str) -> str | None:
        """The last component of a symlink's target (a `driver` link -> `amdgpu`)."""
        try:
            return os.path.basename(os.readlink(self.path(rel)))
        except FileNotFoundError:
            return None
        except OSError:
            self.errors += 1
            return None

    def pci_address_of(self, rel: str) -> str | None:
        """Canonical PCI address of the device a `device` link (or a device dir) names."""
        return pci_address(os.path.basename(os.path.realpath(self.path(rel))))


def _resolved(path: str) -> str:
    """`path` with every link resolved, as the kernel resolved it: an `O_PATH` descriptor's
    name in /proc/self/fd (one call, where os.path.realpath makes an lstat per component:
    docs/design-figures.md). A path that does not exist is itself."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc of our own: the slow way
        return os.path.realpath(path)
    finally:
        os.close(fd)


def parse_integer(text: str, bounds: Bounds = U64) -> int | None:
    """`text` as a sysfs integer within `bounds`, or None (never raises)."""
    text = text.strip()
    if not _INTEGER.fullmatch(text):
        return None
    value = int(text, 16) if text[:2] in ("0x", "0X") else int(text)
    return value if bounds[0] <= value <= bounds[1] else None


def numbered(entry: str, prefix: str) -> int | None:
    """N of a directory entry `<prefix>N` (ASCII digits only), else None."""
    digits = entry.removeprefix(prefix)
    if digits == entry or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


def parse_number(text: str, bounds: Bounds = U64) -> float | None:
    """`text` as a plain decimal within `bounds`, or None (never raises)."""
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) and bounds[0] <= value <= bounds[1] else None
