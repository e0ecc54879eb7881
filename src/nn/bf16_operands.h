// bfloat16 operands of the CPU products (KernelPolicy::bf16_products): the rounding passes
// that Linear layers, the fc-GELU-proj op (linear.cpp) and the fused TransformerLM loss
// (fused_transformer_lm.cpp) share. Every rounding is round_to_bf16's (to nearest, ties to
// even); the sums stay float32.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>

namespace tinylm::nn {

/// A kBFloat16 tensor's data as the bits gemm_bf16 takes.
uint16_t* bits(const torch::Tensor& t);

/// x (float32) as bfloat16, contiguous, in a kBFloat16 tensor; on CUDA LibTorch's
/// conversion, which rounds to nearest even too.
torch::Tensor rounded(const torch::Tensor& x);

/// A weight's bfloat16 copy, made when first asked for and again only once the weight has
/// changed (its version counter moved): once per optimizer step in training.
torch::Tensor rounded_weight(const torch::Tensor& w);

/// Whether a bfloat16 copy of w is kept (a product has used one since w was made), current
/// or not: what an optimizer asks before providing the next.
bool keeps_rounded_weight(const torch::Tensor& w);

/// `copy` (w rounded as rounded() rounds it: the optimizer's, made as it updates w) as w's
/// bfloat16 copy at w's version now: rounded_weight(w) then returns it until w changes.
void provide_rounded_weight(const torch::Tensor& w, const torch::Tensor& copy);

/// dy (M x N, float32 CPU) rounded as rounded() rounds it, and its column sums (a bias
/// gradient, N) in the same pass: blocks of rows over the threads, each block's sums in
/// row order, the blocks' added in block order (the same sums at every thread count). With
/// `gelu_of` (M x N, what GELU was given), dy is first multiplied by GELU's slope there,
/// block by block in a buffer of the thread's: the gradient that reaches GELU's input,
/// never written out in float32. With `sums_wanted` false the column sums are neither made
/// nor returned (no bias to take them).
std::pair<torch::Tensor, torch::Tensor> rounded_with_column_sums(const torch::Tensor& dy,
                                                                 const torch::Tensor& gelu_of = {},
                                                                 bool exact = true, bool sums_wanted = true);

/// gelu(a) rounded to bfloat16 (a (M x N) float32 CPU, contiguous; the result packed), GELU's
/// float32 result only a chunk at a time, in a thread's buffer.
torch::Tensor gelu_rounded(const torch::Tensor& a, bool exact);

}  // namespace tinylm::nn
