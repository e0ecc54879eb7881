// CPU threading: LibTorch's intra-op pool and the BLAS library's own pool.
#pragma once

#include <cstdint>

namespace tinylm {

/// Sets LibTorch's intra-op threads and, where LibTorch calls OpenBLAS (Debian's
/// libblas.so.3 from libopenblas0-pthread), OpenBLAS's own thread count to n. LibTorch
/// 1.13 does not pass its setting on to OpenBLAS, whose pool otherwise uses every core:
/// on small matrices that costs more than it gains. n <= 0 leaves both as they are.
/// Returns whether a BLAS thread setting was found and applied.
bool set_cpu_threads(int64_t n);

}  // namespace tinylm
