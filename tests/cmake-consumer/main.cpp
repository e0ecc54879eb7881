// Your own model and your own task, trained, saved, reloaded and evaluated by tinylm.
//   ./consumer [OUT_DIR] [STEPS]      (defaults: counting-run, 200)
#include <tinylm/tinylm.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace {

// A task: rows that count up in steps of 3 modulo 16, from a random start. Every next
// token follows from the current one, so a model can reach 100% accuracy.
class CountingTask : public tinylm::data::Task {
 public:
  std::string name() const override { return "counting"; }
  int64_t vocab_size() const override { return 16; }
  int64_t seq_len() const override { return 8; }
  tinylm::data::Batch sample(int64_t batch_size, tinylm::data::Split,
                             at::Generator& gen) override {
    auto start = torch::randint(16, {batch_size, 1}, gen, torch::kLong);
    auto rows = (start + 3 * torch::arange(9, torch::kLong)).remainder(16);  // (B, T + 1)
    return {rows.narrow(1, 0, 8), rows.narrow(1, 1, 8),                     // inputs, targets
            torch::ones({batch_size, 8}, torch::kBool)};                    // all scored
  }
};

// A model: each token's embedding through a small MLP to next-token logits. Its options
// are declared once, in its spec: from it come what a checkpoint stores, the parser that
// reads it back, and the checks.
struct NextTokenMLPOptions {
  explicit NextTokenMLPOptions(int64_t vocab_size) : vocab_size_(vocab_size) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, width) = 32;

 public:
  static const tinylm::OptionSpec<NextTokenMLPOptions>& spec() {
    static const auto s = [] {
      tinylm::OptionSpec<NextTokenMLPOptions> out("NextTokenMLP");
      out.add(TINYLM_OPTION(NextTokenMLPOptions, vocab_size), "vocabulary size", tinylm::at_least(2)).required();
      out.add(TINYLM_OPTION(NextTokenMLPOptions, width), "hidden width", tinylm::at_least(1));
      return out;
    }();
    return s;
  }
};

class NextTokenMLPImpl : public tinylm::nn::LanguageModelImpl {
 public:
  explicit NextTokenMLPImpl(const NextTokenMLPOptions& o) : options(o) {
    NextTokenMLPOptions::spec().check(options);
    embed = register_module("embed", torch::nn::Embedding(o.vocab_size(), o.width()));
    hidden = register_module("hidden", torch::nn::Linear(o.width(), o.width()));
    head = register_module("head", torch::nn::Linear(o.width(), o.vocab_size()));
  }
  tinylm::nn::LMOutput forward(const torch::Tensor& ids, bool /*return_weights*/,
                               const torch::Tensor& /*padding_mask*/) override {
    return {head(torch::gelu(hidden(embed(ids)))), {}};  // (B, T, V)
  }
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t context_length() const override { return 1024; }
  torch::Tensor forward_cached(const torch::Tensor& ids, tinylm::nn::KVCache& cache) override {
    cache.length += ids.size(1);  // nothing to cache: every position stands alone
    return forward(ids, false, {}).logits;
  }
  // Stored in checkpoints, so that build_model() can rebuild the model from one.
  tinylm::nn::ModelArchitecture architecture() const override {
    return {"next-token-mlp", 1, NextTokenMLPOptions::spec().write(options)};
  }

  NextTokenMLPOptions options;
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear hidden{nullptr}, head{nullptr};
};

// The parameter count from the options alone: build_model() checks that the weights fit
// in memory before it allocates them.
double next_token_mlp_parameters(const NextTokenMLPOptions& o) {
  const double v = static_cast<double>(o.vocab_size()), w = static_cast<double>(o.width());
  return v * w + (w * w + w) + (w * v + v);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string out_dir = argc > 1 ? argv[1] : "counting-run";
    const std::string steps_text = argc > 2 ? argv[2] : "200";
    char* end = nullptr;
    const int64_t steps = std::strtoll(steps_text.c_str(), &end, 10);
    TORCH_CHECK(!steps_text.empty() && *end == '\0', "STEPS must be a whole number, got '",
                steps_text, "'");
    tinylm::set_cpu_threads(1);  // process-wide settings are the program's to make
    torch::manual_seed(0);       // the model's initial weights
    // The kind joins tinylm's own: build_model() can now rebuild it from a checkpoint.
    tinylm::nn::register_model_kind(tinylm::nn::model_kind<NextTokenMLPImpl>(
        "next-token-mlp", 1, "an MLP from each token to the next", NextTokenMLPOptions::spec(),
        NextTokenMLPOptions(0), std::function<double(const NextTokenMLPOptions&)>(next_token_mlp_parameters)));

    auto model = std::make_shared<NextTokenMLPImpl>(NextTokenMLPOptions(16).width(32));
    auto task = std::make_shared<CountingTask>();
    tinylm::train::TrainerOptions options;
    options.epochs(1).steps_per_epoch(steps).batch_size(32).log_every(50).out_dir(out_dir);
    options.optimizer().kind(tinylm::train::OptimizerKind::adamw).lr(1e-2).weight_decay(0.01);
    tinylm::train::Trainer trainer(model, task, options);
    const auto result = trainer.fit();  // checkpoints and metrics.jsonl in out_dir
    std::printf("tinylm %s: %lld steps, validation loss %.4f, accuracy %.1f%%\n",
                TINYLM_VERSION_STRING, static_cast<long long>(result.end_step),
                result.last_eval.loss, 100 * result.last_eval.accuracy);

    // A fresh model from the last checkpoint, built by the same path as tinylm's own
    // kinds, and evaluated on batches it has not seen.
    const auto checkpoint = tinylm::train::read_checkpoint(result.last_checkpoint);
    auto reloaded = tinylm::nn::build_model(checkpoint.architecture);
    tinylm::train::load_model_state(checkpoint, *reloaded);
    const auto m = tinylm::train::evaluate(*reloaded, *task, /*batches=*/4, /*batch_size=*/64,
                                           /*seed=*/7, torch::kCPU);
    std::printf("reloaded %s: accuracy %.1f%% on new batches\n", checkpoint.path.c_str(),
                100 * m.accuracy);
    if (m.accuracy < 0.99) {
      std::fprintf(stderr, "error: accuracy %.3f is below the 99%% target\n", m.accuracy);
      return 1;
    }
    return 0;
  } catch (const c10::Error& e) {  // tinylm's and LibTorch's errors: one line, the fix
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
