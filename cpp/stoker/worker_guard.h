// WorkerGuard: a worker process never outlives the process that feeds it.
//
// Arm() sets PR_SET_PDEATHSIG(SIGKILL) and then checks that the parent is still the expected one
// (it may have died between fork and prctl). It also starts one watchdog thread that sleeps in
// poll() on the worker's channel and ends the process when the main process's end is closed:
// that covers a main process killed with SIGKILL even where the worker's parent is not the main
// process (forkserver), and a worker busy in a long __getitem__ that would not read its socket.
#pragma once

#include <sys/types.h>

#include "stoker/status.h"

namespace stoker {

Status ArmWorkerGuard(int sock, pid_t expected_parent);

}  // namespace stoker
