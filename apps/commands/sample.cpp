// tinylm sample CKPT|DIR --prompt "...": generation from a checkpoint, with an attention
// heatmap of the result on request.
#include "../command.h"

#include <tinylm/generate.h>
#include <tinylm/report.h>
#include <tinylm/run.h>
#include <tinylm/train/resources.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::cli {

namespace {

struct SampleArgs {
  std::string checkpoint, prompt, device = "auto", data, attention_json;
  int64_t max_new_tokens = 20, top_k = 0, seed = -1, layer = -1, head = 0, threads = 1;
  double temperature = 1.0, top_p = 1.0;
  bool greedy = false, heatmap = false, raw = false, time = false, bf16 = false;
};

int run_sample(const SampleArgs& a) {
  TORCH_CHECK(a.top_k >= 0, "--top-k must be >= 0 (0 = off), got ", a.top_k);
  TORCH_CHECK(a.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got ", a.max_new_tokens);
  // The running sequence is int64 and copied once per new token.
  const double sequence_bytes = 16.0 * (static_cast<double>(a.max_new_tokens) + a.prompt.size());
  const auto available = train::available_memory_bytes();
  TORCH_CHECK(available == 0 || sequence_bytes < static_cast<double>(available), "--max-new-tokens ",
              a.max_new_tokens, " needs more memory than the ", available >> 20,
              " MiB available: ask for fewer tokens");
  InferenceOptions io;
  io.device = a.device;
  io.data = a.data;
  io.bf16 = a.bf16;
  auto run = open_run(a.checkpoint, a.threads, io);
  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.temperature = a.temperature;
  o.top_k = a.top_k;
  o.top_p = a.top_p;
  o.greedy = a.greedy;
  if (a.seed >= 0) o.seed = static_cast<uint64_t>(a.seed);
  const auto prompt_ids = run.tokenizer->encode(a.prompt);
  TORCH_CHECK(!prompt_ids.empty(), "--prompt is empty: give ",
              run.tokenizer->kind() == "ids" ? "at least one token id, e.g. --prompt \"3 3 3\""
                                             : "some text, e.g. --prompt \"Once upon\"");
  auto prompt = torch::tensor(prompt_ids, torch::kLong).unsqueeze(0);  // (1, T)
  const auto start = std::chrono::steady_clock::now();
  auto out = generate(*run.model, prompt, o).to(torch::kCPU).contiguous();  // (1, T + N)
  if (a.time) {  // the generation alone: after loading, before printing
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto made = out.size(1) - prompt.size(1);
    std::fprintf(stderr, "generated %lld tokens in %.4f s: %.1f tokens/s\n", static_cast<long long>(made), seconds,
                 static_cast<double>(made) / seconds);  // stderr: stdout is the text
  }
  const std::string text =
      run.tokenizer->decode(std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel()));
  // A model's bytes are not trusted with a terminal: control characters other than
  // newlines and tabs are shown as \xNN there (an escape sequence could move the cursor,
  // retitle the window or worse); a pipe or a file gets the bytes, as does --raw.
  const bool escape = !a.raw && ::isatty(STDOUT_FILENO) == 1;
  const std::string shown = escape ? terminal_text(text) : text;
  std::fwrite(shown.data(), 1, shown.size(), stdout);
  std::fputc('\n', stdout);
  if (a.heatmap || !a.attention_json.empty()) {
    const int64_t C = run.model->context_length(), T = out.size(1);
    auto window = out.narrow(1, std::max<int64_t>(0, T - C), std::min(T, C));
    torch::NoGradGuard no_grad;
    auto att = run.model->forward(window.to(run.device), true).attention;
    const int64_t L = static_cast<int64_t>(att.size());
    const int64_t layer = a.layer < 0 ? L + a.layer : a.layer;
    TORCH_CHECK(layer >= 0 && layer < L, "--layer ", a.layer, " is out of range: the model has ", L,
                " attention layer(s)");
    const int64_t H = att[layer].size(1);
    TORCH_CHECK(a.head >= 0 && a.head < H, "--head ", a.head, " is out of range [0, ", H, ")");
    auto w = att[layer][0][a.head].to(torch::kCPU);  // (T, T)
    if (a.heatmap) {
      std::printf("attention, layer %lld head %lld, over the last %lld tokens:\n%s",
                  static_cast<long long>(layer), static_cast<long long>(a.head),
                  static_cast<long long>(window.size(1)), ascii_heatmap(w).c_str());
    }
    if (!a.attention_json.empty()) {
      auto ids = window.to(torch::kCPU).reshape({-1});
      const nlohmann::ordered_json doc = {
          {"layer", layer},
          {"head", a.head},
          {"tokens", std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel())},
          {"weights", [&] {
             auto rows = nlohmann::json::array();
             auto wc = w.contiguous();
             for (int64_t i = 0; i < wc.size(0); ++i)
               rows.push_back(std::vector<float>(wc[i].data_ptr<float>(), wc[i].data_ptr<float>() + wc.size(1)));
             return rows;
           }()}};
      std::ofstream f(a.attention_json);
      TORCH_CHECK(f, "cannot write '", a.attention_json, "'");
      f << doc.dump() << "\n";
      TORCH_CHECK(f.flush(), "cannot write '", a.attention_json, "'");
    }
  }
  return 0;
}

}  // namespace

