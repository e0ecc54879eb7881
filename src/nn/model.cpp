// TinyAttentionLM (the reference) and TransformerLM (the block stack).
// B = batch, T = sequence length, D = d_model, V = vocab size, L = layers
// Over 400 lines on purpose: both model kinds with their option specs and parameter
// counts, which must agree with what the modules register.
#include <tinylm/log.h>
#include <tinylm/nn/model.h>

#include "internal/text.h"
#include "nn/cpu/kernels.h"
#include "nn/fused_tiny_lm.h"
#include "nn/fused_transformer_lm.h"
#include "nn/linear.h"
#include "nn/token_ids.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <unordered_set>
#include <vector>

namespace tinylm::nn {

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

namespace {

/// Mean softmax cross-entropy of float32 CPU logits (N, V) against targets (N), skipping
/// kIgnoreTarget, as one autograd op on tinylm's loops: each row's loss and its gradient
/// (softmax - onehot) / count made in the same passes over a copy of the row, so the
/// backward only scales the kept gradient. Rows in fixed blocks over the threads, the
/// blocks' losses summed in block order (the same loss at every thread count).
class SoftmaxCrossEntropy : public torch::autograd::Function<SoftmaxCrossEntropy> {
 public:
  static constexpr int64_t kRows = 64;

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                                                const torch::Tensor& targets) {
    RECORD_USER_SCOPE("tinylm::cross_entropy");  // named for op profiles (tinylm bench)
    const auto z = logits.contiguous();
    const auto t = targets.contiguous();
    const int64_t N = z.size(0), V = z.size(1), blocks = (N + kRows - 1) / kRows;
    const int64_t* tg = t.data_ptr<int64_t>();
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (tg[n] == kIgnoreTarget) continue;
      TORCH_CHECK(tg[n] >= 0 && tg[n] < V, "next_token_loss: target ", tg[n], " is outside the vocabulary [0, ", V,
                  ") (and is not the ignored target ", kIgnoreTarget, ")");
      ++count;
    }
    auto grad = torch::empty({N, V}, z.options().requires_grad(false));
    std::vector<double> sums(static_cast<size_t>(blocks));
    const float* from = z.data_ptr<float>();
    float* to = grad.data_ptr<float>();
    const float inv_count = 1.f / static_cast<float>(count);
    const auto& table = cpu::table();
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t row = b * kRows, rows = std::min(kRows, N - row);
        std::copy_n(from + row * V, rows * V, to + row * V);
        sums[b] = table.softmax_cross_entropy(to + row * V, tg + row, rows, V, kIgnoreTarget, inv_count);
      }
    });
    double total = 0;
    for (const double v : sums) total += v;
    ctx->save_for_backward({grad});
    // No counted row: NaN, as cross_entropy's mean gives.
    return {torch::full({}, total / static_cast<double>(count), z.options().requires_grad(false))};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_USER_SCOPE("tinylm::cross_entropy_backward");
    const auto grad = ctx->get_saved_variables()[0];
    return {grad * grads[0], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                              bool per_position) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "next_token_loss: logits (B, T, V) and targets (B, T) disagree: ", logits.sizes(),
              " vs ", targets.sizes());
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  // Training's loss (the mean, with a gradient to make) on the loops where the logits are
  // float32 on the CPU: LibTorch's takes a log-softmax pass, and three more backward.
  if (!per_position && torch::GradMode::is_enabled() && logits.requires_grad() && logits.device().is_cpu() &&
      logits.scalar_type() == torch::kFloat32 && targets.scalar_type() == torch::kLong && targets.device().is_cpu() &&
      V > 0)
    return SoftmaxCrossEntropy::apply(logits.reshape({B * T, V}), targets.reshape({B * T}))[0];
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

torch::Tensor LanguageModelImpl::next_logits(const torch::Tensor& ids, KVCache* cache) {
  return (cache ? forward_cached(ids, *cache) : forward(ids).logits).select(1, -1);  // (B, V)
}

torch::Tensor LanguageModelImpl::forward_rows(const torch::Tensor& /*ids*/, KVCache& /*cache*/) {
  TORCH_CHECK(false, c10::demangle(typeid(*this).name()),
              " does not decode rows of different lengths together (supports_rows() is false): decode each row "
              "with forward_cached");
}

