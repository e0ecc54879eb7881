// Data-parallel process groups on c10d: TCPStore rendezvous + ProcessGroupGloo, or
// ProcessGroupNCCL where tinylm was built against a LibTorch with CUDA and NCCL
// (TINYLM_HAVE_NCCL, set by CMake).
// Over 400 lines on purpose: the process group's store, heartbeat, agreement and
// collectives share one Impl.
#include <tinylm/train/distributed.h>

#include "internal/text.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TINYLM_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tinylm::train {

namespace {

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

/// An environment variable as a whole number; `fallback` when unset.
int64_t env_integer(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (!text) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  TORCH_CHECK(*text != '\0' && *end == '\0', "environment variable ", name, "='",
              internal::printable(text), "' is not a whole number");
  return v;
}

/// LibTorch 2.4+ may run the store on libuv (TCPStoreOptions::useLibUV, on by default);
/// Debian's LibTorch is built without it, so the classic backend is asked for where the
/// option exists (detected, as it appeared between releases).
template <typename Options>
auto use_classic_store(Options& o, int) -> decltype(o.useLibUV = false, void()) {
  o.useLibUV = false;
}
template <typename Options>
void use_classic_store(Options&, long) {}

/// One flat buffer for several tensors (or the tensor itself when there is one).
torch::Tensor flat_view(const std::vector<torch::Tensor>& tensors) {
  if (tensors.size() == 1 && tensors[0].is_contiguous()) return tensors[0].view({-1});
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return torch::cat(flat);
}

void scatter_back(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors) {
  if (tensors.size() == 1 && tensors[0].is_contiguous()) return;  // reduced in place
  int64_t offset = 0;
  torch::NoGradGuard no_grad;
  for (const auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

/// The first line of an exception's text, without c10's backtrace or Gloo's source
/// location ("[../gloo/transport/tcp/pair.cc:589] Read error ...").
std::string first_line(const std::exception& e) {
  std::string why = e.what();
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) why = c10_error->what_without_backtrace();
  why = why.substr(0, why.find('\n'));
  if (!why.empty() && why[0] == '[') {
    const auto close = why.find("] ");
    if (close != std::string::npos) why = why.substr(close + 2);
  }
  return why;
}

/// Waits for a collective; a peer that died, hung past the timeout or left becomes one
/// line naming this rank and the collective, and the ranks whose heartbeat stopped (a
/// process stopped or hung, or dead) when there are any. (The work's type moved between
/// LibTorch releases: ProcessGroup::Work in 1.13, c10d::Work in 2.x.)
template <typename WorkPtr, typename Silent>
void wait(const DistributedOptions& o, const char* what, const WorkPtr& work, const Silent& silent_ranks) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    const std::string silent = silent_ranks();
    TORCH_CHECK(silent.empty(), "rank ", o.rank, " of ", o.world_size, ": the ", what, " failed (",
                first_line(e), "): ", silent, " (stopped, hung or dead: look there first)");
    TORCH_CHECK(false, "rank ", o.rank, " of ", o.world_size, ": the ", what, " failed (",
                first_line(e), "): another process of the job died, stopped answering for ",
                o.timeout_seconds, " s, or left");
  }
}

}  // namespace

void check_distributed_options(const DistributedOptions& o) {
  TORCH_CHECK(o.world_size >= 1, "world size must be >= 1, got ", o.world_size);
  TORCH_CHECK(o.rank >= 0 && o.rank < o.world_size, "rank must be in [0, world size ",
              o.world_size, "), got ", o.rank);
  TORCH_CHECK(o.master_port >= 1 && o.master_port <= 65535, "master port must be in [1, 65535], got ",
              o.master_port);
  TORCH_CHECK(!o.master_addr.empty(), "master address must not be empty");
  TORCH_CHECK(std::isfinite(o.timeout_seconds) && o.timeout_seconds > 0,
              "distributed timeout must be > 0 seconds, got ", o.timeout_seconds);
}

int64_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "cannot open a socket: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int error = errno;
  ::close(fd);
  TORCH_CHECK(ok, "cannot find a free port on 127.0.0.1: ", std::strerror(error));
  return ntohs(addr.sin_port);
}

