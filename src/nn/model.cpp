// TinyAttentionLM (the reference) and TransformerLM (the block stack).
// B = batch, T = sequence length, D = d_model, V = vocab size, L = layers
#include <tinylm/nn/model.h>

#include <torch/torch.h>

#include <cmath>
#include <unordered_set>

namespace tinylm::nn {

void check_token_ids(const char* who, const torch::Tensor& ids, int64_t vocab_size,
                     int64_t context_length) {
  TORCH_CHECK(ids.defined(), who, ": token ids are undefined");
  TORCH_CHECK(ids.dim() == 2, who, ": expected token ids of rank 2 (B, T), got rank ", ids.dim(),
              " with shape ", ids.sizes());
  TORCH_CHECK(ids.scalar_type() == torch::kLong, who, ": token ids must be int64, got ",
              ids.scalar_type());
  TORCH_CHECK(ids.size(0) >= 1 && ids.size(1) >= 1, who, ": token ids must be non-empty, got shape ",
              ids.sizes());
  TORCH_CHECK(ids.size(1) <= context_length, who, ": sequence length ", ids.size(1),
              " exceeds context_length ", context_length);
  auto [lo, hi] = torch::aminmax(ids);
  const int64_t min_id = lo.item<int64_t>(), max_id = hi.item<int64_t>();
  TORCH_CHECK(min_id >= 0 && max_id < vocab_size, who, ": token ids must be in [0, ", vocab_size,
              "), got ids in [", min_id, ", ", max_id, "]");
}

int64_t count_parameters(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

// ---- TinyAttentionLM -----------------------------------------------------------

TinyAttentionLMImpl::TinyAttentionLMImpl(const TinyAttentionLMOptions& options_)
    : options(options_) {
  const int64_t V = options.vocab_size(), D = options.d_model(), C = options.max_context_length();
  TORCH_CHECK(V >= 1, "TinyAttentionLM: vocab_size must be >= 1, got ", V);
  token_embedding = register_module("token_embedding", TokenEmbedding(TokenEmbeddingOptions(V, D)));
  positions = register_module(
      "positions", SinusoidalPositionalEmbedding(
                       SinusoidalPositionalEmbeddingOptions(C, D).base(options.pos_base())));
  attention = register_module(
      "attention", MultiHeadSelfAttention(MultiHeadSelfAttentionOptions(D, options.n_heads(), C)
                                              .fused(options.fused_attention())));
  lm_head = register_module("lm_head", torch::nn::Linear(D, V));
}

void TinyAttentionLMImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::TinyAttentionLM(vocab_size=" << options.vocab_size()
     << ", d_model=" << options.d_model() << ", n_heads=" << options.n_heads()
     << ", max_context_length=" << options.max_context_length() << ")";
}

LMOutput TinyAttentionLMImpl::forward(const torch::Tensor& ids, bool return_weights,
                                      const torch::Tensor& padding_mask) {
  check_token_ids("TinyAttentionLM", ids, options.vocab_size(), options.max_context_length());
  const int64_t T = ids.size(1);
  auto x = token_embedding(ids) + positions(T);           // (B, T, D) + (T, D)
  auto a = attention(x, return_weights, padding_mask);    // (B, T, D)
  LMOutput out{lm_head(a.output), {}};                    // (B, T, V)
  if (return_weights) out.attention.push_back(a.weights);  // (B, H, T, T)
  return out;
}

torch::Tensor TinyAttentionLMImpl::forward_cached(const torch::Tensor& ids, KVCache& cache) {
  check_token_ids("TinyAttentionLM", ids, options.vocab_size(), options.max_context_length());
  cache.keys.resize(1);
  cache.values.resize(1);
  const int64_t Tn = ids.size(1);
  auto x = token_embedding(ids) + positions->rows(cache.length, Tn);  // (B, Tn, D)
  auto h = attention->forward_cached(x, cache.keys[0], cache.values[0]);
  cache.length += Tn;
  return lm_head(h);  // (B, Tn, V)
}

// ---- TransformerLM -------------------------------------------------------------

const char* to_string(PositionEncoding p) {
  switch (p) {
    case PositionEncoding::learned: return "learned";
    case PositionEncoding::sinusoidal: return "sinusoidal";
    case PositionEncoding::none: return "none";
  }
  return "?";
}

PositionEncoding position_encoding_from_string(const std::string& s) {
  if (s == "learned") return PositionEncoding::learned;
  if (s == "sinusoidal") return PositionEncoding::sinusoidal;
  if (s == "none") return PositionEncoding::none;
  TORCH_CHECK(false, "unknown position encoding '", s, "': use learned, sinusoidal or none");
}

TransformerLMOptions TransformerLMOptions::gpt2_small() {
  return TransformerLMOptions(50257, 1024, 768, 12, 12);
}

TransformerLMImpl::TransformerLMImpl(const TransformerLMOptions& options_) : options(options_) {
  const int64_t V = options.vocab_size(), C = options.context_length(), D = options.d_model(),
                L = options.n_layers();
  TORCH_CHECK(V >= 1, "TransformerLM: vocab_size must be >= 1, got ", V);
  TORCH_CHECK(C >= 1, "TransformerLM: context_length must be >= 1, got ", C);
  TORCH_CHECK(L >= 1, "TransformerLM: n_layers must be >= 1, got ", L);
  TORCH_CHECK(options.dropout() >= 0 && options.dropout() < 1,
              "TransformerLM: dropout must be in [0, 1), got ", options.dropout());
  token_embedding = register_module("token_embedding", TokenEmbedding(TokenEmbeddingOptions(V, D)));
  if (options.positions() == PositionEncoding::learned) {
    learned_positions = register_module(
        "positions", LearnedPositionalEmbedding(LearnedPositionalEmbeddingOptions(C, D)));
  } else if (options.positions() == PositionEncoding::sinusoidal) {
    sinusoidal_positions = register_module(
        "positions", SinusoidalPositionalEmbedding(
                         SinusoidalPositionalEmbeddingOptions(C, D).base(options.pos_base())));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < L; ++i) {
    blocks->push_back(TransformerBlock(TransformerBlockOptions(D, options.n_heads(), C)
                                           .mlp_expansion(options.mlp_expansion())
                                           .attn_dropout(options.attn_dropout())
                                           .residual_dropout(options.dropout())
                                           .bias(options.bias())
                                           .pre_ln(options.pre_ln())
                                           .fused_attention(options.fused_attention())));
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({D})));
  if (!options.tie_weights()) {
    lm_head = register_module("lm_head",
                              torch::nn::Linear(torch::nn::LinearOptions(D, V).bias(false)));
  }
  reset_parameters();
}

void TransformerLMImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  constexpr double kStd = 0.02;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, kStd);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* norm = module->as<torch::nn::LayerNorm>()) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
  token_embedding->weight.normal_(0.0, kStd);
  if (learned_positions) learned_positions->weight.normal_(0.0, kStd);
  // Residual projections add into the stream once per sub-layer: 2 L additions.
  const double residual_std = kStd / std::sqrt(2.0 * static_cast<double>(options.n_layers()));
  for (const auto& module : *blocks) {
    auto* block = module->as<TransformerBlock>();
    block->attn->out_proj->weight.normal_(0.0, residual_std);
    block->mlp->proj->weight.normal_(0.0, residual_std);
  }
}

void TransformerLMImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::TransformerLM(vocab_size=" << options.vocab_size()
     << ", context_length=" << options.context_length() << ", d_model=" << options.d_model()
     << ", n_heads=" << options.n_heads() << ", n_layers=" << options.n_layers()
     << ", positions=" << to_string(options.positions())
     << ", pre_ln=" << (options.pre_ln() ? "true" : "false")
     << ", tie_weights=" << (options.tie_weights() ? "true" : "false") << ")";
}

torch::Tensor TransformerLMImpl::lm_head_weight() const {
  return options.tie_weights() ? token_embedding->weight : lm_head->weight;
}

torch::Tensor TransformerLMImpl::hidden(const torch::Tensor& ids, const torch::Tensor& padding_mask,
                                        std::vector<torch::Tensor>* weights) {
  check_token_ids("TransformerLM", ids, options.vocab_size(), options.context_length());
  const int64_t T = ids.size(1);
  auto x = token_embedding(ids);                                   // (B, T, D)
  if (learned_positions) x = x + learned_positions(T);             // + (T, D)
  if (sinusoidal_positions) x = x + sinusoidal_positions(T);       // + (T, D)
  x = torch::dropout(x, options.dropout(), is_training());
  for (const auto& module : *blocks) {
    auto r = module->as<TransformerBlock>()->forward(x, weights != nullptr, padding_mask);
    x = r.output;                                                  // (B, T, D)
    if (weights) weights->push_back(r.weights);                    // (B, H, T, T)
  }
  return ln_f(x);                                                  // (B, T, D)
}

LMOutput TransformerLMImpl::forward(const torch::Tensor& ids, bool return_weights,
                                    const torch::Tensor& padding_mask) {
  LMOutput out;
  auto h = hidden(ids, padding_mask, return_weights ? &out.attention : nullptr);
  out.logits = torch::nn::functional::linear(h, lm_head_weight());  // (B, T, V)
  return out;
}

torch::Tensor TransformerLMImpl::forward_cached(const torch::Tensor& ids, KVCache& cache) {
  check_token_ids("TransformerLM", ids, options.vocab_size(), options.context_length());
  const int64_t Tn = ids.size(1), L = options.n_layers();
  cache.keys.resize(L);
  cache.values.resize(L);
  auto x = token_embedding(ids);                                                 // (B, Tn, D)
  if (learned_positions) x = x + learned_positions->rows(cache.length, Tn);
  if (sinusoidal_positions) x = x + sinusoidal_positions->rows(cache.length, Tn);
  for (int64_t l = 0; l < L; ++l) {
    x = blocks[l]->as<TransformerBlock>()->forward_cached(x, cache.keys[l], cache.values[l]);
  }
  cache.length += Tn;
  return torch::nn::functional::linear(ln_f(x), lm_head_weight());  // (B, Tn, V)
}

}  // namespace tinylm::nn
