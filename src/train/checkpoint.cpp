// Checkpoint files: header, payload, atomic writes and checked loads.
// Over 400 lines on purpose: the writer and the readers of one file format change
// together, with every check an untrusted file needs.
#include <tinylm/log.h>
#include <tinylm/nn/model_kind.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/run_directory.h>
#include <tinylm/version.h>

#include "internal/crc32.h"
#include "internal/files.h"
#include "internal/text.h"
#include "train/legacy_archive.h"
#include "train/legacy_recipe.h"

#include <nlohmann/json.hpp>
#include <torch/types.h>
#include <torch/utils.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace fs = std::filesystem;

namespace tinylm::train {

namespace {

constexpr char kMagic[8] = {'T', 'I', 'N', 'Y', 'L', 'M', 'C', 'K'};
constexpr size_t kHeaderSize = 32;

template <typename T>
void put(std::string& out, size_t offset, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[offset + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
}

template <typename T>
T get(const std::string& in, size_t offset) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    value |= static_cast<T>(static_cast<unsigned char>(in[offset + i])) << (8 * i);
  return value;
}

std::vector<std::string> parameter_names(nn::LanguageModelImpl& model) {
  std::vector<std::string> names;
  for (const auto& p : model.named_parameters()) names.push_back(p.key());
  return names;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// ---- format 2: a safetensors payload ------------------------------------------------

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {torch::kFloat64, "F64"}, {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"},
    {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"}, {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},   {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"}};

const char* dtype_name(torch::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  TORCH_CHECK(false, "checkpoint: cannot store tensors of dtype ", t);
}

constexpr uint64_t kMaxHeaderBytes = 64ull << 20;  // far more than any model's names need

/// metadata (strings) + named tensors -> payload bytes.
std::string encode_payload(const std::map<std::string, std::string>& metadata, const TensorMap& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  put<uint64_t>(out, 0, json.size());
  out += json;
  out.reserve(out.size() + offset);
  for (const auto& t : data) out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return out;
}

/// Parses a payload, checking every size and offset before allocating anything.
void decode_payload(const std::string& path, const std::string& payload,
                    std::map<std::string, std::string>& metadata, TensorMap& tensors) {
  const std::string where = "checkpoint '" + internal::printable(path) + "'";
  TORCH_CHECK(payload.size() >= 8, where, " is damaged: its payload is too short");
  const uint64_t n = get<uint64_t>(payload, 0);
  TORCH_CHECK(n >= 2 && n <= kMaxHeaderBytes && n <= payload.size() - 8, where,
              " is damaged: its tensor index claims ", n, " bytes (the payload has ",
              payload.size(), ")");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(payload.begin() + 8, payload.begin() + 8 + static_cast<int64_t>(n));
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, where, " is damaged: its tensor index is not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK(header.is_object(), where, " is damaged: its tensor index is not a JSON object");
  const uint64_t data_size = payload.size() - 8 - n;
  const char* data = payload.data() + 8 + n;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    const std::string what = where + " is damaged: entry '" + internal::printable(name) + "'";
    TORCH_CHECK(entry.is_object(), what, " is not an object");
    if (name == "__metadata__") {
      for (const auto& [key, value] : entry.items()) {
        TORCH_CHECK(value.is_string(), what, " holds a non-string value for '", internal::printable(key), "'");
        metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const auto dtype = entry.find("dtype");
    const auto shape = entry.find("shape");
    const auto offsets = entry.find("data_offsets");
    TORCH_CHECK(dtype != entry.end() && dtype->is_string() && shape != entry.end() &&
                    shape->is_array() && offsets != entry.end() && offsets->is_array() &&
                    offsets->size() == 2 && (*offsets)[0].is_number_unsigned() &&
                    (*offsets)[1].is_number_unsigned(),
                what, " lacks a dtype, a shape or two data offsets");
    const DtypeName* d = nullptr;
    for (const auto& known : kDtypes)
      if (dtype->get<std::string>() == known.name) d = &known;
    TORCH_CHECK(d, what, " has an unknown dtype");
    TORCH_CHECK(shape->size() <= 16, what, " has ", shape->size(), " dimensions");
    std::vector<int64_t> sizes;
    uint64_t numel = 1;
    for (const auto& dim : *shape) {
      TORCH_CHECK(dim.is_number_unsigned(), what, " has a shape that is not a list of sizes");
      const uint64_t v = dim.get<uint64_t>();
      TORCH_CHECK(v <= data_size && (v == 0 || numel <= data_size / v), what,
                  " has a shape larger than the file");
      numel *= v;
      sizes.push_back(static_cast<int64_t>(v));
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
    const uint64_t elem = c10::elementSize(d->type);
    TORCH_CHECK(begin <= end && end <= data_size, what, " points outside the file");
    TORCH_CHECK(numel <= data_size / elem && numel * elem == end - begin, what, " has ",
                end - begin, " bytes for ", numel, " values of ", d->name);
    ranges.emplace_back(begin, end);
    auto t = torch::empty(sizes, torch::TensorOptions().dtype(d->type));
    if (end > begin) std::memcpy(t.data_ptr(), data + begin, end - begin);
    tensors[name] = t;
  }
  // The tensors tile the data exactly, as safetensors requires: no gaps, no overlaps.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    TORCH_CHECK(begin == covered, where, " is damaged: its tensors overlap or leave gaps");
    covered = end;
  }
  TORCH_CHECK(covered == data_size, where, " is damaged: ", data_size - covered,
              " bytes after its last tensor");
}

void check_finite(const std::string& path, const std::string& name, const torch::Tensor& t,
                  int64_t step) {
  if (!t.is_floating_point()) return;
  TORCH_CHECK(torch::isfinite(t).all().item<bool>(), "not writing checkpoint '", path, "': '",
              name, "' holds NaN or infinite values at step ", step,
              " (training diverged: a lower learning rate, gradient clipping or warmup helps)");
}

/// Formats 1 and 2 -> today's names: a transformer's learned positions were registered
/// as "positions" (the name sinusoidal positions had too), "learned_positions" since.
void migrate_parameter_names(Checkpoint& ck) {
  const auto positions = ck.architecture.options.find("positions");
  if (ck.architecture.kind != "transformer" || positions == ck.architecture.options.end() ||
      positions->second != "learned")
    return;
  const std::string old_prefix = "positions.", new_prefix = "learned_positions.";
  auto rename = [&](const std::string& name) {
    return name.rfind(old_prefix, 0) == 0 ? new_prefix + name.substr(old_prefix.size()) : name;
  };
  for (auto& name : ck.parameter_names) name = rename(name);
  for (TensorMap* map : {&ck.model, &ck.optimizer}) {
    TensorMap renamed;
    for (auto& [name, t] : *map) renamed[rename(name)] = t;
    *map = std::move(renamed);
  }
}

/// Formats 2 and 3: metadata and tensors from a safetensors payload.
void read_payload(Checkpoint& ck, const std::string& payload) {
  const std::string& path = ck.path;
  std::map<std::string, std::string> meta;
  TensorMap tensors;
  decode_payload(path, payload, meta, tensors);
  std::set<std::string> used;
  auto field = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    TORCH_CHECK(it != meta.end(), "checkpoint '", path, "' has no '", key,
                "' entry: it was not written by tinylm");
    used.insert(key);
    return it->second;
  };
  auto json_field = [&](const char* key, const char* what) {
    const std::string& text = field(key);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK(false, "checkpoint '", path, "' is damaged: its ", what, " ('", key,
                  "') is not valid JSON (", e.what(), ")");
    }
    TORCH_CHECK(j.is_object(), "checkpoint '", path, "' is damaged: its ", what, " ('", key,
                "') is a JSON ", j.type_name(), " where an object belongs");
    return j;
  };
  field("format");
  ck.tinylm_version = field("tinylm_version");
  if (ck.format_version == 2) {
    ck.recipe = field("config");
  } else {
    ck.recipe = field("recipe");
    const auto model = json_field("model", "model architecture");
    try {
      ck.architecture.kind = model.at("kind").get<std::string>();
      ck.architecture.version = model.at("version").get<int64_t>();
      for (const auto& [key, value] : model.at("options").items())
        ck.architecture.options[key] = value.get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK(false, "checkpoint '", path, "' is damaged: its model architecture is unreadable (",
                  e.what(), ")");
    }
  }
  const auto state = json_field("state", "training state");
  try {
    ck.state.step = state.at("step").get<int64_t>();
    ck.state.best_val_loss = state.at("best_val_loss").get<double>();
    ck.state.epoch_loss_sum = state.at("epoch_loss_sum").get<double>();
    if (state.contains("world_size")) ck.state.world_size = state.at("world_size").get<int64_t>();
    if (state.contains("epoch_loss_steps")) ck.state.epoch_loss_steps = state.at("epoch_loss_steps").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' is damaged: its training state is unreadable (",
                e.what(), ")");
  }
  TORCH_CHECK(ck.state.world_size >= 1, "checkpoint '", path, "' is damaged: world size ",
              ck.state.world_size);
  for (const auto& [key, value] : state.items())
    if (key != "step" && key != "best_val_loss" && key != "epoch_loss_sum" && key != "world_size" &&
        key != "epoch_loss_steps")
      logger()->warn("checkpoint '{}': training state '{}' is unknown to this tinylm: ignored",
                     path, internal::printable(key));
  TORCH_CHECK(ck.state.step >= 0, "checkpoint '", path, "' is damaged: step ", ck.state.step);
  TORCH_CHECK(ck.state.epoch_loss_steps >= -1 && ck.state.epoch_loss_steps <= ck.state.step, "checkpoint '", path,
              "' is damaged: its epoch mean covers ", ck.state.epoch_loss_steps, " steps of ", ck.state.step);
  ck.parameter_names = internal::split_lines(field("parameter_names"));
  ck.optimizer_kind = field("optimizer_kind");
  if (meta.count("tokenizer")) ck.tokenizer_kind = field("tokenizer");
  for (const auto& [key, value] : meta)
    if (!used.count(key))
      logger()->warn("checkpoint '{}': metadata '{}' is unknown to this tinylm: ignored", path,
                     internal::printable(key));
  for (auto& [name, t] : tensors) {
    if (name.rfind("model.", 0) == 0) ck.model[name.substr(6)] = t;
    else if (name.rfind("optimizer.", 0) == 0) ck.optimizer[name.substr(10)] = t;
    else if (name == "rng.data") ck.state.data_rng_state = t;
    else if (name == "tokenizer.model" && t.scalar_type() == torch::kUInt8 && t.dim() == 1)
      ck.tokenizer_model.assign(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
    else if (name == "rng.dropout" || (ck.format_version == 2 && name == "rng.torch"))
      ck.state.dropout_rng_state = t;
    else
      logger()->warn("checkpoint '{}': entry '{}' is unknown to this tinylm: ignored", path,
                     internal::printable(name));
  }
}

void check_weights_listed(const Checkpoint& ck) {
  const std::string& path = ck.path;
  TORCH_CHECK(ck.model.size() == ck.parameter_names.size(), "checkpoint '", path, "' is damaged: ",
              ck.model.size(), " weight tensors for ", ck.parameter_names.size(), " parameter names");
  for (const auto& name : ck.parameter_names)
    TORCH_CHECK(ck.model.count(name), "checkpoint '", path, "' lacks the weights of '",
                internal::printable(name), "'");
}

/// The architecture against the weights stored with it, before any model is built from
/// it: an enlarged n_layers, vocab_size or d_model must be refused, not allocated first.
void check_architecture_matches_weights(const Checkpoint& ck) {
  const auto& a = ck.architecture;
  int64_t expected = 0;
  try {
    expected = nn::parameter_count(a);
  } catch (const c10::Error&) {
    // A kind not registered in this program, one that does not count its parameters, or
    // options it cannot read: build_model() names the problem before allocating anything.
    return;
  }
  int64_t stored = 0;
  for (const auto& [name, t] : ck.model) stored += t.numel();
  if (expected == stored) return;
  std::string sizes;
  for (const auto& o : nn::find_model_kind(a.kind).options)
    if (auto it = a.options.find(o.name); o.type == OptionType::integer && it != a.options.end())
      sizes += (sizes.empty() ? "" : ", ") + o.name + " " + internal::printable(it->second);
  TORCH_CHECK(false, "checkpoint '", ck.path, "' is damaged: the ", a.kind, " model it describes (", sizes,
              ") has ", expected, " parameters, but it stores ", stored, " weights");
}

}  // namespace

void save_checkpoint(const std::string& path, nn::LanguageModelImpl& model,
                     const Optimizer* optimizer, const TrainingState& state,
                     const std::string& recipe, const data::Tokenizer* tokenizer) {
  TensorMap tensors;
  for (const auto& p : model.named_parameters()) {
    check_finite(path, p.key(), p.value(), state.step);
    tensors["model." + p.key()] = p.value();
  }
  if (optimizer) {
    for (const auto& [key, t] : optimizer->state_dict()) {
      check_finite(path, "optimizer " + key, t, state.step);
      tensors["optimizer." + key] = t;
    }
  }
  if (state.data_rng_state.defined()) tensors["rng.data"] = state.data_rng_state;
  if (state.dropout_rng_state.defined()) tensors["rng.dropout"] = state.dropout_rng_state;
  std::string tokenizer_bytes = tokenizer ? tokenizer->model_bytes() : std::string();
  if (!tokenizer_bytes.empty())
    tensors["tokenizer.model"] = torch::from_blob(tokenizer_bytes.data(), {static_cast<int64_t>(tokenizer_bytes.size())},
                                                  torch::kUInt8);
  const auto arch = model.architecture();
  const nlohmann::json architecture = {
      {"kind", arch.kind}, {"version", arch.version}, {"options", arch.options}};
  const nlohmann::json training = {{"step", state.step},
                                   {"best_val_loss", state.best_val_loss},
                                   {"epoch_loss_sum", state.epoch_loss_sum},
                                   {"world_size", state.world_size},
                                   {"epoch_loss_steps", state.epoch_loss_steps}};
  std::map<std::string, std::string> metadata = {
      {"format", "tinylm-checkpoint"},
      {"tinylm_version", TINYLM_VERSION_STRING},
      {"model", architecture.dump()},
      {"recipe", recipe},
      {"state", training.dump()},
      {"parameter_names", join_lines(parameter_names(model))},
      {"optimizer_kind", optimizer ? optimizer->kind() : ""}};
  if (tokenizer) metadata["tokenizer"] = tokenizer->kind();
  const std::string payload = encode_payload(metadata, tensors);

  std::string bytes(kHeaderSize, '\0');
  std::memcpy(bytes.data(), kMagic, sizeof kMagic);
  put<uint32_t>(bytes, 8, kCheckpointFormatVersion);
  put<uint64_t>(bytes, 16, payload.size());
  put<uint32_t>(bytes, 24, internal::crc32(payload.data(), payload.size()));
  bytes += payload;
  internal::write_file_atomically(path, bytes, "checkpoint");
}

std::shared_ptr<const data::Tokenizer> checkpoint_tokenizer(const Checkpoint& ck) {
  if (ck.tokenizer_kind.empty()) return nullptr;
  return data::make_tokenizer(ck.tokenizer_kind, ck.tokenizer_model, "checkpoint '" + ck.path + "'");
}

uint32_t checkpoint_format_version(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return 0;  // a FIFO would block the read: read_checkpoint says why
  std::ifstream in(path, std::ios::binary);
  char header[12] = {};
  if (!in.read(header, sizeof header) || std::memcmp(header, kMagic, sizeof kMagic) != 0) return 0;
  uint32_t version = 0;
  std::memcpy(&version, header + 8, sizeof version);
  return version;
}

Checkpoint read_checkpoint(const std::string& path) {
  const std::string bytes = internal::read_regular_file(path, "checkpoint");
  TORCH_CHECK(bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0,
              "'", internal::printable(path), "' is not a tinylm checkpoint (it does not start with TINYLMCK)");
  TORCH_CHECK(bytes.size() >= kHeaderSize, "checkpoint '", path, "' is truncated: ", bytes.size(),
              " bytes, shorter than its 32-byte header");
  Checkpoint ck;
  ck.path = path;
  ck.format_version = get<uint32_t>(bytes, 8);
  TORCH_CHECK(ck.format_version >= 1 && ck.format_version <= kCheckpointFormatVersion,
              "checkpoint '", path, "' has format version ", ck.format_version,
              ", but this tinylm reads versions up to ", kCheckpointFormatVersion,
              ck.format_version > kCheckpointFormatVersion ? ": upgrade tinylm to read it" : "");
  const uint64_t length = get<uint64_t>(bytes, 16);
  const uint64_t have = bytes.size() - kHeaderSize;
  TORCH_CHECK(have >= length, "checkpoint '", path, "' is truncated: its header promises ", length,
              " payload bytes, the file has ", have);
  TORCH_CHECK(have == length, "checkpoint '", path, "' has ", have - length,
              " unexpected bytes after its payload");
  TORCH_CHECK(internal::crc32(bytes.data() + kHeaderSize, length) == get<uint32_t>(bytes, 24),
              "checkpoint '", path, "' is corrupt: its checksum does not match its contents");
  const std::string payload = bytes.substr(kHeaderSize);
  if (ck.format_version == 1) internal::read_legacy_archive(ck, payload);
  else read_payload(ck, payload);
  if (ck.format_version < 3) {
    ck.architecture = internal::legacy_architecture(ck.recipe, path);
    migrate_parameter_names(ck);
  }
  check_weights_listed(ck);
  check_architecture_matches_weights(ck);
  return ck;
}

void load_model_state(const Checkpoint& ck, nn::LanguageModelImpl& model) {
  const auto expected = parameter_names(model);
  if (ck.parameter_names != expected) {
    // Name the first parameter that one side has and the other lacks.
    size_t i = 0;
    while (i < ck.parameter_names.size() && i < expected.size() && ck.parameter_names[i] == expected[i]) ++i;
    const std::string& ls = i < ck.parameter_names.size() ? ck.parameter_names[i] : "(none)";
    const std::string& le = i < expected.size() ? expected[i] : "(none)";
    TORCH_CHECK(false, "checkpoint '", ck.path, "' does not fit the model: it holds parameter '",
                internal::printable(ls), "' where the model has '", le, "'");
  }
  for (auto& p : model.named_parameters()) {
    const auto& t = ck.model.at(p.key());
    TORCH_CHECK(t.sizes() == p.value().sizes(), "checkpoint '", ck.path,
                "' does not fit the model: '", p.key(), "' has shape ", t.sizes(),
                " in the checkpoint but ", p.value().sizes(), " in the model");
    TORCH_CHECK(t.scalar_type() == p.value().scalar_type(), "checkpoint '", ck.path, "': '",
                p.key(), "' is ", t.scalar_type(), " in the checkpoint but ",
                p.value().scalar_type(), " in the model");
    TORCH_CHECK(!t.is_floating_point() || torch::isfinite(t).all().item<bool>(), "checkpoint '",
                ck.path, "' holds NaN or infinite weights in '", p.key(),
                "': it cannot be used (it was damaged, or written by a diverged run)");
  }
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) p.value().copy_(ck.model.at(p.key()));
}

