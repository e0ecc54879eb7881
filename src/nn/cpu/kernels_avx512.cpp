// tinylm's CPU loops for AVX-512 (F, DQ, VL, BW) + FMA: compiled with those flags (CMake
// sets them on this file only) and used only where the CPU and the OS run them (see
// cpu_kernels.cpp). 16 floats per vector: twice AVX2's on a CPU that executes 512-bit
// operations at full width.
#define TINYLM_KERNEL_NS avx512
#define TINYLM_KERNEL_ISA "avx512"
#define TINYLM_KERNEL_WIDTH 16
#include "kernels.inc"

namespace tinylm::nn::cpu {
const KernelTable* avx512_table() { return &avx512::kTable; }
}  // namespace tinylm::nn::cpu
