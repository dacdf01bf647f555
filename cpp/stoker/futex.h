// Futex wakes on a 32-bit word in memory shared between processes.
//
// The operation is the non-private one (no FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED
// mapping that another process maps at a different address, where a waiter (FUTEX_WAIT, also
// non-private, always with a timeout) may sleep on it. std::atomic::wait is process-private in
// libstdc++ and cannot be used for that. A worker waits on a slot only under max_shared_memory,
// when its pool may not grow (SlotPool::Acquire); the main process only wakes.
//
// Threads: safe for concurrent use from any thread.
#pragma once

#include <cstdint>

#include "stoker/status.h"

namespace stoker {

// Sleeps while *word == expected, at most timeout_ms. OK when woken or when the value already
// differed; kTimeout; kInterrupted on a signal.
Status FutexWait(const uint32_t* word, uint32_t expected, int timeout_ms);

// Wakes up to `count` waiters on word.
void FutexWake(const uint32_t* word, int count);

}  // namespace stoker
