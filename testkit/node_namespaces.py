"""A node's own namespaces on this machine, for testkit.container_node: a holder process whose
init (the static pause binary) holds a mount, network, pid and cgroup namespace; a veth pair to
the host; cgroups of its own. When the holder dies the kernel kills every process of its pid
namespace (containerd, the shims, the containers, the kubelet), the mounts and the network
namespace go with their last process, and the veth with its namespace; `NodeNamespaces.stop`
then removes the node's (empty) cgroups. Nothing is left on the host.

Inside the mount namespace (propagation private, so nothing reaches the host):
- a sysfs of the node's network namespace at /sys, and the machine's cgroup hierarchies mounted
  again at /sys/fs/cgroup, each rooted (by the cgroup namespace) at the node's own cgroup;
- DIR/var-lib over /var/lib, DIR/var-log over /var/log, DIR/run over /run;
- files holding the values the kubelet wants over the six sysctls it would otherwise rewrite (as
  the kubelet peer's own private mounts do, peers/cmd/kubelet).
Inside the network namespace: lo up, eth0 (10.213.N.2/30) with a default route through the host
side prw-hN (10.213.N.1/30), net.ipv4.ip_forward=1 (the node's own; the host's is untouched).

Processes enter with `entered(argv)`: `setpriv --pdeathsig KILL` (they die with the test
process), a shell that moves itself into the node's cgroups, then `nsenter` into the four
namespaces. nsenter forks to enter a pid namespace: the program is nsenter's child, so a signal
for it goes to `child_pid(nsenter)`, and nsenter exits with the program's status.

cgroup v1 hosts (and v1 with the unified hierarchy beside it, as this project's machines are);
a pure cgroup v2 host is not handled (the node's processes would sit beside its containers'
cgroups, which v2 forbids).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import shlex
import signal
import subprocess
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from testkit.waiting import wait_until

__all__ = [
    "KUBELET_SYSCTLS",
    "NodeNamespaces",
    "child_pid",
    "free_node_index",
    "host_ip",
    "node_ip",
    "pod_cidr",
]

# The sysctls the kubelet's container manager rewrites, with the values it wants (upstream's
# constants, as peers/cmd/kubelet/config.go kernelTunables lists them).
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
START_TIMEOUT_S = 30.0
GONE_TIMEOUT_S = 15.0
_taken: set[int] = set()  # indexes this process handed out (two nodes of one session)


def host_ip(index: int) -> str:
    """The host side of node `index`'s veth: where the API server and test receivers listen."""
    return f"10.213.{index}.1"


def node_ip(index: int) -> str:
    """The node side of its veth (eth0 in the node): the Node's InternalIP, the kubelet's server."""
    return f"10.213.{index}.2"


def pod_cidr(index: int) -> str:
    """The node's pod network (its CNI bridge and host-local range), only inside the node."""
    return f"10.214.{index}.0/24"


def _used_indexes() -> set[int]:
    """Indexes the host's interfaces already use: a prw-hN name or an address in 10.213.N.0/24."""
    used = set(_taken)
    out = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    block = ipaddress.ip_network("10.213.0.0/16")
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "inet":
            address = ipaddress.ip_interface(fields[3]).ip
            if address in block:
                used.add(address.packed[2])
    for name in os.listdir("/sys/class/net"):
        if name.startswith("prw-h") and name[5:].isdigit():
            used.add(int(name[5:]))
    return used


def free_node_index() -> int:
    """A node index (1..250) no host interface uses yet, reserved for this process."""
    used = _used_indexes()
    for index in range(1, 251):
        if index not in used:
            _taken.add(index)
            return index
    raise RuntimeError("every node index 1..250 is in use on this host")


