// tinylm's CPU loops for AVX2 + FMA: compiled with -mavx2 -mfma (CMake sets them on this
// file only) and used only where the CPU has both (see cpu_kernels.cpp).
#define TINYLM_KERNEL_NS avx2
#define TINYLM_KERNEL_ISA "avx2"
#define TINYLM_KERNEL_WIDTH 8
#include "kernels.inc"

namespace tinylm::nn::cpu {
const KernelTable* avx2_table() { return &avx2::kTable; }
}  // namespace tinylm::nn::cpu