namespace {

/// A cache's rows for forward_rows(), checked: one new token per row, one key/value pair
/// per layer, and room in the context for each row's next token.
DecodeRows rows_of(const char* who, const torch::Tensor& ids, const KVCache& cache, int64_t layers, int64_t context) {
  const auto B = static_cast<int64_t>(cache.lengths.size());
  TORCH_CHECK(B >= 1 && ids.size(0) == B && ids.size(1) == 1, who,
              ": forward_rows takes one new token for each of the cache's rows, (", B, ", 1), got ", ids.sizes());
  TORCH_CHECK(static_cast<int64_t>(cache.keys.size()) == layers && static_cast<int64_t>(cache.values.size()) == layers,
              who, ": the cache holds ", cache.keys.size(), " layers' keys, the model has ", layers);
  for (int64_t n : cache.lengths)
    TORCH_CHECK(n >= 0 && n < context, who, ": a row of ", n, " tokens has no room for another within context_length ",
                context);
  return decode_rows(cache.lengths, ids.device());
}

/// Rows of a position table (C, D) at each row's own position -> (B, 1, D).
torch::Tensor rows_at(const torch::Tensor& table, const DecodeRows& rows) {
  return table.index_select(0, rows.positions).unsqueeze(1);
}

}  // namespace

// ---- the options, declared once -------------------------------------------------

namespace {

std::vector<std::pair<std::string, AttentionKernel>> kernel_names() {
  std::vector<std::pair<std::string, AttentionKernel>> out;
  for (auto k : {AttentionKernel::automatic, AttentionKernel::plain, AttentionKernel::fused, AttentionKernel::sdpa})
    out.emplace_back(to_string(k), k);
  return out;
}

// What every tinylm model takes first, in this order (vocabulary, context, width, heads),
// and the rule between width and heads.
template <typename O>
void add_shape_options(OptionSpec<O>& s) {
  // Read and set through the options' functions: a transformer's shape is its block's.
  // One token is always right (loss 0, accuracy 100%): a model that cannot learn anything.
  s.add(TINYLM_OPTION(O, vocab_size), "vocabulary size",
        Rule<int64_t>{[](const int64_t& v) { return v >= 2; }, "must be >= 2 (one token leaves nothing to learn)"})
      .required();
  s.template field<int64_t>(
       "context_length", [](const O& o) { return int64_t(o.context_length()); },
       [](O& o, const int64_t& v) { o.context_length(v); }, "the longest sequence the model takes", at_least(1))
      .required();
  s.template field<int64_t>(
       "d_model", [](const O& o) { return int64_t(o.d_model()); }, [](O& o, const int64_t& v) { o.d_model(v); },
       "embedding width", at_least(1))
      .required();
  s.template field<int64_t>(
       "n_heads", [](const O& o) { return int64_t(o.n_heads()); }, [](O& o, const int64_t& v) { o.n_heads(v); },
       "attention heads", at_least(1))
      .required();
  s.rule([](const O& o, Spelling sp) {
    if (o.n_heads() < 1 || o.d_model() % o.n_heads() == 0) return std::string();
    return c10::str(spell("d_model", sp), " ", o.d_model(), " must be divisible by ", spell("n_heads", sp), " ",
                    o.n_heads());
  });
}
std::string even_width_for_sinusoids(int64_t d_model, Spelling s) {
  if (d_model % 2 == 0) return "";
  return c10::str(spell("d_model", s), " must be even for sinusoidal positions, got ", d_model);
}

}  // namespace

const OptionSpec<TinyAttentionLMOptions>& TinyAttentionLMOptions::spec() {
  using O = TinyAttentionLMOptions;
  static const auto spec = [] {
    OptionSpec<O> s("TinyAttentionLM");
    add_shape_options(s);
    s.add(TINYLM_OPTION(O, pos_base), "base of the sinusoidal positions' wavelengths", positive());
    s.choice(TINYLM_OPTION(O, attention_kernel), kernel_names(),
             "attention kernel: automatic (the fastest that applies, and the fused whole-model loss), "
             "plain, fused or sdpa");
    s.rule([](const O& o, Spelling sp) { return even_width_for_sinusoids(o.d_model(), sp); });
    return s;
  }();
  return spec;
}