def child_pid(pid: int) -> int | None:
    """The one child of process `pid` (nsenter's program), or None if it has none (yet)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


@dataclass(frozen=True)
class _Hierarchy:
    mount_point: str
    fstype: str  # cgroup or cgroup2
    options: str  # the super options naming its controllers (cgroup v1)
    node_dir: Path  # the node's cgroup in it, on the host


def _hierarchies(label: str) -> list[_Hierarchy]:
    """The machine's cgroup hierarchies and, in each, the node's cgroup: a child of this process's
    own cgroup there (so the limits this process lives under hold for the node too)."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        mount_point = left.split()[4]
        fstype, _source, super_options = right.split()[:3]
        if fstype not in ("cgroup", "cgroup2") or not mount_point.startswith("/sys/fs/cgroup"):
            continue
        if fstype == "cgroup2":
            key = ""
        else:
            # The hierarchy whose controllers (cpu,cpuacct or name=systemd in /proc/self/cgroup)
            # are among the mount's super options; those names are what mounting it again takes.
            options = set(super_options.split(","))
            key = next((k for k in own if k and set(k.split(",")) <= options), "")
            if not key:
                continue
        base = own.get(key, "/")
        found.append(_Hierarchy(mount_point, fstype, key, Path(mount_point + base.rstrip("/")) / label))
    return found


