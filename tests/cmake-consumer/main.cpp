// Your own model and your own task, trained, saved, reloaded and evaluated by tinylm.
//   ./consumer [OUT_DIR] [STEPS]      (defaults: counting-run, 200)
#include <tinylm/tinylm.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
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

// A model: each token's embedding through a small MLP to next-token logits.
class NextTokenMLPImpl : public tinylm::nn::LanguageModelImpl {
 public:
  NextTokenMLPImpl(int64_t vocab, int64_t width) : vocab_(vocab), width_(width) {
    embed = register_module("embed", torch::nn::Embedding(vocab, width));
    hidden = register_module("hidden", torch::nn::Linear(width, width));
    head = register_module("head", torch::nn::Linear(width, vocab));
  }
  tinylm::nn::LMOutput forward(const torch::Tensor& ids, bool /*return_weights*/,
                               const torch::Tensor& /*padding_mask*/) override {
    return {head(torch::gelu(hidden(embed(ids)))), {}};  // (B, T, V)
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t context_length() const override { return 1024; }
  torch::Tensor forward_cached(const torch::Tensor& ids, tinylm::nn::KVCache& cache) override {
    cache.length += ids.size(1);  // nothing to cache: every position stands alone
    return forward(ids, false, {}).logits;
  }
  // Stored in checkpoints, so the model can be rebuilt from one.
  tinylm::nn::ModelArchitecture architecture() const override {
    return {"next-token-mlp", 1, {{"vocab", std::to_string(vocab_)}, {"width", std::to_string(width_)}}};
  }

  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear hidden{nullptr}, head{nullptr};

 private:
  int64_t vocab_, width_;
};

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

    auto model = std::make_shared<NextTokenMLPImpl>(16, 32);
    auto task = std::make_shared<CountingTask>();
    tinylm::train::TrainerOptions options;
    options.epochs(1).steps_per_epoch(steps).batch_size(32).log_every(50).out_dir(out_dir);
    options.optimizer().kind(tinylm::train::OptimizerKind::adamw).lr(1e-2).weight_decay(0.01);
    tinylm::train::Trainer trainer(model, task, options);
    const auto result = trainer.fit();  // checkpoints and metrics.jsonl in out_dir
    std::printf("tinylm %s: %lld steps, validation loss %.4f, accuracy %.1f%%\n",
                TINYLM_VERSION_STRING, static_cast<long long>(result.end_step),
                result.last_eval.loss, 100 * result.last_eval.accuracy);

    // A fresh model from the last checkpoint, evaluated on batches it has not seen.
    const auto checkpoint = tinylm::train::read_checkpoint(result.last_checkpoint);
    const auto& stored = checkpoint.architecture.options;
    auto reloaded = std::make_shared<NextTokenMLPImpl>(std::stoll(stored.at("vocab")),
                                                       std::stoll(stored.at("width")));
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
