// The run configuration: field table, validation and TOML reading/writing.
#include <tinylm/config.h>

#include "internal/system.h"
#include "internal/toml_text.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace tinylm {

namespace {

using R = RunConfig;

// Edit distance, for "did you mean" hints on misspelt keys.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& key) {
  const ConfigField* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& f : config_fields()) {
    const size_t d = edit_distance(key, f.name);
    if (d < best_d) best_d = d, best = &f;
  }
  if (best && best_d <= 3) return std::string(" (did you mean '") + best->name + "'?)";
  return " (a printed config lists every key)";
}

std::string format_double(double v) {
  std::ostringstream os;
  os << std::setprecision(std::numeric_limits<double>::max_digits10) << v;
  std::string s = os.str();
  // Shortest form that reads back exactly.
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream t;
    t << std::setprecision(p) << v;
    if (std::strtod(t.str().c_str(), nullptr) == v) {  // strtod: no exception past DBL_MAX
      s = t.str();
      break;
    }
  }
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a TOML float
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

void check_one_of(const char* key, const std::string& value, std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += list.empty() ? a : std::string(", ") + a;
  }
  TORCH_CHECK(false, key, " must be one of ", list, ", got '", internal::printable(value), "'");
}

}  // namespace

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = {
      {"model", "model", "tiny (the reference TinyAttentionLM) or transformer", &R::model},
      {"vocab-size", "model", "vocabulary size (text task: 256, byte-level; tokens task: the corpus's)", &R::vocab_size},
      {"d-model", "model", "embedding width", &R::d_model},
      {"n-heads", "model", "attention heads", &R::n_heads},
      {"n-layers", "model", "transformer blocks (transformer)", &R::n_layers},
      {"context-length", "model", "model context; 0 = seq-len", &R::context_length},
      {"positions", "model", "learned, sinusoidal or none (transformer)", &R::positions},
      {"pre-ln", "model", "pre-LN blocks; false = post-LN (transformer)", &R::pre_ln},
      {"activation", "model", "MLP GELU: gelu-tanh (tanh approximation) or gelu (exact, as nanoGPT) (transformer)", &R::activation},
      {"tie-weights", "model", "tie the LM head to the token embedding (transformer)", &R::tie_weights},
      {"dropout", "model", "embedding and residual dropout (transformer)", &R::dropout},
      {"attn-dropout", "model", "attention-weight dropout (transformer)", &R::attn_dropout},
      {"bias", "model", "biases in Linear layers (transformer)", &R::bias},
      {"mlp-expansion", "model", "MLP hidden width / d-model (transformer)", &R::mlp_expansion},
      {"fused-attention", "model", "fused CPU kernels where they apply: attention, and the tiny model's whole loss (same results)", &R::fused_attention},
      {"task", "task", "repeat, copy, reverse, sort, text (a file's bytes, in memory) or tokens (a prepared corpus, memory-mapped)", &R::task},
      {"seq-len", "task", "tokens per training sequence", &R::seq_len},
      {"data", "task", "text task: the training text file; tokens task: the directory tinylm prepare made", &R::data},
      {"val-fraction", "task", "text task: fraction of the file held out for validation", &R::val_fraction},
      {"optimizer", "optim", "adam or adamw (adamw: no decay on biases, norms, embeddings)", &R::optimizer},
      {"lr", "optim", "peak learning rate", &R::lr},
      {"weight-decay", "optim", "AdamW weight decay", &R::weight_decay},
      {"beta1", "optim", "Adam beta1", &R::beta1},
      {"beta2", "optim", "Adam beta2", &R::beta2},
      {"lr-schedule", "optim", "constant or cosine (after warmup)", &R::lr_schedule},
      {"warmup-steps", "optim", "linear warmup steps", &R::warmup_steps},
      {"min-lr-ratio", "optim", "cosine floor as a fraction of lr", &R::min_lr_ratio},
      {"grad-clip", "optim", "max global gradient norm; 0 = off", &R::grad_clip},
      {"grad-accum", "optim", "micro-batches per optimizer step", &R::grad_accum},
      {"fused-optimizer", "optim", "Adam/AdamW fused over one flat parameter buffer", &R::fused_optimizer},
      {"batch-size", "optim", "sequences per micro-batch", &R::batch_size},
      {"epochs", "optim", "epochs", &R::epochs},
      {"steps-per-epoch", "optim", "optimizer steps per epoch", &R::steps_per_epoch},
      {"seed", "run", "seed for weights, data and dropout", &R::seed},
      {"device", "run", "auto, cpu, cuda or cuda:N", &R::device},
      {"bf16", "run", "bf16 autocast (CUDA only)", &R::bf16},
      {"threads", "run", "CPU threads for LibTorch and OpenBLAS; 0 = their defaults", &R::threads},
      {"log-every", "run", "steps between progress lines", &R::log_every},
      {"eval-every", "run", "steps between validations; 0 = once per epoch", &R::eval_every},
      {"eval-batches", "run", "batches per validation", &R::eval_batches},
      {"out-dir", "run", "directory for checkpoints and metrics.jsonl", &R::out_dir},
      {"save-every", "run", "steps between checkpoints; 0 = once per epoch", &R::save_every},
      {"keep-last", "run", "step checkpoints to keep (best.ckpt is extra)", &R::keep_last},
      {"stop-when-solved", "run", "stop once validation accuracy is 100% and loss < solve-loss", &R::stop_when_solved},
      {"solve-loss", "run", "validation loss below which a solved task may stop", &R::solve_loss},
  };
  return fields;
}