std::optional<DistributedOptions> distributed_from_environment() {
  if (!std::getenv("WORLD_SIZE")) return std::nullopt;
  DistributedOptions o;
  o.world_size = env_integer("WORLD_SIZE", 1);
  TORCH_CHECK(o.world_size >= 1, "WORLD_SIZE=", o.world_size, " must be >= 1");
  TORCH_CHECK(std::getenv("RANK"), "WORLD_SIZE is set but RANK is not: set RANK to this "
              "process's index in [0, ", o.world_size, ")");
  o.rank = env_integer("RANK", 0);
  TORCH_CHECK(o.rank >= 0 && o.rank < o.world_size, "RANK=", o.rank, " must be in [0, WORLD_SIZE=",
              o.world_size, ")");
  const int64_t local_rank = env_integer("LOCAL_RANK", 0);
  o.local_rank = local_rank;
  TORCH_CHECK(local_rank >= 0 && local_rank <= o.rank, "LOCAL_RANK=", local_rank,
              " must be in [0, RANK=", o.rank, "]");
  if (const char* addr = std::getenv("MASTER_ADDR")) o.master_addr = addr;
  o.master_port = env_integer("MASTER_PORT", o.master_port);
  TORCH_CHECK(o.master_port >= 1 && o.master_port <= 65535, "MASTER_PORT=", o.master_port,
              " must be in [1, 65535]");
  TORCH_CHECK(!o.master_addr.empty(), "MASTER_ADDR is empty: set it to rank 0's host");
  if (const char* file = std::getenv("TINYLM_STORE_FILE")) o.store_file = file;
  return o;
}

DistBackend parse_dist_backend(const std::string& name) {
  if (name == "auto") return DistBackend::automatic;
  if (name == "gloo") return DistBackend::gloo;
  if (name == "nccl") return DistBackend::nccl;
  TORCH_CHECK(false, "unknown distributed backend '", internal::printable(name), "': use auto, gloo or nccl");
  return DistBackend::automatic;
}

const char* to_string(DistBackend backend) {
  switch (backend) {
    case DistBackend::gloo: return "gloo";
    case DistBackend::nccl: return "nccl";
    default: return "auto";
  }
}

bool nccl_available() {
#ifdef TINYLM_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

DistBackend resolve_backend(const DistributedOptions& o) {
  switch (o.backend) {
    case DistBackend::gloo: return DistBackend::gloo;
    case DistBackend::nccl:
      TORCH_CHECK(nccl_available(), "the nccl backend is not in this build (LibTorch without CUDA "
                  "or NCCL, or nccl.h not found when tinylm was built): use gloo");
      TORCH_CHECK(o.device.is_cuda(), "the nccl backend moves CUDA tensors, but this rank trains on ",
                  o.device, ": use gloo, or a CUDA device");
      return DistBackend::nccl;
    default: return o.device.is_cuda() && nccl_available() ? DistBackend::nccl : DistBackend::gloo;
  }
}

// The collectives' common base: c10d::ProcessGroup in LibTorch 1.13, c10d::Backend in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<Collectives> engine;

  // Heartbeats: a thread adds 1 to this rank's counter in the store every `beat` and
  // notes when each other rank's counter last moved. A process that is stopped
  // (SIGSTOP, a debugger), hung in the kernel or dead stops counting, while one that is
  // only slow (a long data load, a checkpoint write) goes on: when a collective fails,
  // the ranks silent for three beats are the ones to name.
  using Clock = std::chrono::steady_clock;
  std::thread heartbeat;
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  Clock::duration beat{};
  std::vector<int64_t> counts;             // per rank, as last read
  std::vector<Clock::time_point> changed;  // per rank, when its count last moved

  void start_heartbeat(const DistributedOptions& o) {
    const auto eighth = std::chrono::duration<double>(o.timeout_seconds / 8);
    beat = std::chrono::duration_cast<Clock::duration>(
        std::clamp(eighth, std::chrono::duration<double>(0.05), std::chrono::duration<double>(5.0)));
    counts.assign(static_cast<size_t>(o.world_size), -1);
    changed.assign(static_cast<size_t>(o.world_size), Clock::now());
    heartbeat = std::thread([this, rank = o.rank, world = o.world_size] {
      const auto key = [](int64_t r) { return "tinylm/alive/" + std::to_string(r); };
      for (;;) {
        try {
          store->add(key(rank), 1);
          for (int64_t r = 0; r < world; ++r) {
            if (r == rank) continue;
            const int64_t count = store->add(key(r), 0);
            std::lock_guard<std::mutex> lock(mutex);
            if (count != counts[r]) counts[r] = count, changed[r] = Clock::now();
          }
        } catch (const std::exception&) {
          return;  // the store is gone: the collectives say so themselves
        }
        std::unique_lock<std::mutex> lock(mutex);
        if (wake.wait_for(lock, beat, [this] { return stopping; })) return;
      }
    });
  }

  /// "rank 1 has given no sign of life for 11 s" (and more ranks), or "" when every
  /// other rank's heartbeat is recent.
  std::string silent_ranks(int64_t self) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto now = Clock::now();
    std::string out;
    for (size_t r = 0; r < changed.size(); ++r) {
      const auto quiet = std::chrono::duration<double>(now - changed[r]).count();
      if (static_cast<int64_t>(r) == self || now - changed[r] < 3 * beat) continue;
      out += std::string(out.empty() ? "" : ", ") + "rank " + std::to_string(r) +
             " has given no sign of life for " + std::to_string(static_cast<int64_t>(quiet)) + " s";
    }
    return out;
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (heartbeat.joinable()) heartbeat.join();
  }
};

