// The pre-LN TransformerLM's training loss as one autograd op, on the CPU with bfloat16
// products: the model's tensors, not its class (model.cpp gathers them).
// B = batch, T = sequence length, D = d_model, L = blocks, V = vocab size
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace tinylm::nn {

/// One block's parameters as its modules hold them; an empty tensor (numel 0) for a bias
/// the block has none of.
struct FusedBlockTensors {
  torch::Tensor ln1_gain, ln1_bias, qkv_weight, qkv_bias, out_weight, out_bias;
  torch::Tensor ln2_gain, ln2_bias, fc_weight, fc_bias, proj_weight, proj_bias;
};

/// The model's parameters and shape for fused_transformer_lm_loss.
struct FusedTransformerLMTensors {
  torch::Tensor embedding;   // (V, D)
  torch::Tensor positions;   // (T, D): the learned rows (a view that carries their gradient) or the sinusoid's; empty for none
  std::vector<FusedBlockTensors> blocks;
  torch::Tensor final_gain, final_bias;  // ln_f's (final_bias empty for none)
  torch::Tensor head_weight;             // (V, D); empty where tied to the embedding
  int64_t n_heads = 1;
  double eps = 1e-5;
  bool center = true;      // LayerNorm (true) or RMSNorm
  bool gelu_exact = true;  // GELU by erf (true) or by tanh
  int64_t ignore_target = 0;
};

/// Whether fused_transformer_lm_loss takes these tensors for ids of length T: float32 CPU
/// parameters of consistent shapes, every one requiring a gradient (but the sinusoid's),
/// bfloat16 products and attention on the CPU (the policy's, at T).
bool fused_transformer_lm_supported(const FusedTransformerLMTensors& model, int64_t T, const KernelPolicy& policy);

/// Mean next-token cross-entropy of the model on ids (B, T) -> targets (B, T), targets
/// equal to ignore_target not scored: what the modules compute with bfloat16 products
/// (token embedding + positions, each block ln1 -> qkv -> causal attention -> out + residual,
/// ln2 -> fc -> GELU -> proj + residual, ln_f, the head, softmax cross-entropy), computed
/// as one operation with a hand-written backward: the same kernels, the same roundings, the
/// same sums, without the ~60 autograd nodes, their tensors and the passes between them
/// (LayerNorm's output is rounded as it is made, never written in float32).
torch::Tensor fused_transformer_lm_loss(const FusedTransformerLMTensors& model, const torch::Tensor& ids,
                                        const torch::Tensor& targets, const KernelPolicy& policy);

}  // namespace tinylm::nn