const ConfigField* find_config_field(const std::string& name) {
  for (const auto& f : config_fields()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

void copy_field(const ConfigField& field, const RunConfig& from, RunConfig& to) {
  std::visit([&](auto member) { to.*member = from.*member; }, field.member);
}

std::string field_value_string(const ConfigField& field, const RunConfig& config) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = config.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>) return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) return format_double(v);
        else return quote(v);
      },
      field.member);
}

std::string to_toml(const RunConfig& config) {
  std::ostringstream os;
  std::string group;
  for (const auto& f : config_fields()) {
    if (group != f.group) {
      os << (group.empty() ? "" : "\n") << "# ---- " << f.group << "\n";
      group = f.group;
    }
    os << f.name << " = " << field_value_string(f, config) << "\n";
  }
  return os.str();
}

std::vector<std::string> apply_toml(RunConfig& config, const std::string& text,
                                    const std::string& origin, std::vector<std::string>* unknown) {
  std::vector<std::string> set;
  for (const auto& entry : internal::parse_flat_toml(text, origin)) {
    const std::string& key = entry.key;
    const auto line = entry.line;
    TORCH_CHECK(!entry.table, origin, ":", line, ": [", key,
                "] is a table: tinylm configs use flat keys only, e.g. d-model = 32");
    const ConfigField* field = find_config_field(key);
    if (!field && unknown) {
      unknown->push_back(key);
      continue;
    }
    TORCH_CHECK(field, origin, ": unknown key '", internal::printable(key), "'", suggestion(key));
    const auto& value = entry.value;
    std::visit(
        [&](auto member) {
          auto& v = config.*member;
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>) {
            TORCH_CHECK(std::holds_alternative<bool>(value), origin, ":", line, ": '", key,
                        "' must be true or false, got ", entry.type);
            v = std::get<bool>(value);
          } else if constexpr (std::is_same_v<T, int64_t>) {
            TORCH_CHECK(std::holds_alternative<int64_t>(value), origin, ":", line, ": '", key,
                        "' must be an integer, got ", entry.type);
            v = std::get<int64_t>(value);
          } else if constexpr (std::is_same_v<T, double>) {
            TORCH_CHECK(std::holds_alternative<double>(value) || std::holds_alternative<int64_t>(value), origin,
                        ":", line, ": '", key, "' must be a number, got ", entry.type);
            v = std::holds_alternative<double>(value) ? std::get<double>(value)
                                                      : static_cast<double>(std::get<int64_t>(value));
          } else {
            TORCH_CHECK(std::holds_alternative<std::string>(value), origin, ":", line, ": '", key,
                        "' must be a string (in quotes), got ", entry.type);
            v = std::get<std::string>(value);
          }
        },
        field->member);
    set.push_back(key);
  }
  return set;
}

std::vector<std::string> apply_toml_file(RunConfig& config, const std::string& path) {
  // A config is a few kilobytes; a megabyte is plenty and keeps a mistaken path cheap.
  return apply_toml(config, internal::read_regular_file(path, "config file", 1u << 20),
                    internal::printable(path));
}

