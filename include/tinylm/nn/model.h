// Language models: the reference TinyAttentionLM and the TransformerLM block stack.
// B = batch, T = sequence length, D = d_model, V = vocab size, L = layers, H = heads
#pragma once

#include <tinylm/nn/attention.h>
#include <tinylm/nn/block.h>
#include <tinylm/nn/embedding.h>
#include <tinylm/spec.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tinylm::nn {

/// What a language model returns.
struct LMOutput {
  torch::Tensor logits;                  // (B, T, V)
  std::vector<torch::Tensor> attention;  // one (B, H, T, T) per attention layer, if asked
};

/// Keys and values of the tokens decoded so far, one pair per attention layer, each
/// (B, Hkv, length, Dh). Start empty; forward_cached() fills it.
struct KVCache {
  std::vector<torch::Tensor> keys, values;
  int64_t length = 0;
  /// Rows of different lengths (continuous batching, forward_rows()): row b's token count;
  /// keys and values are then (B, Hkv, room, Dh) with row b's tokens in columns
  /// [0, lengths[b]), room > max(lengths). Empty: every row has `length` tokens.
  std::vector<int64_t> lengths;
};

/// What a checkpoint records of a model so that it can be rebuilt without the code that
/// configured it: the model's kind, the version of that kind's option set, and every
/// option as text. build_model() reads it back for tinylm's own kinds.
struct ModelArchitecture {
  std::string kind;                             // "tiny", "transformer", or a user's name
  int64_t version = 1;                          // of this kind's options
  std::map<std::string, std::string> options;   // option name -> value
};

/// Targets equal to this are left out of loss(): positions nothing can predict.
constexpr int64_t kIgnoreTarget = -100;

/// The interface every language model implements, tinylm's own and a user's, so that
/// training, evaluation and generation work with any of them. Derive from it (it is a
/// torch::nn::Module), register parameters as usual and implement the pure virtual
/// functions; derive from CloneableLanguageModel<YourImpl> instead to get clone().
class LanguageModelImpl : public torch::nn::Module {
 public:
  /// ids: (B, T) int64 in [0, V), T <= context_length().
  virtual LMOutput forward(const torch::Tensor& ids, bool return_weights = false,
                           const torch::Tensor& padding_mask = {}) = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t context_length() const = 0;
  /// Incremental decoding: logits (B, Tn, V) for new tokens ids (B, Tn) that follow the
  /// cache's; the cache is extended. cache.length + Tn must not exceed the context.
  virtual torch::Tensor forward_cached(const torch::Tensor& ids, KVCache& cache) = 0;

  /// Generation's step: logits (B, V) for the token after ids (B, T), i.e. the last
  /// position of forward(ids).logits, or with a cache of forward_cached(ids, *cache) (the
  /// cache extended alike). A model may leave out what only the earlier positions' logits
  /// need (tinylm's do: the last block and the head run for the last position alone), so
  /// the logits equal those calls' to float rounding. The default is those calls.
  virtual torch::Tensor next_logits(const torch::Tensor& ids, KVCache* cache = nullptr);

  /// Continuous batching: one new token for each row of a cache whose rows have different
  /// lengths (cache.lengths; keys and values with room for one more column past the
  /// longest), ids (B, 1) -> logits (B, 1, V); each row's key and value are written in
  /// place at its own column, and cache.lengths advance. Row b's logits are those
  /// forward_cached() gives it alone (to float rounding). The default throws: a model
  /// without it says so in supports_rows(), and BatchDecoder then decodes its rows one by one.
  virtual torch::Tensor forward_rows(const torch::Tensor& ids, KVCache& cache);
  virtual bool supports_rows() const { return false; }

  /// Mean next-token cross-entropy (a 0-dim float32 tensor) of ids (B, T) against
  /// targets (B, T) int64, over the positions whose target is not kIgnoreTarget. Training
  /// and evaluation both use it. The default is next_token_loss(forward(ids).logits,
  /// targets); a model overrides it where it has a faster way to the same number.
  virtual torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets);

  /// What a checkpoint stores to rebuild this model (see ModelArchitecture). The default
  /// names the C++ type with no options: such a model is rebuilt by the user's code.
  virtual ModelArchitecture architecture() const;

  /// Every kernel choice this model makes from now on (KernelPolicy); the default keeps
  /// none (a model without tinylm's kernels).
  virtual void set_kernel_policy(const KernelPolicy& policy) { (void)policy; }
  /// The kernel choices this model makes now, or nullopt for a model without tinylm's
  /// kernels (the default): what a caller changes one field of (the trainer's bf16 on the CPU).
  virtual std::optional<KernelPolicy> kernel_policy() const { return std::nullopt; }
};
using LanguageModel = std::shared_ptr<LanguageModelImpl>;

