"""The machine under the benchmark: facts to record, and the knobs the harness turns
(block-device readahead, page-cache eviction, memory cgroups). Everything that changes
machine state has an undo that runs on normal exit, on exceptions and on SIGINT/SIGTERM.
"""
from __future__ import annotations

import glob
import hashlib
import os
import platform
import re
import shutil
import signal
import subprocess
import time
from typing import Any

CGROUP_PREFIX = "moestream-bench"


def read(path: str, default: str | None = None) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def meminfo() -> dict[str, int]:
    out = {}
    for line in (read("/proc/meminfo") or "").splitlines():
        k, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[k] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def cpu_times() -> dict[str, int]:
    """Aggregate /proc/stat 'cpu' line in clock ticks."""
    line = (read("/proc/stat") or "").splitlines()[0].split()
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    return {n: int(v) for n, v in zip(names, line[1:9])}


def loadavg() -> list[float]:
    return [float(x) for x in (read("/proc/loadavg") or "0 0 0").split()[:3]]


def block_device_of(path: str) -> dict[str, Any]:
    """The whole-disk block device backing path (partition -> its disk)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sysdev = f"/sys/dev/block/{major}:{minor}"
    info: dict[str, Any] = {"dev": f"{major}:{minor}"}
    if not os.path.exists(sysdev):
        info["error"] = f"{sysdev} missing (device-mapper/overlay/network fs?)"
        return info
    real = os.path.realpath(sysdev)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    info["name"] = os.path.basename(real)
    info["sysfs"] = real
    q = os.path.join(real, "queue")
    info["read_ahead_kb_path"] = os.path.join(q, "read_ahead_kb")
    for k in ("read_ahead_kb", "rotational", "scheduler", "max_sectors_kb", "logical_block_size",
              "nr_requests"):
        info[k] = read(os.path.join(q, k))
    size = read(os.path.join(real, "size"))
    info["size_bytes"] = int(size) * 512 if size else None
    info["model"] = read(os.path.join(real, "device", "model")) or read(os.path.join(real, "device", "vendor"))
    mnt = None
    best = ""
    ap = os.path.realpath(path)
    for line in (read("/proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 4 and ap.startswith(parts[1].rstrip("/") + "/") and len(parts[1]) > len(best):
            best, mnt = parts[1], {"source": parts[0], "mountpoint": parts[1], "fstype": parts[2],
                                   "options": parts[3]}
    info["mount"] = mnt
    return info


def machine_info(model_path: str | None) -> dict[str, Any]:
    cpu_model = None
    flags = ""
    for line in (read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name") and cpu_model is None:
            cpu_model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1]
    mi = meminfo()
    out: dict[str, Any] = {
        "hostname": platform.node(),
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "hypervisor": "hypervisor" in flags.split(),
        "ram_bytes": mi.get("MemTotal"),
        "swap_bytes": mi.get("SwapTotal"),
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "os": read("/etc/debian_version") and f"Debian {read('/etc/debian_version')}",
        "python": platform.python_version(),
    }
    if model_path and os.path.exists(model_path):
        out["disk"] = block_device_of(model_path)
    return out


def sha256_file(path: str, limit: int | None = None) -> str:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
            if limit and n >= limit:
                break
    return h.hexdigest()


def versions(repo: str, moestream_bin: str, llama_tool: str) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
    status = git("status", "--porcelain", "--untracked-files=no") or ""
    out: dict[str, Any] = {
        "moestream_git": git("rev-parse", "HEAD"),
        "moestream_git_describe": git("log", "-1", "--format=%h %s"),
        "moestream_worktree_modified_files": len(status.splitlines()),
        "moestream_bin": moestream_bin,
    }
    if os.path.exists(moestream_bin):
        st = os.stat(moestream_bin)
        out["moestream_bin_sha256"] = sha256_file(moestream_bin)
        out["moestream_bin_mtime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))
    lock = os.path.join(repo, "deps", "debian.lock")
    pk = {}
    try:  # the lock's lines start with their architecture: take this machine's
        host_arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                                   text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        host_arch = ""
    for line in (read(lock) or "").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split()
        if len(parts) < 4 or parts[0] != host_arch:
            continue
        parts = parts[1:]
        if re.match(r"(lib)?(llama|ggml)", parts[0]):
            pk[parts[0]] = {"version": parts[1], "sha256": parts[2]}
    out["debian_llama_packages"] = pk
    try:
        r = subprocess.run([llama_tool, "llama-completion", "--version"], capture_output=True,
                           text=True, timeout=60)
        out["llama_completion_version"] = [l for l in (r.stdout + r.stderr).splitlines()
                                           if "version" in l or "built with" in l][:3]
    except (OSError, subprocess.TimeoutExpired) as e:
        out["llama_completion_version"] = f"error: {e}"
    out["fio"] = (subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
                  if shutil.which("fio") else None)
    return out


def page_cache_resident(path: str) -> int | None:
    """Bytes of path in the page cache (util-linux fincore), None if unknown."""
    if not shutil.which("fincore"):
        return None
    try:
        r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                           capture_output=True, text=True, timeout=120)
        return int(r.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def evict(path: str, drop_all: bool = True) -> dict[str, Any]:
    """Make the next run start cold: evict path from the page cache (posix_fadvise
    DONTNEED, always permitted for clean pages) and, where permitted, drop all clean caches
    (echo 3 > /proc/sys/vm/drop_caches) so that no other cached file helps either."""
    out: dict[str, Any] = {}
    try:
        os.sync()
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            out["fadvise_dontneed"] = "ok"
        finally:
            os.close(fd)
    except OSError as e:
        out["fadvise_dontneed"] = f"error: {e}"
    if drop_all:
        try:
            write("/proc/sys/vm/drop_caches", "3")
            out["drop_caches"] = "ok"
        except OSError as e:
            out["drop_caches"] = f"not permitted: {e.strerror}"
    out["model_page_cache_bytes_after"] = page_cache_resident(path)
    return out


def other_users_of(path: str) -> list[dict[str, Any]]:
    """Other processes whose command line names path (to avoid two 30B jobs at once)."""
    base = os.path.basename(path)
    me = os.getpid()
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(os.path.basename(d))
        if pid == me:
            continue
        try:
            with open(os.path.join(d, "cmdline"), "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if base in cmd and "fincore" not in cmd:
            out.append({"pid": pid, "cmdline": cmd[:300]})
    return out


class Readahead:
    """Set the block device's read_ahead_kb per run; restore the original on exit."""

    def __init__(self, model_path: str):
        self.dev = block_device_of(model_path)
        self.path = self.dev.get("read_ahead_kb_path")
        self.original = int(read(self.path)) if self.path and read(self.path) else None
        self.changed = False

    def current(self) -> int | None:
        v = read(self.path) if self.path else None
        return int(v) if v else None

    def set(self, kb: int | str) -> int | None:
        """kb = 'keep' restores the original value (the machine's own setting)."""
        want = self.original if kb == "keep" else int(kb)
        if want is None or self.path is None:
            return self.current()
        if self.current() != want:
            try:
                write(self.path, str(want))
                self.changed = True
            except OSError as e:
                raise RuntimeError(f"cannot set {self.path} to {want}: {e.strerror} "
                                   "(run as root, or use readahead_kb = \"keep\")") from e
        return self.current()

    def restore(self) -> None:
        if self.changed and self.path and self.original is not None:
            try:
                write(self.path, str(self.original))
            except OSError:
                pass
            self.changed = False


