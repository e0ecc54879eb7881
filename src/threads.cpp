// CPU threading for LibTorch and OpenBLAS.
#include <tinylm/threads.h>
#include <tinylm/nn/cpu_kernels.h>

#include "internal/machine.h"
#include "nn/blas.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

namespace tinylm {

bool set_cpu_threads(int64_t n) {
  if (n <= 0) return false;
  internal::check_thread_count(n);
  at::set_num_threads(static_cast<int>(n));
  return set_blas_threads(nn::tiles_for_large_products() ? 1 : n);
}

bool set_blas_threads(int64_t n) {
  if (n <= 0) return false;
  internal::check_thread_count(n);
  auto set = reinterpret_cast<void (*)(int)>(nn::blas_symbol("openblas_set_num_threads"));
  if (!set) return false;
  set(static_cast<int>(n));
  return true;
}

int64_t blas_threads() {
  auto get = reinterpret_cast<int (*)()>(nn::blas_symbol("openblas_get_num_threads"));
  return get ? get() : 0;
}

}  // namespace tinylm