/// torch::nn::Cloneable for language models (which cannot derive from both it and
/// LanguageModelImpl: both are Modules, and LibTorch 2's Cloneable is not a virtual
/// base). Derived has `options` and a constructor taking them, which calls reset() to
/// build the submodules; clone() builds a new Derived from the same options and copies
/// every parameter and buffer into it (onto `device` when given), in the same mode.
template <typename Derived>
class CloneableLanguageModel : public LanguageModelImpl {
 public:
  /// Builds the submodules from the options (the constructor calls it).
  virtual void reset() = 0;

  std::shared_ptr<torch::nn::Module> clone(
      const c10::optional<torch::Device>& device = c10::nullopt) const override {
    torch::NoGradGuard no_grad;
    const auto& self = static_cast<const Derived&>(*this);
    auto copy = std::make_shared<Derived>(self.options);
    copy->train(self.is_training());
    auto copy_all = [&](auto&& from, auto&& to) {
      TORCH_CHECK(from.size() == to.size(), "clone: the copy has ", to.size(), " tensors, the original ",
                  from.size());
      for (auto& item : to) {
        const auto& source = from[item.key()];
        item.value().set_data(device ? source.to(*device) : source.clone());
      }
    };
    copy_all(self.named_parameters(), copy->named_parameters());
    copy_all(self.named_buffers(), copy->named_buffers());
    return copy;
  }
};

/// Mean cross-entropy of logits (B, T, V) against targets (B, T), computed in float32 and
/// skipping kIgnoreTarget; with `per_position`, the (B, T) losses instead (0 where ignored).
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                              bool per_position = false);

/// The model of that architecture, of any registered kind (tinylm's "tiny" and
/// "transformer", or a program's own: see model_kind.h), on the CPU, initialised from
/// LibTorch's default generator, after its options are checked and its weights are found
/// to fit in memory. Options it does not know are skipped with a warning, missing ones
/// take their defaults (those without one are an error); an unknown kind is an error.
LanguageModel build_model(const ModelArchitecture& architecture);

/// Sets the model's KernelPolicy::bf16_products (its Linear layers' products in bfloat16
/// from now on: on the CPU through tinylm's gemm_bf16, float32 sums; on CUDA for inference,
/// cuBLAS with the result rounded to bfloat16 as autocast's is). Throws, saying why, where
/// the model is on the CPU and the CPU or the build has no bfloat16 products
/// (bf16_products_missing()), or where the model uses none of tinylm's kernels (a kind
/// whose kernel_policy() is nullopt). Call it after moving the model to its device.
void use_bf16_products(LanguageModelImpl& model);

/// The number of parameter elements build_model() would make (a tied tensor once),
/// computed from the options alone: nothing is allocated. Throws as build_model() does on
/// an unknown kind or unreadable options, and on a kind that gives no count. A checkpoint's architecture is checked against
/// the weights it stores with it before any model is built.
int64_t parameter_count(const ModelArchitecture& architecture);

/// The same count in double, for sizes too large to exist (a memory estimate of a
/// mistyped 1e12 must give a huge number, not an error).
double parameter_elements(const ModelArchitecture& architecture);

/// Checks ids for any language model: rank 2, int64, 1 <= T <= context, ids in [0, V).
void check_token_ids(const char* who, const torch::Tensor& ids, int64_t vocab_size,
                     int64_t context_length);

// ---- the reference model -------------------------------------------------------

