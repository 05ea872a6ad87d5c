// Test helper: keeps a stream busy for a while (a kernel that spins on the SM clock).
#pragma once

#include "kiln/runtime.h"

namespace kiln::test {
// Enqueues a one-thread kernel on `stream` that runs for about `ms` milliseconds, then writes `value`
// into the first 4 bytes at `dst` (if dst is not null).
void spin_then_write(const Stream& stream, double ms, void* dst = nullptr, int value = 0);
}  // namespace kiln::test