class NodeNamespaces:
    """The holder of node `index`'s namespaces, its directory `directory` (see the module doc)."""

    def __init__(self, directory: Path, index: int, pause: Path) -> None:
        self.directory = directory
        self.index = index
        self.pause = pause
        self.label = f"prw-node-{index}"
        self.host_link = f"prw-h{index}"
        self.hierarchies = _hierarchies(self.label)
        self.process: asyncio.subprocess.Process | None = None
        self.pid = 0  # the holder's init (pid 1 inside), as the host sees it
        self.mount_namespace = ""  # its /proc/PID/ns/mnt link, e.g. mnt:[4026532301]

    # -- the pieces --

    def _cgroup_procs(self) -> list[str]:
        return [str(h.node_dir / "cgroup.procs") for h in self.hierarchies]

    def _make_cgroups(self) -> None:
        for h in self.hierarchies:
            h.node_dir.mkdir(exist_ok=True)
            if "cpuset" in h.options.split(","):
                # A new cpuset has no CPUs or memory nodes: a task cannot join it until they are set.
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (h.node_dir / name).write_text((h.node_dir.parent / name).read_text())

    def _holder_script(self) -> str:
        d = self.directory
        lines = ["set -eu", "mount -t sysfs sysfs /sys"]
        if any(h.mount_point == "/sys/fs/cgroup" for h in self.hierarchies):
            lines.append("mount -t cgroup2 cgroup2 /sys/fs/cgroup")
        else:
            lines.append("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup")
            for h in self.hierarchies:
                target = shlex.quote(h.mount_point)
                lines.append(f"mkdir -p {target}")
                if h.fstype == "cgroup2":
                    lines.append(f"mount -t cgroup2 cgroup2 {target}")
                else:
                    # A named hierarchy alone (name=systemd) needs "none": no controllers.
                    named = all(o.startswith("name=") for o in h.options.split(","))
                    options = f"none,{h.options}" if named else h.options
                    lines.append(f"mount -t cgroup -o {shlex.quote(options)} cgroup {target}")
        for source, target in ((d / "var-lib", "/var/lib"), (d / "var-log", "/var/log"), (d / "run", "/run")):
            lines.append(f"mount --bind {shlex.quote(str(source))} {target}")
        for name in KUBELET_SYSCTLS:
            file = d / "sysctl" / name.replace("/", ".")
            lines.append(f"mount --bind {shlex.quote(str(file))} /proc/sys/{name}")
        lines += [
            "ip link set lo up",
            "echo 1 > /proc/sys/net/ipv4/ip_forward",
            "echo holder ready",
            f"exec {shlex.quote(str(self.pause))}",
        ]
        return "\n".join(lines)

    def entered(self, argv: list[str], *, fork_pid: bool = True) -> list[str]:
        """`argv` run in the node's namespaces and cgroups, dying with this process."""
        join = "; ".join(f"echo $$ > {shlex.quote(p)}" for p in self._cgroup_procs())
        enter = ["nsenter", "--target", str(self.pid), "--mount", "--net", "--cgroup"]
        if fork_pid:
            enter.append("--pid")
        return [
            "setpriv",
            "--pdeathsig",
            "KILL",
            "--",
            "sh",
            "-c",
            f'{join}; exec "$@"',
            "sh",
            *enter,
            "--",
            *argv,
        ]

    # -- start and stop --

    async def start(self) -> None:
        """The holder, its mounts and its network; returns once the node side is configured."""
        d = self.directory
        for sub in ("var-lib", "var-log", "run", "sysctl"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for name, value in KUBELET_SYSCTLS.items():
            (d / "sysctl" / name.replace("/", ".")).write_text(f"{value}\n")
        self._sweep()
        self._make_cgroups()
        join = "; ".join(f"echo $$ > {shlex.quote(p)}" for p in self._cgroup_procs())
        unshare = ["unshare", "--cgroup", "--pid", "--fork", "--mount-proc", "--mount", "--net"]
        unshare += ["--propagation", "private", "--kill-child", "--", "sh", "-c", self._holder_script()]
        argv = ["setpriv", "--pdeathsig", "KILL", "--", "sh", "-c", f'{join}; exec "$@"', "sh", *unshare]
        with (d / "holder.log").open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log
            )
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line.strip() != b"holder ready":
            tail = (d / "holder.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the node's namespaces were not set up; holder.log ends:\n{tail}")
        init = child_pid(self.process.pid)
        assert init is not None, "unshare has no child although it printed ready"
        self.pid = init
        self.mount_namespace = os.readlink(f"/proc/{init}/ns/mnt")
        await self._network()

    async def _network(self) -> None:
        host, node = host_ip(self.index), node_ip(self.index)
        steps = [
            [
                "ip",
                "link",
                "add",
                self.host_link,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                str(self.pid),
            ],
            ["ip", "addr", "add", f"{host}/30", "dev", self.host_link],
            ["ip", "link", "set", self.host_link, "up"],
        ]
        inside = [
            ["ip", "addr", "add", f"{node}/30", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["ip", "route", "add", "default", "via", host],
        ]
        steps += [["nsenter", "--target", str(self.pid), "--net", "--", *step] for step in inside]
        for step in steps:
            await self.run(step)

    async def run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `argv` (off the event loop) as given; `check`: a failure raises with its stderr."""
        result = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self) -> None:
        """Kill the holder's init (the kernel then kills everything in the pid namespace), wait for
        the veth to go, remove the node's cgroups. Idempotent."""
        if self.process is not None:
            if self.process.returncode is None and self.pid:
                with suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                try:
                    await asyncio.wait_for(self.process.wait(), GONE_TIMEOUT_S)
                except TimeoutError:
                    self.process.kill()
                    await self.process.wait()
            self.process = None

        # A network namespace is torn down by a kernel worker after its last process: the host
        # side of the veth goes a moment later.
        async def link_gone() -> bool:
            return not Path(f"/sys/class/net/{self.host_link}").exists()

        await wait_until(link_gone, GONE_TIMEOUT_S, interval=0.05, what=f"{self.host_link} gone")
        await wait_until(
            self._remove_cgroups, GONE_TIMEOUT_S, interval=0.1, what=f"{self.label} cgroups removed"
        )

    def _remove_cgroups(self) -> bool:
        """rmdir the node's cgroups, deepest first; False while one still has (exiting) tasks."""
        return all(_remove_tree(h.node_dir) for h in self.hierarchies)

    def _sweep(self) -> None:
        """Remove the empty cgroups of nodes whose test process was killed outright (their
        processes died with it, but nothing was left to rmdir the cgroups): any prw-node-N
        without its prw-hN interface. One that still holds a task is left alone."""
        for h in self.hierarchies:
            for stale in h.node_dir.parent.glob("prw-node-*"):
                number = stale.name.removeprefix("prw-node-")
                if number.isdigit() and not Path(f"/sys/class/net/prw-h{number}").exists():
                    _remove_tree(stale)


def _remove_tree(top: Path) -> bool:
    """rmdir a cgroup and its children, deepest first; False if one still has tasks (EBUSY)."""
    if not top.exists():
        return True
    dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for path in [*dirs, top]:
        try:
            path.rmdir()
        except OSError as error:
            if error.errno == errno.ENOENT:
                continue
            if error.errno == errno.EBUSY:
                return False
            raise
    return True
