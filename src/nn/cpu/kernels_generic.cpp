// tinylm's CPU loops for the target's baseline instruction set (any CPU it builds for).
#define TINYLM_KERNEL_NS generic
#define TINYLM_KERNEL_ISA "generic"
#define TINYLM_KERNEL_WIDTH 4
#include "kernels.inc"
#include "tinylm_kernels_config.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tinylm::nn::cpu {

const KernelTable& generic_table() { return generic::kTable; }

#ifndef TINYLM_HAVE_AVX2_KERNELS  // kernels_avx2.cpp is not built for this target
const KernelTable* avx2_table() { return nullptr; }
#endif
#ifndef TINYLM_HAVE_AVX512_KERNELS  // nor kernels_avx512.cpp
const KernelTable* avx512_table() { return nullptr; }
#endif
#ifndef TINYLM_HAVE_AVX512BF16_KERNELS  // nor kernels_avx512bf16.cpp
const KernelTable* avx512bf16_table() { return nullptr; }
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

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  // CPUID leaf 7 subleaf 1, EAX bit 5 (libgcc 12 has no name for it); its state is
  // AVX-512's, which cpu_has_avx512 checks the OS enables.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1u;
#else
  return false;
#endif
}

}  // namespace tinylm::nn::cpu
