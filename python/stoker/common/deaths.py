"""Naming a worker's death in words a person can act on: the record of one death, and the text
for a signal, an exit code, an out-of-memory kill or a hang (the hang's words are every
placement's: ``describe_hang``). Pure functions (they read the
memory cgroup for an OOM kill's figures); any thread."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass, field

from . import system as _system


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        if _signal.SIGRTMIN <= signum <= _signal.SIGRTMAX:
            return f"SIGRTMIN+{signum - _signal.SIGRTMIN}"
        return f"signal {signum}"


@dataclass
class Death:
    """One worker death, as recorded in a loader's history."""

    worker_id: int
    pid: int | None
    signal: str | None
    exit_code: int | None
    cause: str
    index: object = None  # the dataset index it was loading, when known
    epoch: int = 0
    tasks: list = field(default_factory=list)
    starting: bool = False  # before its first sample

    def __str__(self):
        where = f" while loading dataset index {self.index!r}" if self.index is not None else ""
        if self.starting:
            where = " while starting, before it loaded anything"
        return f"worker {self.worker_id} (pid {self.pid}) {self.cause}{where}"


def trim_stack(stack: str) -> str:
    """Drops the frames below the worker's loop: under fork they are the parent's frames at the
    moment it started the worker, which only confuse."""
    lines = []
    skipping = False
    for line in stack.splitlines():
        if line.startswith("  File "):
            if not skipping:
                lines.append(line)
                skipping = line.rstrip().endswith(" in worker_main")
        else:
            skipping = False
            lines.append(line)
    return "\n".join(lines)


def last_stack(crash_log: str) -> str:
    """The last Python stack faulthandler wrote (at a fatal signal or on request)."""
    text = crash_log.strip()
    if not text:
        return ""
    for marker in ("Fatal Python error", "Thread 0x", "Current thread 0x", "Stack (most recent"):
        pos = text.rfind(marker)
        if pos >= 0:
            # For a fatal error the stack follows the marker; keep the whole last report.
            fatal = text.rfind("Fatal Python error")
            start = fatal if fatal >= 0 and fatal <= pos else pos
            return trim_stack(text[start:])
    return text[-4000:]


def describe_hang(seconds: float, stack: str, *, index=None, stuck=None, where: str = ""):
    """(short cause, explanation) of a worker killed for a hang (``hang_timeout``): it hung for
    `seconds` on `index`, or (`stuck`: the watch's description) never took its queued work;
    `where`: what runs it, in words ("(Ray actor on node 10.0.0.2) "), placed first."""
    at = f" while loading dataset index {index!r}" if index is not None else ""
    if stuck is not None:
        cause = "did not take its queued work and was killed (hang_timeout)"
        text = f"{where}{cause}: {stuck}."
    else:
        cause = f"hung for {seconds:.1f} s and was killed (hang_timeout)"
        text = f"{where}hung for {seconds:.1f} s{at} and was killed (hang_timeout)."
    if stack:
        text += f"\nIts Python stack when it was stopped:\n{stack}"
    text += (
        "\nWhat to do: find what that sample waits on (a network filesystem, a lock, a "
        "subprocess); raise hang_timeout if the sample is legitimately slow."
        if stuck is None else
        "\nWhat to do: a worker that never reads its tasks is usually stopped by a "
        "debugger or a cgroup freezer, or deadlocked on a lock inherited at fork from "
        "another thread of this process: start workers with "
        "multiprocessing_context='forkserver' or 'spawn', or create threads after the "
        "DataLoader's workers."
    )
    return cause, text


def describe(signum, exit_code, core, *, oom, rss, index, crash_log, stderr_tail, hung=None,
             stuck=None):
    """(short cause, full explanation with what to do). The short cause does not name the
    index (``Death.__str__`` and messages add it once); the explanation does."""
    at = f" while loading dataset index {index!r}" if index is not None else ""
    if hung is not None:
        return describe_hang(*hung, index=index, stuck=stuck)
    if signum == _signal.SIGKILL and oom:
        limit, usage = _system.memory_limit_and_usage()
        cause = "was killed by the out-of-memory killer (SIGKILL)"
        text = (
            f"{cause}{at}: memory limit {_system.human_bytes(limit)}, usage now "
            f"{_system.human_bytes(usage)}, the worker's resident size at its last batch "
            f"{_system.human_bytes(rss)}.\nWhat to do: lower num_workers, prefetch_factor or "
            "batch_size, avoid holding many batches, make samples smaller, or raise the memory "
            "limit of the container or job."
        )
        return cause, text
    if signum:
        name = signal_name(signum)
        desc = _signal.strsignal(signum) or name
        cause = f"was killed by signal {name} ({desc})" + (", core dumped" if core else "")
        text = cause + at + "."
        stack = last_stack(crash_log)
        if signum == _signal.SIGKILL:
            text += (
                "\nNo out-of-memory kill was recorded (cgroup and kernel counters did not move), "
                "so something outside the loader sent SIGKILL: a job scheduler, a watchdog, a "
                "person. Check what manages this machine or container."
            )
        elif signum == _signal.SIGTERM:
            text += "\nSomething outside the loader asked it to terminate."
        else:
            if stack:
                text += f"\nIts Python stack at the crash:\n{stack}"
            if signum == _signal.SIGBUS:
                text += (
                    "\nA bus error in a data loader usually means memory that vanished under a "
                    "mapping: a memory-mapped file truncated or on a failed disk, or a full "
                    "/dev/shm used by the dataset itself (stoker's own batches do not use it)."
                )
            text += (
                "\nWhat to do: this is a crash in native code (a decoder or other C extension the "
                "dataset calls). Reproduce it with dataset[index] in a plain Python process; "
                "on_error='skip' quarantines such samples and keeps training."
            )
        return cause, text
    cause = f"exited with code {exit_code}"
    text = cause + at + "."
    tail = "\n".join(stderr_tail.strip().splitlines()[-20:]) if stderr_tail else ""
    if tail:
        text += f"\nIts last lines on stderr:\n{tail}"
    text += (
        "\nWhat to do: a worker exits like this when the dataset or a library calls sys.exit() "
        "or os._exit(); the lines above say where."
    )
    return cause, text
