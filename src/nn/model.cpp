// TinyAttentionLM (the reference) and TransformerLM (the block stack).
// B = batch, T = sequence length, D = d_model, V = vocab size, L = layers
// Over 400 lines on purpose: both model kinds with their architecture parser and
// parameter count, which must agree with what the modules register.
#include <tinylm/log.h>
#include <tinylm/nn/model.h>

#include "internal/system.h"
#include "nn/fused_tiny_lm.h"

#include <c10/util/Type.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <optional>
#include <sstream>
#include <unordered_set>

namespace tinylm::nn {

void check_token_shape(const char* who, const torch::Tensor& ids, int64_t context_length) {
  TORCH_CHECK(ids.defined(), who, ": token ids are undefined");
  TORCH_CHECK(ids.dim() == 2, who, ": expected token ids of rank 2 (B, T), got rank ", ids.dim(),
              " with shape ", ids.sizes());
  TORCH_CHECK(ids.scalar_type() == torch::kLong, who, ": token ids must be int64, got ",
              ids.scalar_type());
  TORCH_CHECK(ids.size(0) >= 1 && ids.size(1) >= 1, who, ": token ids must be non-empty, got shape ",
              ids.sizes());
  TORCH_CHECK(ids.size(1) <= context_length, who, ": sequence length ", ids.size(1),
              " exceeds context_length ", context_length);
}

void check_token_range(const char* who, int64_t min_id, int64_t max_id, int64_t vocab_size) {
  TORCH_CHECK(min_id >= 0 && max_id < vocab_size, who, ": token ids must be in [0, ", vocab_size,
              "), got ids in [", min_id, ", ", max_id, "]");
}

void check_token_ids(const char* who, const torch::Tensor& ids, int64_t vocab_size,
                     int64_t context_length) {
  check_token_shape(who, ids, context_length);
  auto [lo, hi] = torch::aminmax(ids);
  check_token_range(who, lo.item<int64_t>(), hi.item<int64_t>(), vocab_size);
}

int64_t count_parameters(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                              bool per_position) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "next_token_loss: logits (B, T, V) and targets (B, T) disagree: ", logits.sizes(),
              " vs ", targets.sizes());
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  namespace F = torch::nn::functional;
  auto options = F::CrossEntropyFuncOptions().ignore_index(kIgnoreTarget);
  if (per_position) options.reduction(torch::kNone);
  auto ce = F::cross_entropy(logits.to(torch::kFloat32).reshape({B * T, V}),
                             targets.reshape({B * T}), options);
  return per_position ? ce.view({B, T}) : ce;
}

torch::Tensor LanguageModelImpl::loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  return next_token_loss(forward(ids).logits, targets);
}

ModelArchitecture LanguageModelImpl::architecture() const {
  return {c10::demangle(typeid(*this).name()), 1, {}};
}

// ---- architectures ---------------------------------------------------------------

namespace {

/// Reads options out of an architecture: each read marks its key; finish() warns about
/// the keys nobody read (written by a newer tinylm) and names the model.
class OptionReader {
 public:
  explicit OptionReader(const ModelArchitecture& a) : a_(a) {}
  template <typename Set>
  void integer(const char* key, Set set) {
    if (auto* v = find(key)) set(parse<int64_t>(key, *v, [](const std::string& s, size_t* n) { return std::stoll(s, n); }));
  }
  template <typename Set>
  void real(const char* key, Set set) {
    if (auto* v = find(key)) set(parse<double>(key, *v, [](const std::string& s, size_t* n) { return std::stod(s, n); }));
  }
  template <typename Set>
  void boolean(const char* key, Set set) {
    if (auto* v = find(key)) {
      TORCH_CHECK(*v == "true" || *v == "false", "model option ", key, " = '", printable(*v),
                  "' in a ", printable(a_.kind), " architecture is not true or false");
      set(*v == "true");
    }
  }
  template <typename Set>
  void text(const char* key, Set set) {
    if (auto* v = find(key)) set(*v);
  }
  void finish() const {
    for (const auto& [key, value] : a_.options)
      if (!read_.count(key))
        logger()->warn("model option '{}' = '{}' of a {} model (version {}) is unknown to this "
                       "tinylm (written by a newer one?): ignored", printable(key), printable(value),
                       printable(a_.kind), a_.version);
  }

