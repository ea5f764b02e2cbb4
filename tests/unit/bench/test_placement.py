"""Where the benchmarks put the gateway: on the core that takes its ledger disk's
interrupts, read from a /sys tree and /proc/interrupts laid out as Linux lays them out."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from bench import placement

# As a two-core VM with a virtio disk shows it: the disk's request queue (36) on CPU 1.
INTERRUPTS = """\
           CPU0       CPU1
 26:          0         14  IO-APIC   4-edge      ttyS0
 35:          0          1  PCI-MSIX-0000:00:02.0   0-edge      virtio1-config
 36:          3     462812  PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
 39:       2551          0  PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0
LOC:     104512     131946   Local timer interrupts
CAL:     413232     413645   Function call interrupts
"""


def fake_sys(root: Path, path: Path, irqs: list[int]) -> Path:
    """A /sys where the block device holding `path` is a virtio disk on a PCI device
    with these MSI-X interrupts."""
    pci = root / "devices" / "pci0000:00" / "0000:00:02.0"
    disk = pci / "virtio1" / "block" / "vda"
    disk.mkdir(parents=True)
    (pci / "msi_irqs").mkdir()
    for irq in irqs:
        (pci / "msi_irqs" / str(irq)).write_text("msix\n")
    dev = os.stat(path).st_dev
    (root / "dev" / "block").mkdir(parents=True)
    (root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(disk)
    return root


def test_counts_only_the_disks_interrupts_per_core() -> None:
    assert placement.per_cpu_counts(INTERRUPTS, [35, 36]) == [3, 462813]
    assert placement.per_cpu_counts(INTERRUPTS, [39]) == [2551, 0]
    assert placement.per_cpu_counts(INTERRUPTS, [99]) == [0, 0]


def test_one_core_counts_only_when_it_takes_nearly_all() -> None:
    assert placement.dominant_cpu([3, 462813]) == 1
    assert placement.dominant_cpu([5000, 4000]) is None  # spread over the cores (multi-queue)
    assert placement.dominant_cpu([0, 12]) is None  # too few to tell


def test_gateway_goes_where_the_ledger_disks_interrupts_go(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "sys", tmp_path, [35, 36])
    place = placement.choose(tmp_path, {0, 1}, sys_root=root, interrupts=INTERRUPTS)
    assert (place.gateway_cpu, place.load_cpu) == (1, 0)
    assert "vda" in place.reason
    assert placement.describe(placement.report(place, root)) == "gateway on CPU 1, simulator and load on CPU 0"


def test_first_core_when_no_one_core_takes_them(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "sys", tmp_path, [35, 36])
    spread = INTERRUPTS.replace("3     462812", "231000     231812")
    place = placement.choose(tmp_path, {0, 1}, sys_root=root, interrupts=spread)
    assert (place.gateway_cpu, place.load_cpu) == (0, 1)
    assert "no one usable core" in place.reason
    # Nor when the core that takes them is not one this process may use.
    three = placement.choose(tmp_path, {0, 2}, sys_root=root, interrupts=INTERRUPTS)
    assert (three.gateway_cpu, three.load_cpu) == (0, 2)


def test_first_core_when_the_ledger_is_on_no_disk(tmp_path: Path) -> None:
    empty = tmp_path / "sys"
    (empty / "dev" / "block").mkdir(parents=True)  # e.g. a tmpfs: no block device behind it
    place = placement.choose(tmp_path, {0, 1}, sys_root=empty, interrupts=INTERRUPTS)
    assert (place.gateway_cpu, place.load_cpu) == (0, 1)
    assert placement.disk_irqs(tmp_path, empty) is None


def test_a_core_chosen_by_hand_wins_and_must_be_usable(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "sys", tmp_path, [35, 36])
    place = placement.choose(tmp_path, {0, 1}, override=0, sys_root=root, interrupts=INTERRUPTS)
    assert (place.gateway_cpu, place.load_cpu) == (0, 1)
    with pytest.raises(ValueError, match="CPU 5 is not one this process may use"):
        placement.choose(tmp_path, {0, 1}, override=5, sys_root=root, interrupts=INTERRUPTS)
    with pytest.raises(ValueError, match="two cores"):
        placement.choose(tmp_path, {0}, sys_root=root, interrupts=INTERRUPTS)


def test_this_machine_gets_two_different_usable_cores_or_none() -> None:
    args = argparse.Namespace(no_pin=False, gateway_cpu=None)
    place = placement.from_args(args)
    pinning = placement.report(place)
    if place is None:  # no taskset, or a single core: the benchmarks run unpinned and say so
        assert placement.describe(pinning) == "not pinned"
        return
    usable = os.sched_getaffinity(0)
    assert place.gateway_cpu in usable and place.load_cpu in usable and place.gateway_cpu != place.load_cpu
    assert pinning["used"] is True and pinning["why"]
    assert placement.from_args(argparse.Namespace(no_pin=True, gateway_cpu=None)) is None


def test_gateway_cpu_option_takes_only_a_usable_core() -> None:
    usable = min(os.sched_getaffinity(0))
    assert placement.cpu_option(str(usable)) == usable
    for bad in ("99999", "-1", "one"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a CPU this process may use"):
            placement.cpu_option(bad)


def test_unbound_kernel_work_is_steered_to_the_gateways_core_and_put_back(tmp_path: Path) -> None:
    mask = tmp_path / placement.UNBOUND_WORK_MASK
    mask.parent.mkdir(parents=True)
    mask.write_text("3\n")  # both cores, as the kernel starts
    assert placement.steer_unbound_work(1, tmp_path) == "3"
    assert mask.read_text() == "2\n"  # CPU 1 alone, in the kernel's hex mask
    place = placement.Placement(1, 0, "test")
    pinning = placement.report(place, tmp_path)
    assert pinning["unbound_kernel_work_on_gateway_cpu"] is True
    assert placement.describe(pinning).endswith("(and the kernel's unbound work with the gateway)")
    placement.restore_unbound_work("3", tmp_path)
    assert mask.read_text() == "3\n"


def test_unbound_kernel_work_is_left_alone_where_it_cannot_be_moved(tmp_path: Path) -> None:
    assert placement.steer_unbound_work(1, tmp_path) is None  # no such file (a container, an old kernel)
    assert placement.report(placement.Placement(1, 0, "test"), tmp_path)["unbound_kernel_work_on_gateway_cpu"] is False
    placement.restore_unbound_work("3", tmp_path)  # nothing to put back, and no error at exit
