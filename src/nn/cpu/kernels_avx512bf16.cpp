// tinylm's CPU loops for AVX-512 with AVX512-BF16: the AVX-512 set (kernels_avx512.cpp)
// compiled again with -mavx512bf16 (CMake sets it on this file only), whose bfloat16
// attention products run VDPBF16PS rather than emulating it. Used only where the CPU has
// AVX512-BF16 and the AVX-512 set is in use (cpu::bf16_table()).
#define TINYLM_KERNEL_NS avx512bf16
#define TINYLM_KERNEL_ISA "avx512bf16"
#define TINYLM_KERNEL_WIDTH 16
#define TINYLM_KERNEL_BF16_DOT 1
#include "kernels.inc"

namespace tinylm::nn::cpu {
const KernelTable* avx512bf16_table() { return &avx512bf16::kTable; }
}  // namespace tinylm::nn::cpu
