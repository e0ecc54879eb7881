// The bfloat16 operands' rounding passes (see bf16_operands.h).
#include "nn/bf16_operands.h"

#include "nn/cpu/kernels.h"

#include <tinylm/nn/cpu_kernels.h>

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace tinylm::nn {

uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

torch::Tensor rounded(const torch::Tensor& x) {
  if (x.is_cuda()) return x.to(torch::kBFloat16).contiguous();
  const auto c = x.contiguous();
  auto out = torch::empty(c.sizes(), c.options().dtype(torch::kBFloat16).requires_grad(false));
  round_to_bf16(c.data_ptr<float>(), bits(out), c.numel());
  return out;
}

/// Rows per block of rounded_with_column_sums (each block's column sums apart).
constexpr int64_t kSumRows = 32;

std::pair<torch::Tensor, torch::Tensor> rounded_with_column_sums(const torch::Tensor& dy, const torch::Tensor& gelu_of,
                                                                 bool exact, bool sums_wanted) {
  const auto c = dy.contiguous();
  const int64_t M = c.size(0), N = c.size(1), blocks = (M + kSumRows - 1) / kSumRows;
  auto out = torch::empty({M, N}, c.options().dtype(torch::kBFloat16).requires_grad(false));
  auto partial = sums_wanted ? torch::zeros({blocks, N}, c.options().requires_grad(false)) : torch::Tensor();
  const auto& table = cpu::bf16_table();  // its rounding in one instruction where it can
  const float* x = c.data_ptr<float>();
  const float* pre = gelu_of.defined() ? gelu_of.data_ptr<float>() : nullptr;
  uint16_t* y = bits(out);
  float* sums = sums_wanted ? partial.data_ptr<float>() : nullptr;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> slope(pre ? static_cast<size_t>(kSumRows * N) : 0);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t row = b * kSumRows, rows = std::min(kSumRows, M - row);
      const float* from = x + row * N;
      if (pre) {
        table.gelu_backward(pre + row * N, from, slope.data(), rows * N, exact);
        from = slope.data();
      }
      if (sums)
        table.round_bf16_colsum(from, y + row * N, rows, N, sums + b * N);
      else
        table.round_bf16(from, y + row * N, rows * N);
    }
  });
  if (!sums_wanted) return {out, torch::Tensor()};
  auto total = partial[0].clone();  // block 0's sums, then the others' added in order
  float* t = total.data_ptr<float>();
  for (int64_t b = 1; b < blocks; ++b)
    for (int64_t j = 0; j < N; ++j) t[j] += sums[b * N + j];
  return {out, total};
}

torch::Tensor gelu_rounded(const torch::Tensor& a, bool exact) {
  constexpr int64_t kChunk = 4096;
  auto out = torch::empty(a.sizes(), a.options().dtype(torch::kBFloat16).requires_grad(false));
  const auto& table = cpu::bf16_table();  // its rounding in one instruction where it can
  const float* in = a.data_ptr<float>();
  uint16_t* y = bits(out);
  at::parallel_for(0, a.numel(), 4 * kChunk, [&](int64_t begin, int64_t end) {
    float buffer[kChunk];
    for (int64_t i = begin; i < end; i += kChunk) {
      const int64_t n = std::min(kChunk, end - i);
      table.gelu_forward(in + i, buffer, n, exact);
      table.round_bf16(buffer, y + i, n);
    }
  });
  return out;
}

}  // namespace tinylm::nn