/// Constructor arguments in one order for every tinylm model: vocabulary, context,
/// width, heads (then layers). Everything else is a named option.
struct TinyAttentionLMOptions {
  TinyAttentionLMOptions(int64_t vocab_size, int64_t context_length, int64_t d_model,
                         int64_t n_heads)
      : vocab_size_(vocab_size), context_length_(context_length), d_model_(d_model),
        n_heads_(n_heads) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, context_length);
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, n_heads);
  TORCH_ARG(double, pos_base) = 10000.0;
  /// The attention kernel; with `fused` or `automatic`, loss() also runs the whole model
  /// as one fused op where the attention would pick the fused kernel.
  TORCH_ARG(AttentionKernel, attention_kernel) = AttentionKernel::automatic;
  /// Thresholds and backends of the kernel choices (not part of the architecture).
  TORCH_ARG(KernelPolicy, kernel_policy);

  /// Every option above but kernel_policy, each with its rule and help: what the
  /// architecture stores, its parser and the model's validation.
 public:
  static const OptionSpec<TinyAttentionLMOptions>& spec();
};

/// Token embedding + sinusoidal positions -> one causal MultiHeadSelfAttention ->
/// LM head Linear(D, V). No norm, no MLP, no residual: exactly the reference.
class TinyAttentionLMImpl : public CloneableLanguageModel<TinyAttentionLMImpl> {
 public:
  explicit TinyAttentionLMImpl(const TinyAttentionLMOptions& options);
  /// Builds the submodules from the options (the constructor calls it).
  void reset() override;
  /// Draws fresh weights, as at construction.
  void reset_parameters();
  void pretty_print(std::ostream& os) const override;
  LMOutput forward(const torch::Tensor& ids, bool return_weights = false,
                   const torch::Tensor& padding_mask = {}) override;
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t context_length() const override { return options.context_length(); }
  torch::Tensor forward_cached(const torch::Tensor& ids, KVCache& cache) override;
  torch::Tensor next_logits(const torch::Tensor& ids, KVCache* cache = nullptr) override;
  torch::Tensor forward_rows(const torch::Tensor& ids, KVCache& cache) override;
  bool supports_rows() const override { return true; }
  /// The fused whole-model loss where the attention would pick its fused kernel, the
  /// default otherwise.
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets) override;
  ModelArchitecture architecture() const override;
  void set_kernel_policy(const KernelPolicy& policy) override;
  std::optional<KernelPolicy> kernel_policy() const override { return *policy_; }

  TinyAttentionLMOptions options;
  TokenEmbedding token_embedding{nullptr};
  SinusoidalPositionalEmbedding sinusoidal_positions{nullptr};
  MultiHeadSelfAttention attention{nullptr};
  torch::nn::Linear lm_head{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(false)},
                           {2, torch::nn::AnyValue(torch::Tensor())})

 private:
  /// The policy every module of this model holds (one object: set_kernel_policy()
  /// changes it in place).
  std::shared_ptr<KernelPolicy> policy_;
};
TORCH_MODULE(TinyAttentionLM);

/// The architecture a TinyAttentionLM with these options reports (without building it).
ModelArchitecture architecture_of(const TinyAttentionLMOptions& options);

// ---- the block stack -----------------------------------------------------------

/// How a transformer knows positions: added to the embeddings (learned, sinusoidal), as
/// rotations of each attention's queries and keys (rotary, RoPE), or not at all.
enum class PositionEncoding { learned, sinusoidal, none, rotary };
const char* to_string(PositionEncoding p);
/// "learned" | "sinusoidal" | "rotary" | "none"; throws on anything else.
PositionEncoding position_encoding_from_string(const std::string& s);