const OptionSpec<TransformerLMOptions>& TransformerLMOptions::spec() {
  using O = TransformerLMOptions;
  static const auto spec = [] {
    OptionSpec<O> s("TransformerLM");
    add_shape_options(s);
    s.add(TINYLM_OPTION(O, n_layers), "transformer blocks", at_least(1)).required();
    s.add(TINYLM_OPTION_AT(O, "mlp_expansion", block().mlp().expansion), "MLP hidden width / d_model", at_least(1));
    s.add(TINYLM_OPTION_AT(O, "mlp_hidden", block().mlp().hidden),
          "MLP hidden width, where mlp_expansion x d_model is not wanted (SwiGLU's 8/3 d_model)",
          Rule<int64_t>{[](const int64_t& v) { return v >= 0; }, "must be >= 0 (0: mlp_expansion x d_model)"});
    s.add(TINYLM_OPTION_AT(O, "n_kv_heads", block().attention().n_kv_heads),
          "key/value heads (grouped-query attention; 1: multi-query)",
          Rule<int64_t>{[](const int64_t& v) { return v >= 0; }, "must be >= 0 (0: one per query head)"});
    // One stored dropout for the embeddings and both residual branches, one bias flag for
    // every Linear: a model whose parts differ has no architecture to store.
    s.field<double>(
        "dropout", [](const O& o) { return o.dropout(); },
        [](O& o, const double& p) {
          o.dropout(p);
          o.block().attention().out_dropout(p);
          o.block().mlp().dropout(p);
        },
        "embedding and residual dropout", fraction());
    s.add(TINYLM_OPTION_AT(O, "attn_dropout", block().attention().attn_dropout), "attention-weight dropout",
          fraction());
    s.field<bool>(
        "bias", [](const O& o) { return o.block().attention().bias(); },
        [](O& o, const bool& b) {
          o.block().attention().bias(b);
          o.block().mlp().bias(b);
        },
        "biases in Linear layers");
    s.choice(TINYLM_OPTION_AT(O, "norm", block().norm().kind),
             {{to_string(NormKind::layer_norm), NormKind::layer_norm}, {to_string(NormKind::rms_norm), NormKind::rms_norm}},
             "the blocks' and the final norm: layer-norm, or rms-norm (no mean taken away, as LLaMA)");
    s.add(TINYLM_OPTION_AT(O, "norm_gain", block().norm().gain), "a learned gain in the norms");
    s.add(TINYLM_OPTION_AT(O, "layer_norm_bias", block().norm().bias),
          "biases in the norms (false with bias false: nanoGPT's bias=False; LLaMA's RMSNorm has none)");
    s.add(TINYLM_OPTION_AT(O, "pre_ln", block().pre_ln), "pre-LN blocks; false = post-LN");
    s.choice(TINYLM_OPTION_AT(O, "activation", block().mlp().activation),
             {{to_string(Activation::gelu_tanh), Activation::gelu_tanh},
              {to_string(Activation::gelu), Activation::gelu},
              {to_string(Activation::swiglu), Activation::swiglu}},
             "MLP: gelu-tanh (tanh approximation), gelu (exact, as nanoGPT) or swiglu (gated, as LLaMA)");
    s.add(TINYLM_OPTION(O, tie_weights), "tie the LM head to the token embedding");
    s.choice(TINYLM_OPTION(O, positions),
             {{to_string(PositionEncoding::learned), PositionEncoding::learned},
              {to_string(PositionEncoding::sinusoidal), PositionEncoding::sinusoidal},
              {to_string(PositionEncoding::none), PositionEncoding::none},
              {to_string(PositionEncoding::rotary), PositionEncoding::rotary}},
             "positions: learned, sinusoidal, rotary (RoPE on queries and keys) or none");
    s.add(TINYLM_OPTION(O, pos_base), "base of the sinusoidal or rotary positions' wavelengths", positive());
    s.choice(TINYLM_OPTION_AT(O, "attention_kernel", block().attention().kernel), kernel_names(),
             "attention kernel: automatic (the fastest that applies), plain, fused or sdpa");
    s.rule([](const O& o, Spelling sp) {
      return o.positions() == PositionEncoding::sinusoidal ? even_width_for_sinusoids(o.d_model(), sp) : "";
    });
    s.rule([](const O& o, Spelling sp) {
      const int64_t H = o.n_heads(), kv = o.block().attention().n_kv_heads();
      if (H < 1 || kv == 0 || H % kv == 0) return std::string();
      return c10::str(spell("n_kv_heads", sp), " ", kv, " must divide ", spell("n_heads", sp), " ", H,
                      " (each key/value head serves the same number of query heads)");
    });
    s.rule([](const O& o, Spelling sp) {
      const int64_t H = o.n_heads();
      if (o.positions() != PositionEncoding::rotary || H < 1 || o.d_model() % H != 0 || (o.d_model() / H) % 2 == 0)
        return std::string();
      return c10::str("rotary positions rotate pairs: the head width ", spell("d_model", sp), " / ",
                      spell("n_heads", sp), " = ", o.d_model() / H, " must be even");
    });
    s.rule([](const O& o, Spelling sp) {
      if (o.block().attention().rotary_base() == 0) return std::string();
      return c10::str("the attention's rotary_base is the model's to set (", spell("positions", sp),
                      " rotary, with ", spell("pos_base", sp), "): leave it 0 in the block's options");
    });
    s.rule([](const O& o, Spelling sp) {
      const auto& b = o.block();
      if (b.attention().out_dropout() == o.dropout() && b.mlp().dropout() == o.dropout()) return std::string();
      return c10::str("the embedding dropout (", o.dropout(), "), the attention's out_dropout (",
                      b.attention().out_dropout(), ") and the MLP's dropout (", b.mlp().dropout(),
                      ") differ: an architecture stores one ", spell("dropout", sp), "; set them equal");
    });
    s.rule([](const O& o, Spelling sp) {
      const auto& b = o.block();
      if (b.attention().bias() == b.mlp().bias()) return std::string();
      return c10::str("the attention's bias (", b.attention().bias(), ") and the MLP's (", b.mlp().bias(),
                      ") differ: an architecture stores one ", spell("bias", sp), "; set them equal");
    });
    return s;
  }();
  return spec;
}

