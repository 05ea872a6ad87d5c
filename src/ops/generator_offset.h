// Taking (seed, offset) for one random op call, shared by the ops that draw random numbers outside
// random.cpp (sample). Defined in random.cpp, next to the default generator's lock.
#pragma once

#include <cstdint>
#include <utility>

#include "kiln/ops.h"

namespace kiln {
// gen's (seed, next_offset()), or the default generator's, taken under its lock, when gen is null.
std::pair<uint64_t, uint64_t> take_generator_offset(Generator* gen);
}  // namespace kiln