 private:
  const std::string* find(const char* key) {
    read_.insert(key);
    auto it = a_.options.find(key);
    return it == a_.options.end() ? nullptr : &it->second;
  }
  template <typename T, typename Parse>
  T parse(const char* key, const std::string& v, Parse p) {
    size_t used = 0;
    T out{};
    try {
      out = p(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK(used == v.size() && !v.empty(), "model option ", key, " = '", printable(v), "' in a ",
                printable(a_.kind), " architecture is not a number");
    return out;
  }
  const ModelArchitecture& a_;
  std::unordered_set<std::string> read_;
};

/// Refuses, before anything is allocated, a model whose weights (float32) cannot fit in
/// the memory this process has: an architecture read from a file must not exhaust it.
/// Nothing else a model holds grows with its options: masks and sinusoidal rows are made
/// for the lengths it is run at.
void check_fits(const ModelArchitecture& a, double parameters) {
  const double bytes = 4.0 * parameters;
  const uint64_t available = internal::available_memory_bytes();
  TORCH_CHECK(available == 0 || bytes < 0.9 * static_cast<double>(available), "a ", printable(a.kind),
              " model with these options needs about ", internal::human_bytes(bytes),
              " for its weights, but ", internal::human_bytes(static_cast<double>(available)),
              " is available: lower vocab_size, context_length, d_model or n_layers");
}

std::string text_of(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}
std::string text_of(bool v) { return v ? "true" : "false"; }
std::string text_of(int64_t v) { return std::to_string(v); }

}  // namespace

namespace {

/// The options an architecture of tinylm's own kinds describes, read and checked (no
/// model built); `warn`: log the options this tinylm does not know.
struct ParsedArchitecture {
  std::optional<TinyAttentionLMOptions> tiny;
  std::optional<TransformerLMOptions> transformer;
};

ParsedArchitecture parse_architecture(const ModelArchitecture& a, bool warn) {
  TORCH_CHECK(a.kind == "tiny" || a.kind == "transformer", "cannot build a model of kind '", printable(a.kind),
              "': tinylm builds tiny and transformer models; build yours in your own code and "
              "load the checkpoint's weights into it with load_model_state");
  TORCH_CHECK(a.version >= 1 && a.version <= 1, "a ", printable(a.kind), " model of option version ",
              a.version, " is newer than this tinylm understands (version 1): upgrade tinylm");
  OptionReader r(a);
  int64_t V = 0, C = 0, D = 0, H = 0, L = 1;
  r.integer("vocab_size", [&](int64_t v) { V = v; });
  r.integer("context_length", [&](int64_t v) { C = v; });
  r.integer("d_model", [&](int64_t v) { D = v; });
  r.integer("n_heads", [&](int64_t v) { H = v; });
  AttentionKernel kernel = AttentionKernel::automatic;
  r.text("attention_kernel", [&](const std::string& v) { kernel = attention_kernel_from_string(v); });
  ParsedArchitecture out;
  if (a.kind == "tiny") {
    TinyAttentionLMOptions o(V, C, D, H);
    o.attention_kernel(kernel);
    r.real("pos_base", [&](double v) { o.pos_base(v); });
    out.tiny = o;
  } else {
    r.integer("n_layers", [&](int64_t v) { L = v; });
    TransformerLMOptions o(V, C, D, H, L);
    o.attention_kernel(kernel);
    r.integer("mlp_expansion", [&](int64_t v) { o.mlp_expansion(v); });
    r.real("dropout", [&](double v) { o.dropout(v); });
    r.real("attn_dropout", [&](double v) { o.attn_dropout(v); });
    r.boolean("bias", [&](bool v) { o.bias(v); });
    r.boolean("pre_ln", [&](bool v) { o.pre_ln(v); });
    r.text("activation", [&](const std::string& v) { o.activation(activation_from_string(v)); });
    r.boolean("tie_weights", [&](bool v) { o.tie_weights(v); });
    r.text("positions", [&](const std::string& v) { o.positions(position_encoding_from_string(v)); });
    r.real("pos_base", [&](double v) { o.pos_base(v); });
    out.transformer = o;
  }
  if (warn) r.finish();
  return out;
}

/// Parameter elements, in double (sizes read from a file may be absurd): what the
/// modules below register, matrix by matrix.
double parameter_elements(const TinyAttentionLMOptions& o) {
  const double v = static_cast<double>(o.vocab_size()), d = static_cast<double>(o.d_model());
  return v * d                  // token embedding
         + 4 * d * d + 4 * d    // qkv and output projections, with biases
         + d * v + v;           // lm_head, with bias
}
double parameter_elements(const TransformerLMOptions& o) {
  const double v = static_cast<double>(o.vocab_size()), d = static_cast<double>(o.d_model()),
               c = static_cast<double>(o.context_length()), l = static_cast<double>(o.n_layers()),
               e = static_cast<double>(o.mlp_expansion());
  const double biases = o.bias() ? 4 * d + e * d + d : 0;  // attention (qkv, out), mlp (fc, proj)
  const double per_layer = 4 * d * d + 2 * e * d * d + biases + 4 * d;  // + two LayerNorms
  return v * d + (o.positions() == PositionEncoding::learned ? c * d : 0) + l * per_layer +
         2 * d                                  // ln_f
         + (o.tie_weights() ? 0 : v * d);       // lm_head (no bias)
}

int64_t exact_count(const ModelArchitecture& a, double elements) {
  TORCH_CHECK(elements >= 0 && elements < 9e18, "a ", printable(a.kind), " model with these options would have ",
              elements, " parameters, more than any model can");
  return static_cast<int64_t>(elements);
}

}  // namespace

int64_t parameter_count(const ModelArchitecture& a) {
  const auto p = parse_architecture(a, /*warn=*/false);
  // Exact once below 2^53; the checks upstream (vocab, d_model >= 1 ...) come at build time.
  return p.tiny ? exact_count(a, parameter_elements(*p.tiny)) : exact_count(a, parameter_elements(*p.transformer));
}

double parameter_elements(const ModelArchitecture& a) {
  const auto p = parse_architecture(a, /*warn=*/false);
  return p.tiny ? parameter_elements(*p.tiny) : parameter_elements(*p.transformer);
}

LanguageModel build_model(const ModelArchitecture& a) {
  const auto p = parse_architecture(a, /*warn=*/true);
  if (p.tiny) {
    const auto& o = *p.tiny;
    check_fits(a, parameter_elements(o));
    return std::make_shared<TinyAttentionLMImpl>(o);
  }
  const auto& o = *p.transformer;
  check_fits(a, parameter_elements(o));
  return std::make_shared<TransformerLMImpl>(o);
}

// ---- TinyAttentionLM -----------------------------------------------------------

TinyAttentionLMImpl::TinyAttentionLMImpl(const TinyAttentionLMOptions& options_)
    : options(options_) {
  reset();
}

void TinyAttentionLMImpl::reset() {
  const int64_t V = options.vocab_size(), D = options.d_model(), C = options.context_length();
  TORCH_CHECK(V >= 1, "TinyAttentionLM: vocab_size must be >= 1, got ", V);
  token_embedding = register_module("token_embedding", TokenEmbedding(TokenEmbeddingOptions(V, D)));
  sinusoidal_positions = register_module(
      "sinusoidal_positions",
      SinusoidalPositionalEmbedding(
          SinusoidalPositionalEmbeddingOptions(C, D).base(options.pos_base())));
  attention = register_module(
      "attention", MultiHeadSelfAttention(MultiHeadSelfAttentionOptions(D, options.n_heads(), C)
                                              .kernel(options.attention_kernel())
                                              .policy(options.kernel_policy())));
  lm_head = register_module("lm_head", torch::nn::Linear(D, V));
}

void TinyAttentionLMImpl::reset_parameters() {
  token_embedding->reset_parameters();
  attention->reset_parameters();
  lm_head->reset_parameters();
}

ModelArchitecture TinyAttentionLMImpl::architecture() const { return architecture_of(options); }

ModelArchitecture architecture_of(const TinyAttentionLMOptions& options) {
  return {"tiny",
          1,
          {{"vocab_size", text_of(options.vocab_size())},
           {"context_length", text_of(options.context_length())},
           {"d_model", text_of(options.d_model())},
           {"n_heads", text_of(options.n_heads())},
           {"pos_base", text_of(options.pos_base())},
           {"attention_kernel", to_string(options.attention_kernel())}}};
}

torch::Tensor TinyAttentionLMImpl::loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  // The whole model as one op exactly where its attention would run the fused kernel.
  const auto& w = token_embedding->weight;
  AttentionCall call;
  call.cuda = w.is_cuda();
  call.fused_supported = w.device().is_cpu() && w.scalar_type() == torch::kFloat32;
  call.seq_len = ids.dim() == 2 ? ids.size(1) : 0;
  call.dropout = is_training() && attention->options.attn_dropout() > 0;
  call.grad_enabled = torch::GradMode::is_enabled();
  const auto& policy = options.kernel_policy();
  if (policy.fuse_whole_model && ids.dim() == 2 &&
      policy.attention_kernel(options.attention_kernel(), call) == AttentionKernel::fused &&
      fused_tiny_lm_supported(*this))
    return fused_tiny_lm_loss(*this, ids, targets);
  return LanguageModelImpl::loss(ids, targets);
}

void TinyAttentionLMImpl::set_kernel_policy(const KernelPolicy& policy) {
  options.kernel_policy(policy);
  attention->options.policy(policy);
}

void TinyAttentionLMImpl::pretty_print(std::ostream& os) const {
  os << "tinylm::nn::TinyAttentionLM(vocab_size=" << options.vocab_size()
     << ", context_length=" << options.context_length() << ", d_model=" << options.d_model()
     << ", n_heads=" << options.n_heads() << ")";
}

LMOutput TinyAttentionLMImpl::forward(const torch::Tensor& ids, bool return_weights,
                                      const torch::Tensor& padding_mask) {
  check_token_ids("TinyAttentionLM", ids, options.vocab_size(), options.context_length());
  const int64_t T = ids.size(1);
  auto x = token_embedding(ids) + sinusoidal_positions(T);  // (B, T, D) + (T, D)
  auto a = attention(x, return_weights, padding_mask);    // (B, T, D)
  LMOutput out{lm_head(a.output), {}};                    // (B, T, V)
  if (return_weights) out.attention.push_back(a.weights);  // (B, H, T, T)
  return out;
}

torch::Tensor TinyAttentionLMImpl::forward_cached(const torch::Tensor& ids, KVCache& cache) {
  check_token_ids("TinyAttentionLM", ids, options.vocab_size(), options.context_length());
  cache.keys.resize(1);
  cache.values.resize(1);
  const int64_t Tn = ids.size(1);
  auto x = token_embedding(ids) + sinusoidal_positions->rows(cache.length, Tn);  // (B, Tn, D)
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
  TORCH_CHECK(false, "unknown position encoding '", printable(s), "': use learned, sinusoidal or none");
}

TransformerLMOptions TransformerLMOptions::gpt2_small() {
  return TransformerLMOptions(50257, 1024, 768, 12, 12);
}

TransformerLMImpl::TransformerLMImpl(const TransformerLMOptions& options_) : options(options_) {
  reset();
}

void TransformerLMImpl::set_kernel_policy(const KernelPolicy& policy) {
  options.kernel_policy(policy);
  for (const auto& block : *blocks) {
    auto& b = *block->as<TransformerBlockImpl>();
    b.options.kernel_policy(policy);
    b.attn->options.policy(policy);
  }
}

ModelArchitecture TransformerLMImpl::architecture() const { return architecture_of(options); }

ModelArchitecture architecture_of(const TransformerLMOptions& options) {
  return {"transformer",
          1,
          {{"vocab_size", text_of(options.vocab_size())},
           {"context_length", text_of(options.context_length())},
           {"d_model", text_of(options.d_model())},
           {"n_heads", text_of(options.n_heads())},
           {"n_layers", text_of(options.n_layers())},
           {"mlp_expansion", text_of(options.mlp_expansion())},
           {"dropout", text_of(options.dropout())},
           {"attn_dropout", text_of(options.attn_dropout())},
           {"bias", text_of(options.bias())},
           {"pre_ln", text_of(options.pre_ln())},
           {"activation", to_string(options.activation())},
           {"tie_weights", text_of(options.tie_weights())},
           {"positions", to_string(options.positions())},
           {"pos_base", text_of(options.pos_base())},
           {"attention_kernel", to_string(options.attention_kernel())}}};
}

void TransformerLMImpl::reset() {
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
        "learned_positions", LearnedPositionalEmbedding(LearnedPositionalEmbeddingOptions(C, D)));
  } else if (options.positions() == PositionEncoding::sinusoidal) {
    sinusoidal_positions = register_module(
        "sinusoidal_positions", SinusoidalPositionalEmbedding(
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
                                           .activation(options.activation())
                                           .attention_kernel(options.attention_kernel())
                                           .kernel_policy(options.kernel_policy())));
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
