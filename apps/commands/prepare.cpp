// tinylm prepare --data TEXT... --out DIR: text -> a tokenizer and token files.
#include "../command.h"

#include <tinylm/data/prepare.h>
#include <tinylm/log.h>

#include <spdlog/fmt/fmt.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace tinylm::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> data;
  std::string tokenizer = "bpe", tokenizer_model, out;
  int64_t vocab_size = 4096, threads = 0;
  double val_fraction = 0.1;
};

/// A progress bar on a terminal; elsewhere a line every 10 s.
class ProgressBar {
 public:
  ProgressBar() : tty_(::isatty(STDERR_FILENO) == 1) {}
  void operator()(const data::PrepareProgress& p) {
    const double mb = p.bytes_done / 1e6, rate = p.seconds > 0 ? mb / p.seconds : 0;
    const bool done = p.bytes_total > 0 && p.bytes_done >= p.bytes_total;
    std::string line = p.phase == "tokenizer" ? "reading for the tokenizer" : "encoding";
    if (p.bytes_total > 0) {
      const double f = std::min(1.0, static_cast<double>(p.bytes_done) / p.bytes_total);
      const int filled = static_cast<int>(f * 24);
      const double eta = rate > 0 ? (p.bytes_total - p.bytes_done) / 1e6 / rate : 0;
      line += fmt::format(" [{}{}] {:3.0f}% {:.1f}/{:.1f} MB, {:.2f} MB/s, ETA {:.0f} s", std::string(filled, '#'),
                          std::string(24 - filled, '.'), 100 * f, mb, p.bytes_total / 1e6, rate, eta);
    } else {
      line += fmt::format(" {:.1f} MB, {:.2f} MB/s", mb, rate);
    }
    if (p.phase == "encode") line += fmt::format(", {} tokens", p.tokens);
    if (tty_) {
      std::fprintf(stderr, "\r%-100s%s", line.c_str(), done ? "\n" : "");
    } else if (done || p.seconds - last_ >= 10) {
      last_ = p.seconds;
      logger()->info("{}", line);
    }
  }

 private:
  bool tty_;
  double last_ = 0;
};

int run_prepare(const PrepareArgs& a) {
  data::PrepareOptions o;
  o.inputs = a.data;
  o.tokenizer = a.tokenizer;
  o.tokenizer_model = a.tokenizer_model;
  o.vocab_size = a.vocab_size;
  o.val_fraction = a.val_fraction;
  o.out_dir = a.out;
  o.sentencepiece.threads = a.threads;
  ProgressBar bar;
  o.progress = [&bar](const data::PrepareProgress& p) { bar(p); };
  const auto sum = data::prepare(o);
  auto log = logger();
  if (!sum.skipped.empty())
    log->warn("skipped {} binary file(s) in the directories given, e.g. {}", sum.skipped.size(), sum.skipped.front());
  const double total_mb = (sum.train_bytes + sum.val_bytes) / 1e6;
  log->info("read {} file(s), {:.2f} MB of text; tokenizer: {}{}", sum.files.size(), total_mb, sum.tokenizer,
            sum.tokenizer_seconds > 0 ? fmt::format(" (trained in {:.1f} s)", sum.tokenizer_seconds) : "");
  log->info("train.bin: {} tokens ({} bytes of text) | val.bin: {} tokens ({} bytes) | {:.3f} bytes per token, "
            "uint{} tokens", sum.train_tokens, sum.train_bytes, sum.val_tokens, sum.val_bytes,
            sum.bytes_per_token(), 8 * sum.token_bytes);
  log->info("encoded at {:.2f} MB/s; wrote {}/{{train.bin, val.bin{}, prepare.json}}; train on it with "
            "--task tokens --data {} --vocab-size {}", sum.encode_seconds > 0 ? total_mb / sum.encode_seconds : 0,
            a.out, sum.tokenizer.rfind("SentencePiece", 0) == 0 ? ", tokenizer.model" : "", a.out, sum.vocab_size);
  return 0;
}

}  // namespace

Command add_prepare(CLI::App& app) {
  auto args = std::make_shared<PrepareArgs>();
  PrepareArgs& prepare_args = *args;
  auto* prepare_cmd = app.add_subcommand("prepare", "text -> tokenizer + token files (train with --task tokens)");
  prepare_cmd->add_option("--data", prepare_args.data,
                          "UTF-8 text: files, directories (their text files) or - (standard input); repeatable")
      ->required();
  prepare_cmd->add_option("--tokenizer", prepare_args.tokenizer,
                          "bpe or unigram (SentencePiece, trained here) or byte")
      ->capture_default_str();
  prepare_cmd->add_option("--tokenizer-model", prepare_args.tokenizer_model,
                          "reuse this SentencePiece .model instead of training one");
  integer(prepare_cmd->add_option("--vocab-size", prepare_args.vocab_size,
                                  "pieces of a trained tokenizer (256 byte pieces included)"))
      ->capture_default_str();
  prepare_cmd->add_option("--val-fraction", prepare_args.val_fraction,
                          "share of the text held out, in blocks spread over the corpus")
      ->capture_default_str();
  integer(prepare_cmd->add_option("--threads", prepare_args.threads, "tokenizer training threads; 0 = all CPUs"))
      ->capture_default_str();
  prepare_cmd->add_option("--out", prepare_args.out, "the directory to write (new, or empty)")->required();

  return {prepare_cmd, [args] { return run_prepare(*args); }};
}

}  // namespace tinylm::cli