// ---- TinyAttentionLM -----------------------------------------------------------

TinyAttentionLMImpl::TinyAttentionLMImpl(const TinyAttentionLMOptions& options_)
    : options(options_) {
  reset();
}

void TinyAttentionLMImpl::reset() {
  TinyAttentionLMOptions::spec().check(options);
  const int64_t V = options.vocab_size(), D = options.d_model(), C = options.context_length();
  policy_ = std::make_shared<KernelPolicy>(options.kernel_policy());
  token_embedding = register_module("token_embedding", TokenEmbedding(TokenEmbeddingOptions(V, D)));
  sinusoidal_positions = register_module(
      "sinusoidal_positions",
      SinusoidalPositionalEmbedding(
          SinusoidalPositionalEmbeddingOptions(C, D).base(options.pos_base())));
  attention = register_module(
      "attention", MultiHeadSelfAttention(MultiHeadSelfAttentionOptions(D, options.n_heads(), C)
                                              .kernel(options.attention_kernel())
                                              .kernel_policy(policy_)));
  lm_head = register_module("lm_head", torch::nn::Linear(D, V));
}

void TinyAttentionLMImpl::reset_parameters() {
  token_embedding->reset_parameters();
  attention->reset_parameters();
  lm_head->reset_parameters();
}

ModelArchitecture TinyAttentionLMImpl::architecture() const { return architecture_of(options); }

ModelArchitecture architecture_of(const TinyAttentionLMOptions& options) {
  return {"tiny", 1, TinyAttentionLMOptions::spec().write(options)};
}

namespace {

/// The tiny model's tensors for the fused ops where ids (B, T) take them: exactly where
/// its attention would run the fused kernel.
std::optional<TinyLMTensors> fused_tensors(TinyAttentionLMImpl& m, const torch::Tensor& ids,
                                           const KernelPolicy& policy) {
  const auto& options = m.options;
  const auto& attention = m.attention;
  const auto& w = m.token_embedding->weight;
  AttentionCall call;
  call.cuda = w.is_cuda();
  call.fused_supported = w.device().is_cpu() && w.scalar_type() == torch::kFloat32;
  call.seq_len = ids.defined() && ids.dim() == 2 ? ids.size(1) : 0;
  call.dropout = m.is_training() && attention->options.attn_dropout() > 0;
  call.grad_enabled = torch::GradMode::is_enabled();
  const int64_t T = call.seq_len;
  // (Its attention products run on the loops: where the policy wants BLAS, the module runs.)
  if (policy.fuse_whole_model && T >= 1 && T <= options.context_length() && attention->options.causal() &&
      !policy.attention_products_use_blas(T) &&
      policy.attention_kernel(options.attention_kernel(), call) == AttentionKernel::fused) {
    const auto& a = *attention;
    TinyLMTensors tensors{w, m.sinusoidal_positions->forward(T), a.qkv_proj->weight, a.qkv_proj->bias,
                          a.out_proj->weight, a.out_proj->bias, m.lm_head->weight, m.lm_head->bias,
                          options.n_heads(), options.context_length(), kIgnoreTarget};
    if (fused_tiny_lm_supported(tensors)) return tensors;
  }
  return std::nullopt;
}

}  // namespace

