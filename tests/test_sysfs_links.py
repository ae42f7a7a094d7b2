"""Nothing is read outside --path.sysfs (issue 25, item 6): a link planted in place of a
leaf attribute, or a directory link pointing out of the root, is a field error, never a
label. sysfs's own links (class entries, `device`) inside the root are followed as before."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.sources.amdgpu import AmdgpuSource
from exporter.sources.rdma import RdmaSource
from exporter.sources.sysfs.reader import Reader
from tests.support import Clock
from tests.support.sysfs_nodes import AMD, AMD_DEV, IB
from tests.sysfs_support import context, make_tree

SECRET = "TOP-SECRET-first-line"


def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "shadow"
    path.parent.mkdir()
    path.write_text(f"{SECRET}\nsecond line\n")
    return path


def plant(link: Path, target: Path) -> None:
    link.unlink()
    os.symlink(target, link)


def everything(result: object) -> str:
    return repr(result)


def test_amdgpu_identity_files_linked_to_a_secret_are_not_read(tmp_path: Path) -> None:
    text = AMD.replace("card: 1", "card: 1\n      unique_id: 00ab\n      product: MI210")
    part = make_tree(tmp_path / "tree", text)
    secret = secret_file(tmp_path)
    dev = part.root / AMD_DEV
    for name in ("product_name", "unique_id", "serial_number"):
        if not (dev / name).exists():
            (dev / name).write_text("x\n")
        plant(dev / name, secret)
    result = AmdgpuSource(context(part, Clock())).collect()
    assert SECRET not in everything(result)
    [reading] = result.readings
    assert reading.device.id == "0000:03:00.0", "no unique_id: the PCI address"
    assert result.field_errors >= 3


def test_infiniband_hca_type_linked_to_a_secret_is_not_read(tmp_path: Path) -> None:
    part = make_tree(tmp_path / "tree", IB.format(state="ACTIVE"))
    secret = secret_file(tmp_path)
    hca_type = part.root / "class" / "infiniband" / "mlx5_4" / "hca_type"
    assert hca_type.exists()
    plant(hca_type, secret)
    result = RdmaSource(context(part, Clock())).collect()
    assert SECRET not in everything(result)
    assert result.readings, "the port is still read"


def test_a_directory_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "devices" / "gpu0").mkdir(parents=True)
    (root / "devices" / "gpu0" / "product_name").write_text("MI210\n")
    (root / "class" / "drm").mkdir(parents=True)
    os.symlink("../../devices/gpu0", root / "class" / "drm" / "card0")  # sysfs's own kind
    secret = secret_file(tmp_path)
    os.symlink(secret.parent, root / "class" / "drm" / "card9")  # out of the root
    (secret.parent / "product_name").write_text(f"{SECRET}\n")
    reader = Reader(root, set())
    assert reader.text("class/drm/card0/product_name") == "MI210"
    assert reader.errors == 0
    assert reader.text("class/drm/card9/product_name") is None
    assert reader.listdir("class/drm/card9") == []
    assert reader.errors == 2


def test_a_root_given_through_a_link_still_reads(tmp_path: Path) -> None:
    """--path.sysfs may itself be a link (a mount path through /var/run, say): the root is
    resolved once, and what lies under it is inside."""
    real = tmp_path / "real"
    (real / "class" / "net" / "eth0").mkdir(parents=True)
    (real / "class" / "net" / "eth0" / "mtu").write_text("1500\n")
    os.symlink(real, tmp_path / "sys")
    reader = Reader(tmp_path / "sys", set())
    assert reader.integer("class/net/eth0/mtu") == 1500
    assert reader.errors == 0