ProcessGroup::ProcessGroup(DistributedOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::connect(const DistributedOptions& o) {
  check_distributed_options(o);
  std::shared_ptr<ProcessGroup> group(new ProcessGroup(o));
  group->backend_ = resolve_backend(o);
  if (o.world_size == 1) return group;  // nothing to meet: every collective is the identity
  const auto timeout = milliseconds(o.timeout_seconds);
  const std::string where = o.master_addr + ":" + std::to_string(o.master_port);
  try {
    if (!o.store_file.empty()) {
      group->impl_->store = c10::make_intrusive<c10d::FileStore>(o.store_file, static_cast<int>(o.world_size));
      group->impl_->store->setTimeout(timeout);
    } else {
      c10d::TCPStoreOptions store_options;
      store_options.port = static_cast<uint16_t>(o.master_port);
      store_options.isServer = o.rank == 0;
      store_options.numWorkers = static_cast<size_t>(o.world_size);
      store_options.waitWorkers = false;  // each rank says it arrived (arrive()): rank 0 names a missing one
      store_options.timeout = timeout;
      use_classic_store(store_options, 0);
      group->impl_->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
    }
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", o.rank, " of ", o.world_size, " could not join the job at ", where,
                " within ", o.timeout_seconds, " s: ", first_line(e),
                " (is rank 0 running, and are the address and port right and free?)");
  }
  group->arrive();
  group->impl_->start_heartbeat(o);
  try {
    if (group->backend_ == DistBackend::nccl) {
#ifdef TINYLM_HAVE_NCCL
      // Without blocking wait, NCCL's wait() returns at once and a lost peer hangs the
      // next CUDA call; with it, wait() honours the timeout and throws.
      if (!std::getenv("TORCH_NCCL_BLOCKING_WAIT")) ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 1);
      if (!std::getenv("NCCL_BLOCKING_WAIT")) ::setenv("NCCL_BLOCKING_WAIT", "1", 1);
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      group->impl_->engine = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          group->impl_->store, static_cast<int>(o.rank), static_cast<int>(o.world_size), nccl_options);
#endif
    } else {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      const bool loopback = o.master_addr == "127.0.0.1" || o.master_addr == "localhost";
      gloo_options->devices.push_back(
          loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                   : c10d::ProcessGroupGloo::createDefaultDevice());
      group->impl_->engine = c10::make_intrusive<c10d::ProcessGroupGloo>(
          group->impl_->store, static_cast<int>(o.rank), static_cast<int>(o.world_size), gloo_options);
    }
  } catch (const std::exception& e) {
    const std::string why = first_line(e);
    TORCH_CHECK(false, "rank ", o.rank, " of ", o.world_size, " could not join the job at ", where,
                " within ", o.timeout_seconds, " s: ", why,
                " (is rank 0 running, and are the address and port right and free?)");
  }
  return group;
}

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

/// name:value pairs, length-prefixed (names and values may hold any byte).
std::string encode_settings(const std::vector<std::pair<std::string, std::string>>& settings) {
  std::string out;
  for (const auto& [k, v] : settings) out += std::to_string(k.size()) + ":" + k + std::to_string(v.size()) + ":" + v;
  return out;
}

std::vector<std::pair<std::string, std::string>> decode_settings(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = 0;
  auto field = [&]() {
    const size_t colon = s.find(':', at);
    TORCH_CHECK(colon != std::string::npos, "a rank sent malformed settings");
    const size_t n = std::stoull(s.substr(at, colon - at));
    TORCH_CHECK(n <= s.size() - colon - 1, "a rank sent malformed settings");
    std::string value = s.substr(colon + 1, n);
    at = colon + 1 + n;
    return value;
  };
  while (at < s.size()) {
    std::string k = field();
    out.emplace_back(std::move(k), field());
  }
  return out;
}

}  // namespace