torch::Tensor TinyAttentionLMImpl::loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  if (const auto tensors = fused_tensors(*this, ids, *policy_)) return fused_tiny_lm_loss(*tensors, ids, targets, *policy_);
  return LanguageModelImpl::loss(ids, targets);
}

void use_bf16_products(LanguageModelImpl& model) {
  const auto parameters = model.parameters();
  const bool cuda = !parameters.empty() && parameters.front().is_cuda();  // CUDA has bfloat16 products
  TORCH_CHECK(cuda || bf16_products_missing().empty(), "bf16 on the CPU needs bfloat16 products, and ",
              bf16_products_missing(), ": turn bf16 off (float32)");
  auto policy = model.kernel_policy();
  TORCH_CHECK(policy, "bf16 runs the products of tinylm's own Linear layers, and this model (",
              model.architecture().kind, ") uses none: turn bf16 off");
  policy->bf16_products = true;
  model.set_kernel_policy(*policy);
}

void TinyAttentionLMImpl::set_kernel_policy(const KernelPolicy& policy) {
  options.kernel_policy(policy);
  *policy_ = policy;  // the object every module holds
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

torch::Tensor TinyAttentionLMImpl::next_logits(const torch::Tensor& ids, KVCache* cache) {
  // Without a cache, the whole model in one call where the loss would fuse it.
  if (!cache)
    if (const auto tensors = fused_tensors(*this, ids, *policy_)) return fused_tiny_lm_next_logits(*tensors, ids, *policy_);
  check_token_ids("TinyAttentionLM", ids, options.vocab_size(), options.context_length());
  const int64_t T = ids.size(1);
  KVCache scratch;
  KVCache& c = cache ? *cache : scratch;
  c.keys.resize(1);
  c.values.resize(1);
  auto x = token_embedding(ids) + sinusoidal_positions->rows(c.length, T);  // (B, T, D)
  auto h = attention->forward_cached(x, c.keys[0], c.values[0], /*last_only=*/true);  // (B, 1, D)
  c.length += T;
  return lm_head(h).select(1, 0);  // (B, V)
}

torch::Tensor TinyAttentionLMImpl::forward_rows(const torch::Tensor& ids, KVCache& cache) {
  check_token_ids("TinyAttentionLM", ids, options.vocab_size(), options.context_length());
  const auto rows = rows_of("TinyAttentionLM", ids, cache, 1, options.context_length());
  auto x = token_embedding(ids) + rows_at(sinusoidal_positions->rows(0, rows.span), rows);  // (B, 1, D)
  auto h = attention->forward_rows(x, cache.keys[0], cache.values[0], rows);
  for (auto& n : cache.lengths) ++n;
  return lm_head(h);  // (B, 1, V)
}

// ---- TransformerLM -------------------------------------------------------------

const char* to_string(PositionEncoding p) {
  switch (p) {
    case PositionEncoding::learned: return "learned";
    case PositionEncoding::sinusoidal: return "sinusoidal";
    case PositionEncoding::none: return "none";
    case PositionEncoding::rotary: return "rotary";
  }
  return "?";
}

PositionEncoding position_encoding_from_string(const std::string& s) {
  if (s == "learned") return PositionEncoding::learned;
  if (s == "sinusoidal") return PositionEncoding::sinusoidal;
  if (s == "none") return PositionEncoding::none;
  if (s == "rotary") return PositionEncoding::rotary;
  TORCH_CHECK(false, "unknown position encoding '", printable(s), "': use learned, sinusoidal, rotary or none");
}

TransformerLMImpl::TransformerLMImpl(const TransformerLMOptions& options_) : options(options_) {
  reset();
}

void TransformerLMImpl::set_kernel_policy(const KernelPolicy& policy) {
  options.kernel_policy(policy);
  *policy_ = policy;  // the object every module holds
}

ModelArchitecture TransformerLMImpl::architecture() const { return architecture_of(options); }

ModelArchitecture architecture_of(const TransformerLMOptions& options) {
  return {"transformer", 1, TransformerLMOptions::spec().write(options)};
}

void TransformerLMImpl::reset() {
  const int64_t V = options.vocab_size(), C = options.context_length(), D = options.d_model(),
                L = options.n_layers();
  TransformerLMOptions::spec().check(options);
  policy_ = std::make_shared<KernelPolicy>(options.kernel_policy());
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
  auto block = options.block();
  block.kernel_policy(policy_);
  if (options.positions() == PositionEncoding::rotary) block.attention().rotary_base(options.pos_base());
  for (int64_t i = 0; i < L; ++i) blocks->push_back(TransformerBlock(block));
  auto norm = block.norm();
  norm.d_model(D).kernel_policy(policy_);
  ln_f = register_module("ln_f", LayerNorm(norm));
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
    } else if (auto* norm = module->as<LayerNorm>()) {
      norm->reset_parameters();
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
     << ", pre_ln=" << (options.block().pre_ln() ? "true" : "false")
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
  if (!weights && options.block().pre_ln()) {
    // Each block's output as two terms, added by the next norm as it reads them.
    torch::Tensor carry;  // (B, T, D), or undefined: x alone
    for (const auto& module : *blocks)
      std::tie(x, carry) = module->as<TransformerBlock>()->forward_terms(x, carry, padding_mask);
    return carry.defined() ? ln_f->forward_residual(x, carry).second : ln_f(x);  // (B, T, D)
  }
  for (const auto& module : *blocks) {
    auto r = module->as<TransformerBlock>()->forward(x, weights != nullptr, padding_mask);
    x = r.output;                                                  // (B, T, D)
    if (weights) weights->push_back(r.weights);                    // (B, H, T, T)
  }
  return ln_f(x);                                                  // (B, T, D)
}

namespace {

/// The model's tensors for fused_transformer_lm_loss where ids (B, T) and the model's
/// settings take it: exactly where each attention would run its fused kernel and nothing
/// the op leaves out (dropout, rotary or grouped heads, SwiGLU, post-LN) is in use.
std::optional<FusedTransformerLMTensors> fused_tensors(TransformerLMImpl& m, const torch::Tensor& ids,
                                                       const KernelPolicy& policy) {
  const auto& o = m.options;
  const auto& block = o.block();
  const auto& attention = block.attention();
  const int64_t T = ids.size(1);
  const bool training = m.is_training();
  if (!torch::GradMode::is_enabled() || !block.pre_ln() || o.positions() == PositionEncoding::rotary ||
      block.mlp().activation() == Activation::swiglu || !attention.causal() ||
      (attention.n_kv_heads() != 0 && attention.n_kv_heads() != attention.n_heads()) || attention.rotary_base() != 0 ||
      !block.norm().gain() ||
      (training && (o.dropout() > 0 || attention.attn_dropout() > 0 || attention.out_dropout() > 0 ||
                    block.mlp().dropout() > 0)))
    return std::nullopt;
  AttentionCall call;
  call.fused_supported = m.token_embedding->weight.device().is_cpu() &&
                         m.token_embedding->weight.scalar_type() == torch::kFloat32;
  call.seq_len = T;
  call.grad_enabled = true;
  if (policy.attention_kernel(attention.kernel(), call) != AttentionKernel::fused) return std::nullopt;
  FusedTransformerLMTensors t;
  t.embedding = m.token_embedding->weight;
  if (m.learned_positions) t.positions = m.learned_positions(T);
  if (m.sinusoidal_positions) t.positions = m.sinusoidal_positions(T);
  for (const auto& module : *m.blocks) {
    const auto& b = *module->as<TransformerBlock>();
    t.blocks.push_back({b.ln1->weight, b.ln1->bias, b.attn->qkv_proj->weight, b.attn->qkv_proj->bias,
                        b.attn->out_proj->weight, b.attn->out_proj->bias, b.ln2->weight, b.ln2->bias,
                        b.mlp->fc->weight, b.mlp->fc->bias, b.mlp->proj->weight, b.mlp->proj->bias});
  }
  t.final_gain = m.ln_f->weight;
  t.final_bias = m.ln_f->bias;
  if (!o.tie_weights()) t.head_weight = m.lm_head->weight;
  t.n_heads = attention.n_heads();
  t.eps = block.norm().eps();
  t.center = block.norm().kind() != NormKind::rms_norm;
  t.gelu_exact = block.mlp().activation() == Activation::gelu;
  t.ignore_target = kIgnoreTarget;
  if (!fused_transformer_lm_supported(t, T, policy)) return std::nullopt;
  return t;
}

}  // namespace

torch::Tensor TransformerLMImpl::loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  check_token_ids("TransformerLM", ids, options.vocab_size(), options.context_length());
  if (const auto tensors = fused_tensors(*this, ids, *policy_))
    return fused_transformer_lm_loss(*tensors, ids, targets, *policy_);
  return LanguageModelImpl::loss(ids, targets);
}

