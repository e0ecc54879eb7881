// What the process has: the memory it can still take.
#include <tinylm/train/resources.h>

#include "internal/machine.h"

namespace tinylm::train {

uint64_t available_memory_bytes() { return internal::available_memory_bytes(); }

}  // namespace tinylm::train
