// tinylm export --format web (export_web.h): the page's folder, built beside --out and
// renamed into place, so that it is there whole or not at all.
#include "export_web.h"

#include "page.h"

#include <tinylm/onnx.h>
#include <tinylm/version.h>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace tinylm::cli {

namespace fs = std::filesystem;

namespace {

constexpr uintmax_t kMaxRuntimeFile = 128ull << 20;  // ONNX Runtime Web's .wasm is ~12 MiB

/// ONNX Runtime Web's files the page loads (its WebAssembly build, one thread or more).
const char* const kRuntimeFiles[] = {"ort.wasm.min.js", "ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs"};

std::string read_small(const fs::path& p, uintmax_t limit, const std::string& what) {
  std::error_code ec;
  TORCH_CHECK(fs::is_regular_file(p, ec), what, ": ", p.string(), " is not a file");
  const auto size = fs::file_size(p, ec);
  TORCH_CHECK(!ec && size <= limit, what, ": ", p.string(), " is ", size, " bytes, over the limit of ", limit);
  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  TORCH_CHECK(in.good() || in.eof(), what, ": cannot read ", p.string());
  return bytes;
}

/// The package's dist/ folder and version, checked: an onnxruntime-web 1.17 or later
/// (the first whose WebAssembly build loads as these files).
std::pair<fs::path, std::string> runtime_files(const std::string& given) {
  TORCH_CHECK(!given.empty(), "--format web needs ONNX Runtime Web's files: give --onnxruntime-web DIR, the npm "
              "package's folder (npm install onnxruntime-web@1.30.0 puts it in node_modules/onnxruntime-web)");
  fs::path package = given, dist = package / "dist";
  std::error_code ec;
  if (!fs::is_directory(dist, ec)) dist = package, package = package.parent_path();
  for (const char* f : kRuntimeFiles)
    TORCH_CHECK(fs::is_regular_file(dist / f, ec), "--onnxruntime-web ", given, ": no ", f,
                " there or in its dist/: give the folder of the npm package onnxruntime-web (1.17 or later)");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_small(package / "package.json", 1 << 20, "--onnxruntime-web"));
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "--onnxruntime-web ", given, ": its package.json is not JSON (", e.what(), ")");
  }
  const auto name = manifest.value("name", std::string()), version = manifest.value("version", std::string());
  TORCH_CHECK(name == "onnxruntime-web", "--onnxruntime-web ", given, ": the package is '", name,
              "', not onnxruntime-web");
  int major = 0, minor = 0;
  TORCH_CHECK(std::sscanf(version.c_str(), "%d.%d", &major, &minor) == 2 && (major > 1 || (major == 1 && minor >= 17)),
              "--onnxruntime-web ", given, ": version '", version, "'; the page needs 1.17 or later");
  return {dist, version};
}

void write_synced(const fs::path& p, const std::string& bytes) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create ", p.string(), ": ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      TORCH_CHECK(false, "cannot write ", p.string(), ": ", std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int e = errno;
  TORCH_CHECK(::close(fd) == 0 && synced, "cannot write ", p.string(), ": ", std::strerror(e));
}