LMOutput TransformerLMImpl::forward(const torch::Tensor& ids, bool return_weights,
                                    const torch::Tensor& padding_mask) {
  LMOutput out;
  auto h = hidden(ids, padding_mask, return_weights ? &out.attention : nullptr);
  out.logits = linear(h, lm_head_weight(), {}, *policy_);  // (B, T, V)
  return out;
}

namespace {

/// The blocks of `m` over new tokens ids (B, Tn) that follow the cache's, the cache
/// extended: the final norm's input (B, Tn, D), or with next_only (B, 1, D) for the last
/// position alone (the last block makes every key and value, the rest for that position
/// only). Without a cache (next_only), the blocks before the last run the kernels
/// forward() picks.
torch::Tensor cached_blocks(TransformerLMImpl& m, const torch::Tensor& ids, KVCache* cache, bool next_only) {
  check_token_ids("TransformerLM", ids, m.options.vocab_size(), m.options.context_length());
  const int64_t Tn = ids.size(1), L = m.options.n_layers();
  KVCache scratch;
  KVCache& c = cache ? *cache : scratch;
  c.keys.resize(L);
  c.values.resize(L);
  auto x = m.token_embedding(ids);                                               // (B, Tn, D)
  if (m.learned_positions) x = x + m.learned_positions->rows(c.length, Tn);
  if (m.sinusoidal_positions) x = x + m.sinusoidal_positions->rows(c.length, Tn);
  for (int64_t l = 0; l < L; ++l) {
    const auto& block = m.blocks[l]->as<TransformerBlock>();
    if (!cache && l + 1 < L) x = block->forward(x).output;  // (B, Tn, D)
    else x = block->forward_cached(x, c.keys[l], c.values[l], /*last_only=*/next_only && l + 1 == L);
  }
  c.length += Tn;
  return x;
}

}  // namespace

