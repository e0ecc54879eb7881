// Data-parallel process groups on c10d: TCPStore rendezvous + ProcessGroupGloo.
#include <tinylm/train/distributed.h>

#include "internal/system.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

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

}  // namespace

void validate(const DistributedOptions& o) {
  TORCH_CHECK(o.world_size >= 1, "world size must be >= 1, got ", o.world_size);
  TORCH_CHECK(o.rank >= 0 && o.rank < o.world_size, "rank must be in [0, world size ",
              o.world_size, "), got ", o.rank);
  TORCH_CHECK(o.master_port >= 1 && o.master_port <= 65535, "master port must be in [1, 65535], got ",
              o.master_port);
  TORCH_CHECK(!o.master_addr.empty(), "master address must not be empty");
  TORCH_CHECK(std::isfinite(o.timeout_seconds) && o.timeout_seconds > 0,
              "distributed timeout must be > 0 seconds, got ", o.timeout_seconds);
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
  TORCH_CHECK(local_rank >= 0 && local_rank <= o.rank, "LOCAL_RANK=", local_rank,
              " must be in [0, RANK=", o.rank, "]");
  if (const char* addr = std::getenv("MASTER_ADDR")) o.master_addr = addr;
  o.master_port = env_integer("MASTER_PORT", o.master_port);
  TORCH_CHECK(o.master_port >= 1 && o.master_port <= 65535, "MASTER_PORT=", o.master_port,
              " must be in [1, 65535]");
  TORCH_CHECK(!o.master_addr.empty(), "MASTER_ADDR is empty: set it to rank 0's host");
  return o;
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
};

ProcessGroup::ProcessGroup(DistributedOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::connect(const DistributedOptions& o) {
  validate(o);
  std::shared_ptr<ProcessGroup> group(new ProcessGroup(o));
  if (o.world_size == 1) return group;  // nothing to meet: every collective is the identity
  const auto timeout = milliseconds(o.timeout_seconds);
  const std::string where = o.master_addr + ":" + std::to_string(o.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(o.master_port);
    store_options.isServer = o.rank == 0;
    store_options.numWorkers = static_cast<size_t>(o.world_size);
    store_options.waitWorkers = true;
    store_options.timeout = timeout;
    use_classic_store(store_options, 0);
    group->impl_->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    const bool loopback = o.master_addr == "127.0.0.1" || o.master_addr == "localhost";
    gloo_options->devices.push_back(
        loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                 : c10d::ProcessGroupGloo::createDefaultDevice());
    group->impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
        group->impl_->store, static_cast<int>(o.rank), static_cast<int>(o.world_size), gloo_options);
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) why = c10_error->what_without_backtrace();
    why = why.substr(0, why.find('\n'));
    TORCH_CHECK(false, "rank ", o.rank, " of ", o.world_size, " could not join the job at ", where,
                " within ", o.timeout_seconds, " s: ", why,
                " (is rank 0 running, and are the address and port right and free?)");
  }
  return group;
}

void ProcessGroup::all_reduce_mean(const std::vector<torch::Tensor>& tensors) {
  if (tensors.empty() || options_.world_size == 1) return;
  torch::NoGradGuard no_grad;
  auto flat = flat_view(tensors);
  std::vector<torch::Tensor> buffers{flat};
  impl_->gloo->allreduce(buffers)->wait();
  flat.div_(static_cast<double>(options_.world_size));
  scatter_back(flat, tensors);
}

void ProcessGroup::broadcast(const std::vector<torch::Tensor>& tensors, int64_t root) {
  if (tensors.empty() || options_.world_size == 1) return;
  torch::NoGradGuard no_grad;
  auto flat = flat_view(tensors);
  std::vector<torch::Tensor> buffers{flat};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  impl_->gloo->broadcast(buffers, options)->wait();
  scatter_back(flat, tensors);
}

bool ProcessGroup::any(bool flag) {
  if (options_.world_size == 1) return flag;
  std::vector<torch::Tensor> buffers{torch::full({1}, flag ? 1.0f : 0.0f)};
  impl_->gloo->allreduce(buffers)->wait();
  return buffers[0].item<float>() > 0;
}

void ProcessGroup::barrier() {
  if (options_.world_size == 1) return;
  impl_->gloo->barrier()->wait();
}

}  // namespace tinylm::train