void validate(const RunConfig& c) {
  check_one_of("model", c.model, {"tiny", "transformer"});
  check_one_of("task", c.task, {"repeat", "copy", "reverse", "sort", "text", "tokens"});
  check_one_of("positions", c.positions, {"learned", "sinusoidal", "none"});
  check_one_of("activation", c.activation, {"gelu-tanh", "gelu"});
  check_one_of("optimizer", c.optimizer, {"adam", "adamw"});
  check_one_of("lr-schedule", c.lr_schedule, {"constant", "cosine"});
  TORCH_CHECK(c.vocab_size >= 2, "vocab-size must be >= 2, got ", c.vocab_size);
  TORCH_CHECK(c.d_model >= 1, "d-model must be >= 1, got ", c.d_model);
  TORCH_CHECK(c.n_heads >= 1, "n-heads must be >= 1, got ", c.n_heads);
  TORCH_CHECK(c.d_model % c.n_heads == 0, "d-model ", c.d_model, " must be divisible by n-heads ",
              c.n_heads);
  TORCH_CHECK(c.model != "tiny" || c.d_model % 2 == 0,
              "d-model must be even for the tiny model (sinusoidal positions), got ", c.d_model);
  TORCH_CHECK(c.n_layers >= 1, "n-layers must be >= 1, got ", c.n_layers);
  TORCH_CHECK(c.mlp_expansion >= 1, "mlp-expansion must be >= 1, got ", c.mlp_expansion);
  TORCH_CHECK(c.dropout >= 0 && c.dropout < 1, "dropout must be in [0, 1), got ", c.dropout);
  TORCH_CHECK(c.attn_dropout >= 0 && c.attn_dropout < 1, "attn-dropout must be in [0, 1), got ",
              c.attn_dropout);
  TORCH_CHECK(c.seq_len >= 1, "seq-len must be >= 1, got ", c.seq_len);
  TORCH_CHECK(c.context_length >= 0, "context-length must be >= 0 (0 = seq-len), got ",
              c.context_length);
  TORCH_CHECK(c.effective_context() >= c.seq_len, "context-length ", c.context_length,
              " is shorter than seq-len ", c.seq_len);
  if (c.task == "copy" || c.task == "reverse" || c.task == "sort") {
    TORCH_CHECK(c.seq_len >= 3, "task ", c.task, " needs seq-len >= 3, got ", c.seq_len);
  }
  if (c.task == "text") {
    TORCH_CHECK(!c.data.empty(), "task text needs a training file: set data = \"path/to/file.txt\"");
    TORCH_CHECK(c.vocab_size == 256, "task text is byte-level: vocab-size must be 256, got ",
                c.vocab_size);
    TORCH_CHECK(c.val_fraction > 0 && c.val_fraction < 1, "val-fraction must be in (0, 1), got ",
                c.val_fraction);
  }
  if (c.task == "tokens") {
    TORCH_CHECK(!c.data.empty(), "task tokens needs a prepared corpus: set data = \"DIR\", a directory made by "
                "tinylm prepare");
  }
  TORCH_CHECK(std::isfinite(c.lr) && c.lr > 0, "lr must be > 0, got ", c.lr);
  TORCH_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0,
              "weight-decay must be a finite number >= 0, got ", c.weight_decay);
  TORCH_CHECK(c.beta1 >= 0 && c.beta1 < 1, "beta1 must be in [0, 1), got ", c.beta1);
  TORCH_CHECK(c.beta2 >= 0 && c.beta2 < 1, "beta2 must be in [0, 1), got ", c.beta2);
  TORCH_CHECK(c.warmup_steps >= 0, "warmup-steps must be >= 0, got ", c.warmup_steps);
  TORCH_CHECK(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1, "min-lr-ratio must be in [0, 1], got ",
              c.min_lr_ratio);
  TORCH_CHECK(std::isfinite(c.grad_clip) && c.grad_clip >= 0,
              "grad-clip must be a finite number >= 0 (0 = off), got ", c.grad_clip);
  TORCH_CHECK(c.grad_accum >= 1, "grad-accum must be >= 1, got ", c.grad_accum);
  TORCH_CHECK(c.batch_size >= 1, "batch-size must be >= 1, got ", c.batch_size);
  TORCH_CHECK(c.epochs >= 1, "epochs must be >= 1, got ", c.epochs);
  TORCH_CHECK(c.steps_per_epoch >= 1, "steps-per-epoch must be >= 1, got ", c.steps_per_epoch);
  // Products the trainer forms must fit in 64 bits.
  int64_t product = 0;
  TORCH_CHECK(!__builtin_mul_overflow(c.epochs, c.steps_per_epoch, &product), "epochs ", c.epochs,
              " x steps-per-epoch ", c.steps_per_epoch, " overflows the step counter (max ",
              std::numeric_limits<int64_t>::max(), ")");
  TORCH_CHECK(!__builtin_mul_overflow(c.batch_size, c.seq_len, &product) &&
                  !__builtin_mul_overflow(product, c.grad_accum, &product),
              "batch-size ", c.batch_size, " x seq-len ", c.seq_len, " x grad-accum ", c.grad_accum,
              " overflows the token counter");
  TORCH_CHECK(c.seed >= 0, "seed must be >= 0, got ", c.seed);
  TORCH_CHECK(c.threads >= 0, "threads must be >= 0 (0 = LibTorch's default), got ", c.threads);
  TORCH_CHECK(c.log_every >= 1, "log-every must be >= 1, got ", c.log_every);
  TORCH_CHECK(c.eval_every >= 0, "eval-every must be >= 0 (0 = once per epoch), got ", c.eval_every);
  TORCH_CHECK(c.eval_batches >= 1, "eval-batches must be >= 1, got ", c.eval_batches);
  TORCH_CHECK(c.save_every >= 0, "save-every must be >= 0 (0 = once per epoch), got ", c.save_every);
  TORCH_CHECK(c.keep_last >= 1, "keep-last must be >= 1, got ", c.keep_last);
  TORCH_CHECK(!c.out_dir.empty(), "out-dir must not be empty");
  TORCH_CHECK(std::isfinite(c.solve_loss) && c.solve_loss > 0,
              "solve-loss must be a finite number > 0, got ", c.solve_loss);
}

}  // namespace tinylm