/// Whether `dir` is a page tinylm wrote (what --overwrite may replace).
bool is_tinylm_page(const fs::path& dir) {
  try {
    return nlohmann::json::parse(read_small(dir / "model.json", 1 << 20, "model.json")).value("format", "") ==
           "tinylm-web";
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::vector<std::string> export_web(InferenceRun& run, const std::map<std::string, std::string>& metadata,
                                    const WebExportOptions& o) {
  TORCH_CHECK(!o.out.empty(), "--out must name the folder to write");
  const std::string kind = run.tokenizer ? run.tokenizer->kind() : "";
  TORCH_CHECK(kind == "byte" || kind == "ids", "the web page tokenizes UTF-8 bytes or token ids, and this model's "
              "tokenizer is ", kind.empty() ? "none" : "'" + kind + "'",
              ": export it with --format onnx, and tokenize with SentencePiece beside it");
  const auto refusal = interop::onnx_refusal(*run.model);
  TORCH_CHECK(refusal.empty(), "cannot export '", run.checkpoint.path, "' for the web: ", refusal);
  const auto [dist, runtime_version] = runtime_files(o.onnxruntime_web);
  const fs::path out = fs::absolute(o.out).lexically_normal();
  std::error_code ec;
  TORCH_CHECK(fs::is_directory(out.parent_path(), ec), "--out ", o.out, ": its folder ", out.parent_path().string(),
              " does not exist");
  const bool replace = fs::exists(fs::symlink_status(out, ec));
  TORCH_CHECK(!replace || o.overwrite, "--out ", o.out, " already exists: choose another folder, or give --overwrite "
              "to replace a page tinylm wrote");
  TORCH_CHECK(!replace || (fs::is_directory(fs::symlink_status(out, ec)) && is_tinylm_page(out)), "--out ", o.out,
              " is not a page tinylm wrote (no model.json of ours): not replaced");

  // The model: the KV-cache graph, and what the page needs to know of it.
  interop::OnnxOptions kv;
  kv.kv_cache = true;
  const auto graph = interop::onnx_model(*run.model, metadata, kv);
  nlohmann::ordered_json caches = nlohmann::ordered_json::array();
  const auto layout = interop::onnx_cache_layout(*run.model);
  for (size_t l = 0; l < layout.size(); ++l) {
    const auto n = std::to_string(l);
    caches.push_back({{"key", "past_key_values." + n + ".key"}, {"value", "past_key_values." + n + ".value"},
                      {"present_key", "present." + n + ".key"}, {"present_value", "present." + n + ".value"},
                      {"kv_heads", layout[l].kv_heads}, {"d_head", layout[l].d_head}});
  }
  const nlohmann::ordered_json info = {
      {"format", "tinylm-web"}, {"format_version", 1}, {"kind", run.checkpoint.architecture.kind},
      {"step", run.checkpoint.state.step}, {"context_length", run.model->context_length()},
      {"vocab_size", run.model->vocab_size()}, {"tokenizer", kind}, {"heads", layout.front().heads},
      {"caches", caches}, {"tinylm_version", TINYLM_VERSION_STRING}, {"onnxruntime_web", runtime_version}};

  // Built beside --out, then renamed: a failure leaves nothing, a reader never sees half.
  const fs::path building = out.string() + ".partial-" + std::to_string(::getpid());
  TORCH_CHECK(fs::create_directory(building, ec) && !ec, "cannot create ", building.string(), ": ", ec.message());
  std::vector<std::string> names;
  try {
    auto put = [&](const std::string& name, const std::string& bytes) {
      write_synced(building / name, bytes);
      names.push_back(name);
    };
    for (const char* name : {"index.html", "tinylm-web.js", "tinylm-web.css"}) {
      const auto* f = serve::web_page_file(name);
      TORCH_CHECK(f, "the web page's ", name, " is not compiled in");
      put(name, std::string(reinterpret_cast<const char*>(f->data), f->size));
    }
    put("model.onnx", graph);
    put("model.json", info.dump(2) + "\n");
    for (const char* f : kRuntimeFiles) put(f, read_small(dist / f, kMaxRuntimeFile, "--onnxruntime-web"));
    if (fs::is_regular_file(dist.parent_path() / "LICENSE", ec))
      put("onnxruntime-web-LICENSE", read_small(dist.parent_path() / "LICENSE", 1 << 20, "--onnxruntime-web"));
    const fs::path old = out.string() + ".replaced-" + std::to_string(::getpid());
    if (replace) fs::rename(out, old);
    try {
      fs::rename(building, out);
    } catch (...) {
      if (replace) fs::rename(old, out, ec);  // the earlier page back
      throw;
    }
    if (replace) fs::remove_all(old, ec);
    const int dir = ::open(out.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) ::fsync(dir), ::close(dir);
  } catch (...) {
    fs::remove_all(building, ec);
    throw;
  }
  std::vector<std::string> written;
  for (const auto& n : names) written.push_back((out / n).string());
  return written;
}

}  // namespace tinylm::cli
