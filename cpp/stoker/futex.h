// Futex wakes on a 32-bit word in memory shared between processes.
//
// The operation is the non-private one (no FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED
// mapping that another process maps at a different address, where a waiter (FUTEX_WAIT, also
// non-private, always with a timeout) may sleep on it. std::atomic::wait is process-private in
// libstdc++ and cannot be used for that. The engine itself never waits on a slot (a worker
// grows its pool instead), so only the wake lives here.
//
// Threads: safe for concurrent use from any thread.
#pragma once

#include <cstdint>

namespace stoker {

// Wakes up to `count` waiters on word.
void FutexWake(const uint32_t* word, int count);

}  // namespace stoker
