// CPU threading for LibTorch and OpenBLAS.
#include <tinylm/threads.h>
#include <tinylm/nn/cpu_kernels.h>

#include "internal/machine.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

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
  // OpenBLAS is already loaded (LibTorch links libblas.so.3); look its setter up.
  using SetThreads = void (*)(int);
  auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!set) {
    if (void* lib = dlopen("libblas.so.3", RTLD_NOW | RTLD_NOLOAD)) {
      set = reinterpret_cast<SetThreads>(dlsym(lib, "openblas_set_num_threads"));
    }
  }
  if (!set) return false;
  set(static_cast<int>(n));
  return true;
}

}  // namespace tinylm
