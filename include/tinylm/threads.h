// CPU threading: LibTorch's intra-op pool and the BLAS library's own pool.
#pragma once

#include <cstdint>

namespace tinylm {

/// Sets LibTorch's intra-op threads and, where LibTorch calls OpenBLAS (Debian's
/// libblas.so.3 from libopenblas0-pthread), OpenBLAS's own thread count to n. LibTorch
/// 1.13 does not pass its setting on to OpenBLAS, whose pool otherwise uses every core:
/// on small matrices that costs more than it gains. One exception: where tinylm's large
/// products run libxsmm's tiles on LibTorch's threads (nn::tiles_for_large_products()),
/// OpenBLAS keeps one thread, as its idle workers spin on the cores LibTorch's threads
/// need (P2 at 2 threads: 5,645 tokens/s with both pools at 2, 8,721 with OpenBLAS at 1).
/// n <= 0 leaves both as they are. Returns whether a BLAS thread setting was applied.
bool set_cpu_threads(int64_t n);

/// OpenBLAS's own thread count alone (benchmarks measuring its peak). Returns false where
/// the BLAS is not OpenBLAS or n <= 0.
bool set_blas_threads(int64_t n);

/// OpenBLAS's thread count now; 0 where the BLAS is not OpenBLAS.
int64_t blas_threads();

}  // namespace tinylm
