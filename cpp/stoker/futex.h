// Futex waits and wakes on a 32-bit word in memory shared between processes.
//
// The operations are the non-private ones (no FUTEX_PRIVATE_FLAG): the word lives in a
// MAP_SHARED mapping that another process maps at a different address. std::atomic::wait is
// process-private in libstdc++ and cannot be used here. Every wait has a timeout.
#pragma once

#include <cstdint>

#include "stoker/status.h"

namespace stoker {

// Sleeps while *word == expected, at most timeout_ms. Returns OK when woken or when the value
// differs already, kTimeout when the time ran out, kInterrupted on a signal.
Status FutexWait(const uint32_t* word, uint32_t expected, int timeout_ms);

// Wakes up to `count` waiters on word.
void FutexWake(const uint32_t* word, int count);

}  // namespace stoker
