// tinylm's CPU loops for the target's baseline instruction set (any CPU it builds for).
#define TINYLM_KERNEL_NS generic
#define TINYLM_KERNEL_ISA "generic"
#define TINYLM_KERNEL_WIDTH 4
#include "kernels.inc"
#include "tinylm_kernels_config.h"

namespace tinylm::nn::cpu {

const KernelTable& generic_table() { return generic::kTable; }

#ifndef TINYLM_HAVE_AVX2_KERNELS  // kernels_avx2.cpp is not built for this target
const KernelTable* avx2_table() { return nullptr; }
#endif
#ifndef TINYLM_HAVE_AVX512_KERNELS  // nor kernels_avx512.cpp
const KernelTable* avx512_table() { return nullptr; }
#endif

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's answer includes the OS's: AVX-512 counts only where XCR0 enables its state.
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

}  // namespace tinylm::nn::cpu