/// The model's own settings (vocabulary, depth, embeddings, head) and one block's
/// options, which every block and the final norm (block.norm) are built from. The shape
/// (width, heads, context) is the block's: set here, it is set in every part.
struct TransformerLMOptions {
  TransformerLMOptions(int64_t vocab_size, int64_t context_length, int64_t d_model,
                       int64_t n_heads, int64_t n_layers)
      : vocab_size_(vocab_size), n_layers_(n_layers), block_(d_model, n_heads, context_length) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, n_layers);
  TORCH_ARG(TransformerBlockOptions, block);

 public:
  int64_t context_length() const { return block_.context_length(); }
  int64_t d_model() const { return block_.d_model(); }
  int64_t n_heads() const { return block_.n_heads(); }
  TransformerLMOptions& context_length(int64_t c) { return shape(d_model(), n_heads(), c); }
  TransformerLMOptions& d_model(int64_t d) { return shape(d, n_heads(), context_length()); }
  TransformerLMOptions& n_heads(int64_t h) { return shape(d_model(), h, context_length()); }
  TransformerLMOptions& shape(int64_t d_model, int64_t n_heads, int64_t context_length) {
    block_.shape(d_model, n_heads, context_length);
    return *this;
  }

  /// Dropout after the embeddings. (The residual branches' are the block's:
  /// block.attention.out_dropout and block.mlp.dropout; the stored option `dropout` sets
  /// all three.)
  TORCH_ARG(double, dropout) = 0.0;
  /// LM head (no bias) shares its weight with the token embedding: one parameter.
  TORCH_ARG(bool, tie_weights) = true;
  TORCH_ARG(PositionEncoding, positions) = PositionEncoding::learned;
  TORCH_ARG(double, pos_base) = 10000.0;
  /// Thresholds and backends of the kernel choices (not part of the architecture).
  TORCH_ARG(KernelPolicy, kernel_policy);

  /// The options as an architecture stores them, under the names they have always had:
  /// the model's own and its block's parts' (mlp_expansion is block.mlp.expansion; bias
  /// sets the attention's and the MLP's; see docs/configs.md).
 public:
  static const OptionSpec<TransformerLMOptions>& spec();
};

/// Token embedding + positions -> dropout -> L blocks -> final LayerNorm -> LM head.
/// Init (GPT-2): Linear/Embedding weights N(0, 0.02), biases 0, and the residual
/// projections (attn.out_proj, mlp.proj) N(0, 0.02 / sqrt(2 L)).
class TransformerLMImpl : public CloneableLanguageModel<TransformerLMImpl> {
 public:
  explicit TransformerLMImpl(const TransformerLMOptions& options);
  /// Builds the submodules from the options and initialises them (GPT-2); the
  /// constructor calls it.
  void reset() override;
  /// Draws fresh weights, as at construction.
  void reset_parameters();
  void pretty_print(std::ostream& os) const override;
  LMOutput forward(const torch::Tensor& ids, bool return_weights = false,
                   const torch::Tensor& padding_mask = {}) override;
  /// The final LayerNorm's output (B, T, D), before the LM head.
  torch::Tensor hidden(const torch::Tensor& ids, const torch::Tensor& padding_mask = {},
                       std::vector<torch::Tensor>* weights = nullptr);
  /// The LM head's weight (V, D): the token embedding's own tensor when tied.
  torch::Tensor lm_head_weight() const;
  /// Training's loss: where the model and the policy allow (pre-LN blocks with GELU and
  /// plain causal attention, no dropout, bfloat16 products on the CPU, autograd on), the
  /// whole model as one op with the same arithmetic; else LanguageModel's.
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets) override;
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t context_length() const override { return options.context_length(); }
  torch::Tensor forward_cached(const torch::Tensor& ids, KVCache& cache) override;
  torch::Tensor next_logits(const torch::Tensor& ids, KVCache* cache = nullptr) override;
  torch::Tensor forward_rows(const torch::Tensor& ids, KVCache& cache) override;
  bool supports_rows() const override { return true; }
  ModelArchitecture architecture() const override;
  void set_kernel_policy(const KernelPolicy& policy) override;
  std::optional<KernelPolicy> kernel_policy() const override { return *policy_; }

  TransformerLMOptions options;
  TokenEmbedding token_embedding{nullptr};
  LearnedPositionalEmbedding learned_positions{nullptr};         // positions == learned
  SinusoidalPositionalEmbedding sinusoidal_positions{nullptr};   // positions == sinusoidal
  torch::nn::ModuleList blocks{nullptr};
  LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // only when not tied

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(false)},
                           {2, torch::nn::AnyValue(torch::Tensor())})

 private:
  /// The policy every module of this model holds (one object: set_kernel_policy()
  /// changes it in place).
  std::shared_ptr<KernelPolicy> policy_;
};
TORCH_MODULE(TransformerLM);

/// The architecture a TransformerLM with these options reports (without building it).
ModelArchitecture architecture_of(const TransformerLMOptions& options);

/// architecture_of()'s inverse: a "transformer" architecture's options, read and checked
/// (throws as build_model() does on another kind or a bad option), without building it.
TransformerLMOptions transformer_options(const ModelArchitecture& architecture);

/// Number of distinct parameter tensors' elements: a tied tensor counts once.
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace tinylm::nn