class CgroupError(Exception):
    pass


class MemCgroup:
    """One memory cgroup per run, a child of the harness's own memory cgroup (so that it
    nests under whatever limits already apply). cgroup v1: memory.limit_in_bytes and
    memory.memsw.limit_in_bytes; v2: memory.max and memory.swap.max. The page cache a
    process faults in is charged to its group, so the cap covers page cache too."""

    def __init__(self, name: str, limit: int | None):
        self.name = name
        self.limit = limit
        self.version, self.path = self._make(name)
        self.oom_kill_start = self._oom_kills()
        if limit is not None:
            self._set_limit(limit)

    @staticmethod
    def _own_path() -> tuple[str, str]:
        v1 = v2 = None
        for line in (read("/proc/self/cgroup") or "").splitlines():
            hid, ctrls, p = line.split(":", 2)
            if "memory" in ctrls.split(","):
                v1 = p
            if hid == "0" and ctrls == "":
                v2 = p
        if v1 is not None and os.path.isdir("/sys/fs/cgroup/memory"):
            return "v1", "/sys/fs/cgroup/memory" + v1
        if v2 is not None:
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                ctl = read(os.path.join(root, "cgroup.controllers")) or ""
                if "memory" in ctl.split():
                    return "v2", root + v2
        raise CgroupError("no memory cgroup controller found (cgroup v1 memory hierarchy or "
                          "cgroup v2 with the memory controller)")

    def _make(self, name: str) -> tuple[str, str]:
        version, parent = self._own_path()
        if version == "v2":
            # v2's no-internal-process rule: a child of our own group can only take
            # processes if our group delegates memory to its children.
            sub = read(os.path.join(parent, "cgroup.subtree_control")) or ""
            if "memory" not in sub.split():
                try:
                    write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
                except OSError as e:
                    raise CgroupError(f"cgroup v2: cannot enable the memory controller below "
                                      f"{parent}: {e.strerror}") from e
        path = os.path.join(parent, f"{CGROUP_PREFIX}-{os.getpid()}-{name}")
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as e:
            raise CgroupError(f"cannot create memory cgroup {path}: {e.strerror} (run as root)") from e
        return version, path

    def _set_limit(self, limit: int) -> None:
        try:
            if self.version == "v1":
                write(os.path.join(self.path, "memory.limit_in_bytes"), str(limit))
                memsw = os.path.join(self.path, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    write(memsw, str(limit))
                got = int(read(os.path.join(self.path, "memory.limit_in_bytes")) or 0)
            else:
                write(os.path.join(self.path, "memory.max"), str(limit))
                if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                    write(os.path.join(self.path, "memory.swap.max"), "0")
                got = int(read(os.path.join(self.path, "memory.max")) or 0)
        except OSError as e:
            self.destroy()
            raise CgroupError(f"cannot set the memory cap on {self.path}: {e.strerror}") from e
        if abs(got - limit) > 1 << 20:
            self.destroy()
            raise CgroupError(f"memory cap readback {got} != requested {limit} on {self.path}")

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def _oom_kills(self) -> int:
        if self.version == "v1":
            txt = read(os.path.join(self.path, "memory.oom_control")) or ""
        else:
            txt = read(os.path.join(self.path, "memory.events")) or ""
        m = re.search(r"oom_kill (\d+)", txt)
        return int(m.group(1)) if m else 0

    def usage(self) -> int | None:
        f = "memory.usage_in_bytes" if self.version == "v1" else "memory.current"
        v = read(os.path.join(self.path, f))
        return int(v) if v else None

    def stats(self) -> dict[str, Any]:
        p = self.path
        if self.version == "v1":
            st = {}
            for line in (read(os.path.join(p, "memory.stat")) or "").splitlines():
                k, _, v = line.partition(" ")
                if k in ("cache", "rss", "mapped_file", "pgmajfault", "total_cache", "total_rss"):
                    st[k] = int(v)
            return {
                "cgroup_version": "v1", "path": p, "limit_bytes": self.limit,
                "max_usage_bytes": int(read(os.path.join(p, "memory.max_usage_in_bytes")) or 0),
                "failcnt": int(read(os.path.join(p, "memory.failcnt")) or 0),
                "memsw_failcnt": int(read(os.path.join(p, "memory.memsw.failcnt"), "0") or 0),
                "oom_kills": self._oom_kills() - self.oom_kill_start,
                "stat_at_end": st,
            }
        ev = read(os.path.join(p, "memory.events")) or ""
        return {
            "cgroup_version": "v2", "path": p, "limit_bytes": self.limit,
            "max_usage_bytes": int(read(os.path.join(p, "memory.peak"), "0") or 0),
            "events": dict((l.split()[0], int(l.split()[1])) for l in ev.splitlines() if l.strip()),
            "oom_kills": self._oom_kills() - self.oom_kill_start,
        }

    def destroy(self) -> None:
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                # processes still exiting; v1 moves charged page cache to the parent on rmdir
                time.sleep(0.1)


def cleanup_stale_cgroups() -> None:
    """Remove empty leftover groups from an earlier harness process that was killed."""
    try:
        _, parent = MemCgroup._own_path()
    except CgroupError:
        return
    for d in glob.glob(os.path.join(parent, CGROUP_PREFIX + "-*")):
        m = re.match(rf"{CGROUP_PREFIX}-(\d+)-", os.path.basename(d))
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            try:
                os.rmdir(d)
            except OSError:
                pass


class Restorer:
    """Runs the undo actions on exit, exception, SIGINT, SIGTERM and SIGHUP."""

    def __init__(self) -> None:
        self.actions: list = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Restorer":
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old[sig] = signal.signal(sig, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def add(self, fn) -> None:
        self.actions.append(fn)

    def __exit__(self, *exc: Any) -> None:
        # undo even if another signal arrives while undoing
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for fn in reversed(self.actions):
                try:
                    fn()
                except Exception:  # noqa: BLE001 - best effort, keep undoing
                    pass
        finally:
            signal.signal(signal.SIGINT, old_int)
            for sig, h in self._old.items():
                signal.signal(sig, h)
