// Internal: the attention kernels shared by the fused ops (fused_attention.cpp and
// fused_tiny_lm.cpp). Plain loops over (batch, head) pairs; see fused_attention.cpp for
// the maths. The files that include it are compiled with -fopenmp-simd (the `omp simd`
// loops vectorise, no OpenMP runtime) and -fno-math-errno (std::exp and std::sqrt need
// not set errno, so they can vectorise and inline): see CMakeLists.txt.
//
// Pointer layouts (all float32, row-major, contiguous; s = dims_of(...)):
//   qkv   (B, T, 3D)     row (b, t) = [q | k | v], each D = H heads x Dh features
//   out   (B, T, D)      heads merged: feature h * Dh + e of row (b, t)
//   p     (B, H, T, T)   softmax weights; row i holds keys 0..T-1, zero past i if causal
//   dout  (B, T, D)      gradient of out
//   dqkv  (B, T, 3D)     gradient of qkv, same layout as qkv; written, not accumulated
// B = batch, T = sequence length, D = d_model, H = heads, Dh = D / H
#pragma once

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace tinylm::nn::kernels {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// Sequences at least this long use BLAS batched matmuls for the two T x T products;
// shorter ones are faster as plain loops (no copies, no per-call BLAS overhead).
constexpr int64_t kBlasMinSeqLen = 32;

/// In place over rows of s (BH, T, T): p = softmax(scale * s) with keys j > i masked.
inline void masked_softmax_rows(float* s, int64_t rows_total, int64_t T, float scale, bool causal) {
  at::parallel_for(0, rows_total, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % T, n = causal ? i + 1 : T;
      float* row = s + r * T;
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j] *= scale);
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - m));
      const float inv = 1.f / sum;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      std::fill(row + n, row + T, 0.f);
    }
  });
}

/// (B, T, 3D) -> q, k, v each (B*H, T, Dh), contiguous.
inline std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t Dh) {
  auto x = qkv.view({B, T, 3, H, Dh}).permute({2, 0, 3, 1, 4});  // (3, B, H, T, Dh)
  return {x[0].reshape({B * H, T, Dh}), x[1].reshape({B * H, T, Dh}), x[2].reshape({B * H, T, Dh})};
}

struct Dims {
  int64_t B, T, D, H, Dh;
  float scale;
  bool causal;
};

inline Dims dims_of(const torch::Tensor& qkv, int64_t H, bool causal) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0,
              "fused_self_attention: expected qkv (B, T, 3D), got ", qkv.sizes());
  const int64_t D = qkv.size(2) / 3;
  TORCH_CHECK(H >= 1 && D % H == 0, "fused_self_attention: D=", D,
              " is not divisible by n_heads=", H);
  return {qkv.size(0), qkv.size(1), D, H, D / H,
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(D / H))), causal};
}

/// qkv (B, T, 3D) -> out (B, T, D) and p (B, H, T, T); layouts above.
inline void forward_kernel(const Dims& s, const float* qkv, float* out, float* p) {
  const int64_t row = 3 * s.D;  // stride between tokens in qkv
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const float* q = qkv + b * s.T * row + h * s.Dh;
      const float* k = q + s.D;
      const float* v = q + 2 * s.D;
      float* o = out + b * s.T * s.D + h * s.Dh;
      float* pw = p + bh * s.T * s.T;
      for (int64_t i = 0; i < s.T; ++i) {
        const int64_t n = s.causal ? i + 1 : s.T;  // keys this query sees
        float* pi = pw + i * s.T;
        float m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          pi[j] = s.scale * dot(q + i * row, k + j * row, s.Dh);
          m = std::max(m, pi[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < n; ++j) sum += (pi[j] = std::exp(pi[j] - m));
        const float inv = 1.f / sum;
        float* oi = o + i * s.D;
        std::fill(oi, oi + s.Dh, 0.f);
        for (int64_t j = 0; j < n; ++j) {
          pi[j] *= inv;
          axpy(pi[j], v + j * row, oi, s.Dh);
        }
        std::fill(pi + n, pi + s.T, 0.f);
      }
    }
  });
}

/// qkv (B, T, 3D), p (B, H, T, T), dout (B, T, D) -> dqkv (B, T, 3D); layouts above.
inline void backward_kernel(const Dims& s, const float* qkv, const float* p, const float* dout,
                     float* dqkv) {
  const int64_t row = 3 * s.D;
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ds(s.T);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const int64_t base = b * s.T * row + h * s.Dh;
      const float *q = qkv + base, *k = q + s.D, *v = q + 2 * s.D;
      float *dq = dqkv + base, *dk = dq + s.D, *dv = dq + 2 * s.D;
      const float* dob = dout + b * s.T * s.D + h * s.Dh;
      const float* pw = p + bh * s.T * s.T;
      for (int64_t i = 0; i < s.T; ++i) {
        const int64_t n = s.causal ? i + 1 : s.T;
        const float* pi = pw + i * s.T;
        const float* doi = dob + i * s.D;
        float rowdot = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          ds[j] = dot(doi, v + j * row, s.Dh);  // dp_ij
          rowdot += pi[j] * ds[j];
          axpy(pi[j], doi, dv + j * row, s.Dh);
        }
        float* dqi = dq + i * row;
        for (int64_t j = 0; j < n; ++j) {
          const float g = s.scale * pi[j] * (ds[j] - rowdot);  // scale * ds_ij
          axpy(g, k + j * row, dqi, s.Dh);
          axpy(g, q + i * row, dk + j * row, s.Dh);
        }
      }
    }
  });
}

}  // namespace tinylm::nn::kernels
