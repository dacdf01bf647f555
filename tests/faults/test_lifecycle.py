"""Clean exits: Ctrl+C, a killed parent, low limits, and many create/destroy cycles leave
nothing behind."""

from __future__ import annotations

import os
import signal
import time

from conftest import start_running_loader

from .test_worker_deaths import SETUP


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_gives_one_keyboard_interrupt_and_silent_workers():
    proc, pids = start_running_loader()
    try:
        time.sleep(0.3)
        t = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # the whole process group, as a terminal does
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert took < 2.0, took
    assert err.count("KeyboardInterrupt") == 1, err
    assert err.count("Traceback") == 1, err
    time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], pids


def test_parent_killed_takes_workers_within_a_second():
    for method in ("fork", "spawn"):
        proc, pids = start_running_loader(method)
        try:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and [p for p in pids if _alive(p)]:
                time.sleep(0.02)
            assert not [p for p in pids if _alive(p)], (method, pids)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def test_low_fd_limit_with_many_held_batches(script):
    r = script("""
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
""" + SETUP + """
loader = stoker.DataLoader(Squares(400, shape=(1024,)), batch_size=4, num_workers=4)
held = list(loader)
assert len(held) == 100 and labels(held) == list(range(400))
assert len(os.listdir('/proc/self/fd')) < 64
print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_create_iterate_destroy_cycles_leak_nothing(script):
    r = script(SETUP + """
import gc, threading
def fds(): return len(os.listdir('/proc/self/fd'))
def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
def maps(): return sum(1 for _ in open('/proc/self/maps'))
ds = Squares(16, shape=(64, 64))
def cycle():
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2)
    for b in loader:
        pass
for _ in range(10):
    cycle()
gc.collect()
start = (fds(), threading.active_count(), maps(), rss())
for i in range(500):
    cycle()
gc.collect()
end = (fds(), threading.active_count(), maps(), rss())
assert end[:3] == start[:3], (start, end)
assert end[3] - start[3] < 64 * 2**20, (start, end)
assert not children(), children()
print("OK", start, end)
""", timeout=600)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_spawn_with_an_unpicklable_dataset_names_the_attribute(script):
    r = script(SETUP + """
import threading
class Holder(Squares):
    pass
ds = Holder(8)
ds.lock = threading.Lock()
try:
    list(stoker.DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn"))
except Exception as e:
    msg = str(e)
    assert "dataset.lock" in msg and "lock" in msg, msg
    print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_fork_with_cuda_initialised_switches_to_forkserver(script):
    r = script(SETUP + """
import warnings
torch.cuda.is_initialized = lambda: True   # as after model.cuda() in a real job
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    it = iter(stoker.DataLoader(Squares(8), batch_size=2, num_workers=1,
                                multiprocessing_context="fork"))
    assert labels(list(it)) == list(range(8))
msgs = [str(x.message) for x in w if "forkserver" in str(x.message)]
assert len(msgs) == 1 and "CUDA" in msgs[0], [str(x.message) for x in w]
assert it.workers.start_method == "forkserver"
print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_workers_ignore_sigint_and_close_inherited_descriptors(script):
    r = script(SETUP + """
loader = stoker.DataLoader(Slow(64), batch_size=2, num_workers=2)
it = iter(loader)
next(it)
mine = set(it.workers.owned_fds())
for p in it._workers:
    status = open(f'/proc/{p.pid}/status').read()
    ign = int([l for l in status.splitlines() if l.startswith('SigIgn')][0].split()[1], 16)
    assert ign & (1 << (signal.SIGINT - 1)), hex(ign)
    theirs = {os.readlink(f'/proc/{p.pid}/fd/{fd}') for fd in os.listdir(f'/proc/{p.pid}/fd')}
    sockets = [t for t in theirs if t.startswith('socket:')]
    assert len(sockets) == 1, theirs           # its own channel end, nobody else's
    assert not any('eventpoll' in t for t in theirs), theirs
    # One pidfd: the worker guard's, of the main process (none of the supervisor's).
    assert sum('pidfd' in t for t in theirs) == 1, theirs
print("OK")
""", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr


def test_worker_that_cannot_start_is_reported_once_not_restarted(script):
    r = script(SETUP + """
class DefinedInMain(Squares):   # spawn cannot find __main__.DefinedInMain in the worker
    pass
try:
    list(stoker.DataLoader(DefinedInMain(8), batch_size=2, num_workers=2,
                           multiprocessing_context="spawn"))
except stoker.WorkerCrashed as e:
    msg = str(e)
    assert "while starting" in msg and "__main__" in msg, msg
    print("OK")
""", timeout=120)
    assert "OK" in r.stdout, r.stdout + r.stderr
    assert "restarted it" not in r.stderr, r.stderr
