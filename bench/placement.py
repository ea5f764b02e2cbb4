"""Which core the gateway (or a peer proxy) runs on, and which the simulator and the
load generator share.

The gateway under test is the only one that writes to disk on every call: its ledger
commits (an fsync) before every upstream call. Each commit's completion is an
interrupt, taken by whichever core the disk's interrupts are routed to. On a machine
that routes them all to one core (a VM with a single-queue virtio disk, say), putting
the simulator and the load generator on that core makes them take the gateway's
interrupts: ~2 per call at c=1, each delaying the simulator's answer and the client's
read, and none of it counted as the gateway's CPU. So the gateway goes on the core
that takes its disk's interrupts, where that cost is its own, and everything else
on another. Where no one core takes them (a multi-queue NVMe disk, a tmpfs), the
gateway goes on the first core.

The same goes for the work the kernel defers from those writes to its unbound
workqueues (ext4 converting the blocks a checkpoint just allocated, for one): left to
the scheduler it lands on either core, so for the run those queues are pointed at the
gateway's core too, where root may (`/sys/devices/virtual/workqueue/cpumask`), and put
back at exit.

The same placement holds for the direct baseline and for the peer proxies, so the
comparison stays like for like.
"""

from __future__ import annotations

import argparse
import atexit
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import can_pin

DOMINANT_SHARE = 0.9  # of the disk's interrupts, for one core to count as the one that takes them
MIN_INTERRUPTS = 100  # fewer than this since boot tells nothing
UNBOUND_WORK_MASK = Path("devices/virtual/workqueue/cpumask")  # under /sys


@dataclass(frozen=True, slots=True)
class Placement:
    gateway_cpu: int
    load_cpu: int
    reason: str


def cpu_option(text: str) -> int:
    """`--gateway-cpu`: a core this process may run on."""
    usable = os.sched_getaffinity(0)
    if not text.isdigit() or int(text) not in usable:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU this process may use ({', '.join(map(str, sorted(usable)))})")
    return int(text)


def gateway_core(place: Placement | None) -> int | None:
    """The core to pin the gateway (or a peer proxy) to; None: not pinned."""
    return None if place is None else place.gateway_cpu


def load_core(place: Placement | None) -> int | None:
    """The core to pin the simulator to; None: not pinned."""
    return None if place is None else place.load_cpu


def join_load_core(place: Placement | None) -> None:
    """Put this process (the load generator) on the simulator's core, and the kernel's
    unbound work on the gateway's until this process exits; unpinned, nothing."""
    if place is None:
        return
    os.sched_setaffinity(0, {place.load_cpu})
    replaced = steer_unbound_work(place.gateway_cpu)
    if replaced is not None:
        atexit.register(restore_unbound_work, replaced)


def steer_unbound_work(cpu: int, sys_root: Path = Path("/sys")) -> str | None:
    """Point the kernel's unbound workqueues at `cpu`. Returns the mask it replaced,
    for `restore_unbound_work`; None where it cannot be changed (not root, no such file,
    a core the kernel refuses)."""
    mask = sys_root / UNBOUND_WORK_MASK
    try:
        replaced = mask.read_text().strip()
        mask.write_text(f"{1 << cpu:x}\n")
    except OSError:
        return None
    return replaced


def restore_unbound_work(mask: str, sys_root: Path = Path("/sys")) -> None:
    try:
        (sys_root / UNBOUND_WORK_MASK).write_text(mask + "\n")
    except OSError:
        pass  # at exit, with nothing left to tell; the next run's steering replaces it anyway


def report(place: Placement | None, sys_root: Path = Path("/sys")) -> dict[str, Any]:
    """The run's `pinning`, for its JSON."""
    if place is None:
        return {"used": False, "gateway_cpu": None, "simulator_and_loadgen_cpu": None, "why": None,
                "unbound_kernel_work_on_gateway_cpu": False}
    return {"used": True, "gateway_cpu": place.gateway_cpu, "simulator_and_loadgen_cpu": place.load_cpu, "why": place.reason,
            "unbound_kernel_work_on_gateway_cpu": os.access(sys_root / UNBOUND_WORK_MASK, os.W_OK)}


