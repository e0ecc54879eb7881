// The whole TinyAttentionLM training loss as one autograd op (CPU, float32), on the
// model's tensors: it knows the model's shape, not its class.
// B = batch, T = sequence length, D = d_model, V = vocab size, N = B * T
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

#include <cstdint>

namespace tinylm::nn {

/// The tiny model's parameters as the fused loss takes them: the token embedding (V, D),
/// the sinusoid rows for the batch's length (T, D), the QKV and output projections and
/// the LM head as Linear stores them, each with its bias.
struct TinyLMTensors {
  torch::Tensor embedding, positions, qkv_weight, qkv_bias, out_weight, out_bias, head_weight, head_bias;
  int64_t n_heads = 1;
  int64_t context_length = 0;
  int64_t ignore_target = 0;  // targets equal to it are not scored (kIgnoreTarget, model.h)
};

/// Whether fused_tiny_lm_loss takes them: float32 CPU parameters, every bias there.
bool fused_tiny_lm_supported(const TinyLMTensors& model);

/// Mean next-token cross-entropy of the model on ids (B, T) -> targets (B, T), equal to
/// cross_entropy(forward(ids).logits, targets) with causal attention, but computed as one
/// operation (embedding + positions, QKV projection, causal attention, output projection,
/// LM head, softmax cross-entropy) with a hand-written backward that yields the gradients
/// of all seven parameters at once, its products as `policy` says. For tiny models, whose
/// step time is per-operator overhead, this replaces ~60 dispatched operations with ~14
/// matrix products and a few loops.
torch::Tensor fused_tiny_lm_loss(const TinyLMTensors& model, const torch::Tensor& ids,
                                 const torch::Tensor& targets, const KernelPolicy& policy);

/// Generation's step on the same tensors (positions (T, D) for ids' length): logits
/// (B, V) for the token after each row of ids (B, T), equal to forward(ids)'s last
/// position to float rounding. Every position's keys and values are made, the query, attention
/// output, the output projection and the head only for the last: a handful of products and
/// loops in place of the ~25 operations the module dispatches, which decide a tiny
/// model's time per token.
torch::Tensor fused_tiny_lm_next_logits(const TinyLMTensors& model, const torch::Tensor& ids,
                                        const KernelPolicy& policy);

}  // namespace tinylm::nn