Command add_sample(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  SampleArgs& s = *args;
  auto* sample_cmd = app.add_subcommand("sample", "generate tokens from a checkpoint");
  sample_cmd->add_option("checkpoint", s.checkpoint, "checkpoint file or run directory")->required();
  sample_cmd->add_option("--prompt", s.prompt,
                         "token ids (\"3 3 3\") for synthetic tasks, text for text and tokens")->required();
  integer(sample_cmd->add_option("--max-new-tokens", s.max_new_tokens, "tokens to generate"))->capture_default_str();
  sample_cmd->add_option("--temperature", s.temperature, "> 0; lower is more deterministic")->capture_default_str();
  integer(sample_cmd->add_option("--top-k", s.top_k, "keep the k most likely tokens; 0 = off"))->capture_default_str();
  sample_cmd->add_option("--top-p", s.top_p, "nucleus sampling threshold in (0, 1]; 1 = off")->capture_default_str();
  integer(sample_cmd->add_option("--seed", s.seed, "sampling seed; -1 = unseeded"))->capture_default_str();
  sample_cmd->add_flag("--greedy", s.greedy, "always take the most likely token");
  sample_cmd->add_flag("--bf16", s.bf16, "the model's products in bfloat16 (CUDA, or a CPU with AVX512-BF16 or AMX)");
  sample_cmd->add_flag("--time", s.time, "print the generation's tokens/s on stderr (after loading, before printing)");
  sample_cmd->add_flag("--heatmap", s.heatmap, "print the attention heatmap of the result");
  sample_cmd->add_flag("--raw", s.raw,
                       "write the generated bytes as they are even to a terminal (there, control "
                       "characters other than newlines and tabs are shown as \\xNN by default)");
  integer(sample_cmd->add_option("--layer", s.layer, "heatmap layer; -1 = last"))->capture_default_str();
  integer(sample_cmd->add_option("--head", s.head, "heatmap head"))->capture_default_str();
  sample_cmd->add_option("--attention-json", s.attention_json,
                         "write that head's weights as JSON (for scripts/plot.py)");
  sample_cmd->add_option("--device", s.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  integer(sample_cmd->add_option("--threads", s.threads, "intra-op CPU threads; 0 = default"))->capture_default_str();
  sample_cmd->add_option("--data", s.data, "tokens task, checkpoint without a tokenizer: the prepared corpus");

  return {sample_cmd, [args] { return run_sample(*args); }};
}

}  // namespace tinylm::cli