void ProcessGroup::arrive() {
  auto& store = *impl_->store;
  store.set("tinylm/arrived/" + std::to_string(options_.rank), bytes_of("1"));
  if (options_.rank != 0) return;
  // Rank 0 waits for each rank in turn, all within one timeout, and names the first that
  // never came.
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(options_.timeout_seconds);
  for (int64_t r = 1; r < options_.world_size; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    bool arrived = false;
    try {
      store.wait({"tinylm/arrived/" + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
      arrived = true;
    } catch (const std::exception&) {
    }
    TORCH_CHECK(arrived, "rank ", r, " of ", options_.world_size, " never joined the job at ",
                options_.store_file.empty() ? options_.master_addr + ":" + std::to_string(options_.master_port)
                                            : "'" + options_.store_file + "'",
                " within ", options_.timeout_seconds,
                " s: was it started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?");
  }
}

void ProcessGroup::agree(const std::vector<std::pair<std::string, std::string>>& settings) {
  if (options_.world_size == 1) return;
  auto& store = *impl_->store;
  const std::string prefix = "tinylm/agree/" + std::to_string(agreements_++) + "/";
  store.set(prefix + std::to_string(options_.rank), bytes_of(encode_settings(settings)));
  std::vector<std::vector<std::pair<std::string, std::string>>> all(static_cast<size_t>(options_.world_size));
  for (int64_t r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) {
      all[r] = settings;
      continue;
    }
    std::vector<uint8_t> got;
    try {
      store.wait({prefix + std::to_string(r)}, milliseconds(options_.timeout_seconds));
      got = store.get(prefix + std::to_string(r));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "rank ", options_.rank, " of ", options_.world_size, ": rank ", r,
                  " did not describe its run within ", options_.timeout_seconds, " s (", first_line(e),
                  "): it died or stopped answering");
    }
    all[r] = decode_settings(std::string(got.begin(), got.end()));
  }
  // The first difference from rank 0, looked for the same way on every rank.
  for (size_t r = 1; r < all.size(); ++r) {
    const auto& a = all[0];
    const auto& b = all[r];
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      const std::string name = i < a.size() ? a[i].first : b[i].first;
      const std::string va = i < a.size() ? a[i].second : "(nothing)", vb = i < b.size() ? b[i].second : "(nothing)";
      TORCH_CHECK(i < a.size() && i < b.size() && a[i] == b[i], "the ranks of this job disagree on ",
                  internal::printable(name), ": rank 0 has ", internal::printable(va), ", rank ", r, " has ",
                  internal::printable(vb), " (start every rank with the same settings)");
    }
  }
}

torch::Tensor ProcessGroup::stage(const torch::Tensor& flat) const {
  if (backend_ == DistBackend::nccl) return flat.device() == options_.device ? flat : flat.to(options_.device);
  return flat.is_cpu() ? flat : flat.cpu();  // Gloo: through host memory
}

std::function<std::string()> ProcessGroup::silent() const {
  return [this] { return impl_->silent_ranks(options_.rank); };
}

void ProcessGroup::all_reduce_sum(const std::vector<torch::Tensor>& tensors) { all_reduce(tensors, false); }

void ProcessGroup::all_reduce_mean(const std::vector<torch::Tensor>& tensors) { all_reduce(tensors, true); }

void ProcessGroup::all_reduce(const std::vector<torch::Tensor>& tensors, bool mean) {
  if (tensors.empty() || options_.world_size == 1) return;
  torch::NoGradGuard no_grad;
  auto flat = flat_view(tensors);
  std::vector<torch::Tensor> buffers{stage(flat)};
  wait(options_, "all-reduce", impl_->engine->allreduce(buffers), silent());
  if (mean) buffers[0].div_(static_cast<double>(options_.world_size));
  if (!buffers[0].is_same(flat)) flat.copy_(buffers[0]);
  scatter_back(flat, tensors);
}

torch::Tensor ProcessGroup::all_gather(const torch::Tensor& tensor) {
  if (options_.world_size == 1) return tensor.unsqueeze(0).clone();
  auto input = stage(tensor.contiguous());
  std::vector<torch::Tensor> inputs{input};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int64_t r = 0; r < options_.world_size; ++r) outputs[0].push_back(torch::empty_like(input));
  wait(options_, "all-gather", impl_->engine->allgather(outputs, inputs), silent());
  return torch::stack(outputs[0]).to(tensor.device());
}

void ProcessGroup::broadcast(const std::vector<torch::Tensor>& tensors, int64_t root) {
  if (tensors.empty() || options_.world_size == 1) return;
  torch::NoGradGuard no_grad;
  auto flat = flat_view(tensors);
  std::vector<torch::Tensor> buffers{stage(flat)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  wait(options_, "broadcast", impl_->engine->broadcast(buffers, options), silent());
  if (!buffers[0].is_same(flat)) flat.copy_(buffers[0]);
  scatter_back(flat, tensors);
}

bool ProcessGroup::any(bool flag) {
  if (options_.world_size == 1) return flag;
  std::vector<torch::Tensor> buffers{stage(torch::full({1}, flag ? 1.0f : 0.0f))};
  wait(options_, "all-reduce", impl_->engine->allreduce(buffers), silent());
  return buffers[0].item<float>() > 0;
}

void ProcessGroup::barrier() {
  if (options_.world_size == 1) return;
  wait(options_, "barrier", impl_->engine->barrier(), silent());
}

}  // namespace tinylm::train