void load_optimizer_state(const Checkpoint& ck, Optimizer& optimizer) {
  TORCH_CHECK(!ck.optimizer_kind.empty(), "checkpoint '", ck.path,
              "' holds no optimizer state, so training cannot resume from it");
  TORCH_CHECK(ck.optimizer_kind == optimizer.kind(), "checkpoint '", ck.path, "' holds '",
              ck.optimizer_kind, "' optimizer state, but this run uses '", optimizer.kind(),
              "': resume with the optimizer settings the checkpoint was trained with");
  try {
    optimizer.load_state_dict(ck.optimizer_groups.empty() ? ck.optimizer
                                                          : optimizer.state_from_groups(ck.optimizer_groups));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", ck.path, "': its optimizer state does not fit (",
                e.what_without_backtrace(), "); resume with the optimizer it was trained with ('",
                ck.optimizer_kind, "')");
  }
}

std::string resolve_checkpoint_path(const std::string& file_or_dir) {
  std::error_code ec;
  if (!fs::is_directory(file_or_dir, ec)) return file_or_dir;
  const auto steps = RunDirectory::step_checkpoints(file_or_dir);  // oldest first
  TORCH_CHECK(!steps.empty(), "run directory '", file_or_dir,
              "' holds no step-*.ckpt checkpoint");
  return steps.back();
}

}  // namespace tinylm::train
