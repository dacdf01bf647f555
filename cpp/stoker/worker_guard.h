// WorkerGuard: a worker process never outlives the process that feeds it.
//
// ArmWorkerGuard() starts one watchdog thread that sleeps in poll() on two descriptors and ends
// the worker (_exit(0), kWorkerExitGraceMs after) when either fires:
//   - the worker's channel: the main process's end was closed (the main process stopped the
//     worker, or died, even where the worker's parent is a fork server), and
//   - a pidfd of `expected_parent` (when > 0): that process exited, whatever it was doing.
// Both work while the worker is busy in a long __getitem__ that never reads its socket. The grace
// lets an idle worker, which sees the same EOF on its channel, exit by itself first: its output
// is flushed and its exit handlers run.
//
// PR_SET_PDEATHSIG is not used: it fires when the *thread* that forked the worker exits, so an
// epoch iterated from a short-lived thread would kill every worker it started. A pidfd follows
// the process.
//
// Threads: call once per worker process, from any thread. The watchdog thread is detached and
// lives as long as the process.
#pragma once

#include <sys/types.h>

#include "stoker/status.h"

namespace stoker {

constexpr int kWorkerExitGraceMs = 300;

// `expected_parent`: the worker's parent process when the worker must die with it (the main
// process under fork and spawn); 0 when the channel alone tells (forkserver). Ends the process
// at once when the parent is already gone.
Status ArmWorkerGuard(int sock, pid_t expected_parent);

}  // namespace stoker