torch::Tensor TransformerLMImpl::forward_cached(const torch::Tensor& ids, KVCache& cache) {
  return linear(ln_f(cached_blocks(*this, ids, &cache, false)), lm_head_weight(), {}, *policy_);  // (B, Tn, V)
}

torch::Tensor TransformerLMImpl::next_logits(const torch::Tensor& ids, KVCache* cache) {
  return linear(ln_f(cached_blocks(*this, ids, cache, true)), lm_head_weight(), {}, *policy_).select(1, 0);  // (B, V)
}

torch::Tensor TransformerLMImpl::forward_rows(const torch::Tensor& ids, KVCache& cache) {
  check_token_ids("TransformerLM", ids, options.vocab_size(), options.context_length());
  const int64_t L = options.n_layers();
  const auto rows = rows_of("TransformerLM", ids, cache, L, options.context_length());
  auto x = token_embedding(ids);  // (B, 1, D)
  if (learned_positions) x = x + rows_at(learned_positions->rows(0, rows.span), rows);
  if (sinusoidal_positions) x = x + rows_at(sinusoidal_positions->rows(0, rows.span), rows);
  for (int64_t l = 0; l < L; ++l) {
    x = blocks[l]->as<TransformerBlock>()->forward_rows(x, cache.keys[l], cache.values[l], rows);
  }
  for (auto& n : cache.lengths) ++n;
  return linear(ln_f(x), lm_head_weight(), {}, *policy_);  // (B, 1, V)
}

}  // namespace tinylm::nn
