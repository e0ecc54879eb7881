// Checkpoint files: header, payload, atomic writes and checked loads.
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/version.h>

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

std::string errno_text() { return std::strerror(errno); }

/// Writes bytes to path.tmp, fsyncs, renames over path, fsyncs the directory.
void write_file_atomically(const std::string& path, const std::string& bytes) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TORCH_CHECK(fd >= 0, "cannot write checkpoint '", tmp, "': ", errno_text());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      TORCH_CHECK(false, "cannot write checkpoint '", tmp, "': ", why, " (is the disk full?)");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot flush checkpoint '", tmp, "': ", why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot rename '", tmp, "' to '", path, "': ", why);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
}

std::string joined_parameter_names(nn::LanguageModelImpl& model) {
  std::string names;
  for (const auto& p : model.named_parameters()) names += p.key() + "\n";
  return names;
}

std::string read_string(torch::serialize::InputArchive& a, const std::string& key,
                        const std::string& path) {
  c10::IValue v;
  TORCH_CHECK(a.try_read(key, v) && v.isString(), "checkpoint '", path, "' has no '", key,
              "' entry: it was not written by tinylm");
  return v.toStringRef();
}

}  // namespace

uint32_t crc32(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

void save_checkpoint(const std::string& path, const RunConfig& config, nn::LanguageModelImpl& model,
                     const Optimizer* optimizer, const TrainingState& state) {
  torch::serialize::OutputArchive archive;
  archive.write("tinylm_version", c10::IValue(std::string(TINYLM_VERSION_STRING)));
  archive.write("config", c10::IValue(to_toml(config)));
  archive.write("step", c10::IValue(state.step));
  archive.write("best_val_loss", c10::IValue(state.best_val_loss));
  archive.write("epoch_loss_sum", c10::IValue(state.epoch_loss_sum));
  if (state.data_rng_state.defined()) archive.write("data_rng_state", state.data_rng_state);
  if (state.torch_rng_state.defined()) archive.write("torch_rng_state", state.torch_rng_state);
  archive.write("model_parameter_names", c10::IValue(joined_parameter_names(model)));
  for (const auto& p : model.named_parameters()) {
    archive.write("model." + p.key(), p.value().detach().to(torch::kCPU));
  }
  if (optimizer) {
    torch::serialize::OutputArchive opt_archive;
    optimizer->save(opt_archive);
    archive.write("optimizer", opt_archive);
    archive.write("optimizer_kind", c10::IValue(optimizer->kind()));
  }
  std::ostringstream payload_stream;
  archive.save_to(payload_stream);
  const std::string payload = payload_stream.str();

  std::string bytes(kHeaderSize, '\0');
  std::memcpy(bytes.data(), kMagic, sizeof kMagic);
  put<uint32_t>(bytes, 8, kCheckpointFormatVersion);
  put<uint64_t>(bytes, 16, payload.size());
  put<uint32_t>(bytes, 24, crc32(payload.data(), payload.size()));
  bytes += payload;
  write_file_atomically(path, bytes);
}

Checkpoint read_checkpoint(const std::string& path) {
  std::error_code ec;
  TORCH_CHECK(fs::exists(path, ec), "checkpoint '", path, "' does not exist");
  TORCH_CHECK(!fs::is_directory(path, ec), "checkpoint '", path, "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot read checkpoint '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TORCH_CHECK(bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0,
              "'", path, "' is not a tinylm checkpoint (it does not start with TINYLMCK)");
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
  TORCH_CHECK(crc32(bytes.data() + kHeaderSize, length) == get<uint32_t>(bytes, 24),
              "checkpoint '", path, "' is corrupt: its checksum does not match its contents");

  ck.archive = std::make_shared<torch::serialize::InputArchive>();
  try {
    std::istringstream payload(bytes.substr(kHeaderSize));
    ck.archive->load_from(payload);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", path, "' has a payload LibTorch cannot read: ",
                e.what_without_backtrace());
  }
  auto& a = *ck.archive;
  apply_toml(ck.config, read_string(a, "config", path), path + " (stored config)");
  validate(ck.config);
  c10::IValue v;
  TORCH_CHECK(a.try_read("step", v) && v.isInt(), "checkpoint '", path, "' has no step");
  ck.state.step = v.toInt();
  if (a.try_read("best_val_loss", v) && v.isDouble()) ck.state.best_val_loss = v.toDouble();
  if (a.try_read("epoch_loss_sum", v) && v.isDouble()) ck.state.epoch_loss_sum = v.toDouble();
  a.try_read("data_rng_state", ck.state.data_rng_state);
  a.try_read("torch_rng_state", ck.state.torch_rng_state);
  return ck;
}

void load_model_state(const Checkpoint& ck, nn::LanguageModelImpl& model) {
  auto& a = *ck.archive;
  const std::string stored = read_string(a, "model_parameter_names", ck.path);
  const std::string expected = joined_parameter_names(model);
  if (stored != expected) {
    // Name the first parameter that one side has and the other lacks.
    std::istringstream s(stored), e(expected);
    std::string ls, le;
    while (std::getline(s, ls) && std::getline(e, le) && ls == le) {}
    TORCH_CHECK(false, "checkpoint '", ck.path, "' does not fit the model: it holds parameter '",
                ls.empty() ? "(none)" : ls, "' where the model has '", le.empty() ? "(none)" : le,
                "'");
  }
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    torch::Tensor t;
    TORCH_CHECK(a.try_read("model." + p.key(), t), "checkpoint '", ck.path,
                "' lacks the weights of '", p.key(), "'");
    TORCH_CHECK(t.sizes() == p.value().sizes(), "checkpoint '", ck.path,
                "' does not fit the model: '", p.key(), "' has shape ", t.sizes(),
                " in the checkpoint but ", p.value().sizes(), " in the model");
    TORCH_CHECK(t.scalar_type() == p.value().scalar_type(), "checkpoint '", ck.path, "': '",
                p.key(), "' is ", t.scalar_type(), " in the checkpoint but ",
                p.value().scalar_type(), " in the model");
    p.value().copy_(t);
  }
}

void load_optimizer_state(const Checkpoint& ck, Optimizer& optimizer) {
  torch::serialize::InputArchive opt_archive;
  TORCH_CHECK(ck.archive->try_read("optimizer", opt_archive), "checkpoint '", ck.path,
              "' holds no optimizer state, so training cannot resume from it");
  const std::string kind = read_string(*ck.archive, "optimizer_kind", ck.path);
  TORCH_CHECK(kind == optimizer.kind(), "checkpoint '", ck.path, "' holds '", kind,
              "' optimizer state, but this run uses '", optimizer.kind(),
              "': resume with the same --optimizer and --fused-optimizer as the checkpoint");
  try {
    optimizer.load(opt_archive);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", ck.path, "': its optimizer state does not fit (",
                e.what_without_backtrace(), "); resume with the optimizer it was trained with ('",
                ck.config.optimizer, "')");
  }
}

std::string resolve_checkpoint_path(const std::string& file_or_dir) {
  std::error_code ec;
  if (!fs::is_directory(file_or_dir, ec)) return file_or_dir;
  std::string newest;
  for (const auto& entry : fs::directory_iterator(file_or_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && entry.path().extension() == ".ckpt" &&
        (newest.empty() || name > fs::path(newest).filename().string())) {
      newest = entry.path().string();
    }
  }
  TORCH_CHECK(!newest.empty(), "run directory '", file_or_dir,
              "' holds no step-*.ckpt checkpoint");
  return newest;
}

}  // namespace tinylm::train
