"""Runs a command (the extension's pytest run under ASan, tests/sanitize_extension.sh) and
watches it for a hang: `sanitize_watch.py LOG STALL_S -- CMD...`.

GCC 12's libasan (libasan.so.8 of Debian 12) installs no fork handler: a process forked while
another of its parent's threads held one of libasan's own locks (its allocator's, its stack
depot's) inherits the lock held and waits on it forever at its first allocation. LLVM's
compiler-rt fixed that in December 2023 (llvm/llvm-project#75290, "[asan] Install
pthread_atfork": "prevents deadlocks in forked process if parent had more then one running
threads"); GCC 12's copy predates it. Loader workers are such forked processes.

When the command's output stops growing for STALL_S seconds, every process of its session is
examined: its threads' current system calls (/proc/PID/task/TID/syscall: the call and the
user-space program counter) and, when py-spy is installed, its native and Python stacks, all
written to LOG. A hang whose waiting threads make their system call from inside libasan's own
code (its internal mutexes wait in futex or sched_yield there; the glibc functions a program
calls are elsewhere) is that libasan bug: the run is started again (three runs in all). Any
other hang, a stoker bug included, fails the run with the stacks. Exit status: the command's,
or 124. tests/sanitize_fork_stress.py reproduces the deadlock in seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

# x86-64 numbers; restart_syscall: a wait interrupted (by a ptrace stop, py-spy's) goes on as it
FUTEX, SCHED_YIELD, NANOSLEEP, RESTART, CLOCK_NANOSLEEP = 202, 24, 35, 219, 230
WAITS = {FUTEX, SCHED_YIELD, NANOSLEEP, RESTART, CLOCK_NANOSLEEP}
# Runs in all: once in eight CI runs hung so, and each run is independent.
ATTEMPTS = 3


def session_pids(sid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    out.append(int(p))
            except (OSError, ValueError, IndexError):
                pass
    return sorted(out)


def descendants(root: int) -> list[int]:
    """`root`'s children, theirs, and so on (a scenario a test starts in a session of its own
    is one of them)."""
    parent = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    parent[int(p)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in out}
        out |= frontier
    return sorted(out)


def _mappings(pid: int) -> list[tuple[int, int, str]]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and "x" in parts[1]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, parts[5]))
    return out


def waits_in_libasan(pid: int, samples: int = 20, step: float = 0.05) -> list[str]:
    """The threads of `pid` seen waiting in a system call made from libasan's own code (one
    line each: thread, call, program counter); empty when none was."""
    try:
        maps = _mappings(pid)
    except OSError:
        return []
    seen = {}
    for _ in range(samples):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return []
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                    fields = f.read().split()
            except OSError:
                continue
            if len(fields) < 9 or not fields[0].isdigit() or int(fields[0]) not in WAITS:
                continue
            pc = int(fields[-1], 16)
            lib = next((name for lo, hi, name in maps if lo <= pc < hi), "?")
            if "libasan" in os.path.basename(lib):
                seen[tid] = f"thread {tid}: syscall {fields[0]} at pc {fields[-1]} in {lib}"
        time.sleep(step)
    return sorted(seen.values())


def describe(pid: int) -> str:
    lines = []
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        lines.append(f"== pid {pid}: {cmdline[:200]}")
    except OSError:
        return f"== pid {pid}: gone"
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.exists(spy):
        r = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True,
                           text=True, timeout=60)
        lines.append((r.stdout + r.stderr).strip()[:6000])
    return "\n".join(lines)


def run_once(cmd: list[str], log, stall_s: float) -> tuple[int, str | None]:
    """(status, None) when the command ended; (124, "libasan" or "other") when it hung."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    size, last = -1, time.monotonic()
    while proc.poll() is None:
        time.sleep(2)
        now_size = os.fstat(log.fileno()).st_size
        if now_size != size:
            size, last = now_size, time.monotonic()
            continue
        if time.monotonic() - last < stall_s:
            continue
        pids = sorted(set(session_pids(proc.pid)) | set(descendants(proc.pid)))
        report = [f"\nsanitize_watch: no output for {stall_s:.0f} s; the processes:"]
        asan = []
        waits = {p: waits_in_libasan(p) for p in pids}  # before py-spy stops them
        for p in pids:
            report.append(describe(p))
            if waits[p]:
                asan.append(p)
                report += ["  waiting inside libasan itself:"] + [f"    {h}" for h in waits[p]]
        kind = "libasan" if asan else "other"
        where = "hung inside libasan (its fork deadlock)" if asan else "hung elsewhere"
        report.append(f"sanitize_watch: {where}: {asan or pids}")
        log.write(("\n".join(report) + "\n").encode())
        log.flush()
        for p in pids:  # its session, and what it started in sessions of their own
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124, kind
    return proc.returncode, None


def main(argv: list[str]) -> int:
    log_path, stall_s = argv[0], float(argv[1])
    cmd = argv[argv.index("--") + 1:]
    with open(log_path, "ab") as log:
        for attempt in range(1, ATTEMPTS + 1):
            status, hang = run_once(cmd, log, stall_s)
            if hang != "libasan":
                return status
            msg = ("sanitize_watch: the run hung in libasan's fork deadlock (GCC 12's libasan "
                   "has no fork handler; llvm/llvm-project#75290), not in stoker: "
                   + ("running it again\n" if attempt < ATTEMPTS
                      else f"{ATTEMPTS} times in a row: failing\n"))
            log.write(msg.encode())
            log.flush()
            print(msg, end="", file=sys.stderr)
    return 124


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