def describe(pinning: dict[str, Any]) -> str:
    """A run's `pinning` in a few words, for its printed report."""
    if not pinning["used"]:
        return "not pinned"
    where = f"gateway on CPU {pinning['gateway_cpu']}, simulator and load on CPU {pinning['simulator_and_loadgen_cpu']}"
    return where + (" (and the kernel's unbound work with the gateway)" if pinning.get("unbound_kernel_work_on_gateway_cpu") else "")


def from_args(args: argparse.Namespace) -> Placement | None:
    """The placement for a benchmark's run, from `--no-pin` and `--gateway-cpu`; None when
    its processes are not pinned (asked not to, or no `taskset`, or fewer than two cores).
    The ledger is in a folder under the temporary directory (`gwstack.workspace`)."""
    if args.no_pin or not can_pin():
        return None
    return choose(Path(tempfile.gettempdir()), os.sched_getaffinity(0), args.gateway_cpu)


def choose(path: Path, cpus: set[int], override: int | None = None, sys_root: Path = Path("/sys"),
           interrupts: str | None = None) -> Placement:
    """The placement on `cpus` (at least two) for a gateway whose ledger lives under `path`.
    `override`: the gateway's core, chosen by hand."""
    if len(cpus) < 2:
        raise ValueError("placing the gateway apart from its load takes two cores")
    if override is not None:
        if override not in cpus:
            raise ValueError(f"CPU {override} is not one this process may use ({sorted(cpus)})")
        return _apart(override, cpus, "chosen with --gateway-cpu")
    disk = disk_irqs(path, sys_root)
    if disk is None:
        return _apart(min(cpus), cpus, f"no disk with its own interrupts holds {path}: the first core")
    name, irqs = disk
    text = interrupts if interrupts is not None else Path("/proc/interrupts").read_text()
    cpu = dominant_cpu(per_cpu_counts(text, irqs))
    if cpu is None or cpu not in cpus:
        return _apart(min(cpus), cpus, f"no one usable core takes {name}'s interrupts: the first core")
    return _apart(cpu, cpus, f"the core that takes the interrupts of {name}, where the ledger is")


def _apart(gateway: int, cpus: set[int], reason: str) -> Placement:
    return Placement(gateway, min(cpus - {gateway}), reason)


def disk_irqs(path: Path, sys_root: Path = Path("/sys")) -> tuple[str, list[int]] | None:
    """The block device holding `path` and the interrupts (MSI/MSI-X) of the device it
    sits on; None for a filesystem without one (tmpfs, overlay) or a device without MSI."""
    dev = os.stat(path).st_dev
    node = sys_root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
    if not node.exists():
        return None
    device = node.resolve()
    for parent in (device, *device.parents):
        msi = parent / "msi_irqs"
        if msi.is_dir():
            irqs = sorted(int(entry.name) for entry in msi.iterdir() if entry.name.isdigit())
            return (device.name, irqs) if irqs else None
        if parent == sys_root:
            break
    return None


def per_cpu_counts(interrupts: str, irqs: list[int]) -> list[int]:
    """Per core, how many of these interrupts it has taken since boot (/proc/interrupts)."""
    lines = interrupts.splitlines()
    cpus = len(lines[0].split()) if lines else 0
    totals = [0] * cpus
    wanted = {f"{irq}:" for irq in irqs}
    for line in lines[1:]:
        fields = line.split()
        if fields and fields[0] in wanted:
            for cpu, count in enumerate(fields[1 : cpus + 1]):
                if count.isdigit():
                    totals[cpu] += int(count)
    return totals


def dominant_cpu(counts: list[int]) -> int | None:
    """The core that took nearly all of them, if one did."""
    total = sum(counts)
    if total < MIN_INTERRUPTS:
        return None
    cpu = max(range(len(counts)), key=counts.__getitem__)
    return cpu if counts[cpu] >= DOMINANT_SHARE * total else None
