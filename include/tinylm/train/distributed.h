// Data-parallel training across processes on PyTorch's own engine, c10d: a TCPStore for
// the rendezvous, and ProcessGroupGloo (CPU, any host) or ProcessGroupNCCL (CUDA, where
// LibTorch was built with it) for the collectives.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tinylm::train {

/// The engine that moves the tensors: Gloo works on any host and with any device (CUDA
/// tensors travel through host memory); NCCL moves CUDA tensors GPU to GPU.
enum class DistBackend { automatic, gloo, nccl };

/// "auto", "gloo" or "nccl"; anything else is an error naming the choices.
DistBackend parse_dist_backend(const std::string& name);
const char* to_string(DistBackend backend);

/// Whether this build of tinylm can use NCCL (LibTorch with CUDA and NCCL, and nccl.h
/// found when tinylm was built).
bool nccl_available();

/// Where a process stands in a data-parallel job, and how to reach the others.
struct DistributedOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;  // index of the process on its host (LOCAL_RANK): picks its GPU
  std::string master_addr = "127.0.0.1";  // rank 0 hosts the store there
  int64_t master_port = 29500;
  /// Non-empty: a job on one host meets through this file (c10d's FileStore, in a
  /// directory only this user can enter) instead of rank 0's TCP store, so nothing
  /// listens on the network but Gloo on 127.0.0.1 (`tinylm train --nproc` does this).
  std::string store_file;
  /// Seconds to wait for the others, at the rendezvous and in every collective: a peer
  /// that died or hangs ends the run with an error after this long, not a hang.
  double timeout_seconds = 60.0;
  /// automatic: NCCL when `device` is CUDA and NCCL is available, Gloo otherwise.
  DistBackend backend = DistBackend::automatic;
  /// The device this rank trains on (where NCCL's buffers live).
  torch::Device device = torch::kCPU;
};

/// The backend `options` gets: automatic resolved, an impossible choice (NCCL without
/// CUDA, or in a build without NCCL) refused with the reason and the fix.
DistBackend resolve_backend(const DistributedOptions& options);

/// Throws, naming the value and the rule, when the options cannot describe a job.
void check_distributed_options(const DistributedOptions& options);

/// The job torchrun (or a cluster script) describes in the environment: RANK,
/// WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK is read and checked too), and
/// TINYLM_STORE_FILE (DistributedOptions::store_file). Empty when WORLD_SIZE is not set;
/// an error when the variables are malformed or inconsistent.
std::optional<DistributedOptions> distributed_from_environment();

/// A TCP port on 127.0.0.1 that nothing listens on right now (for a job on one host;
/// another program may take it before rank 0 does, which then fails clearly).
int64_t free_loopback_port();

/// A group of processes that train one model together. Every rank must call every
/// collective, in the same order.
class ProcessGroup {
 public:
  /// Joins the job: rank 0 starts the store at master_addr:master_port, the others
  /// connect to it; returns when all world_size ranks have joined, or throws after the
  /// timeout (rank 0 names the first rank that never arrived; the others the address).
  /// A world of one needs no store and opens no port.
  static std::shared_ptr<ProcessGroup> connect(const DistributedOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const { return options_.rank; }
  int64_t world_size() const { return options_.world_size; }
  /// Gloo or NCCL (resolved; Gloo for a world of one).
  DistBackend backend() const { return backend_; }
  const DistributedOptions& options() const { return options_; }

  /// In place: each tensor becomes the mean of its values on all ranks. Several
  /// tensors travel as one flat buffer (one collective).
  void all_reduce_mean(const std::vector<torch::Tensor>& tensors);
  /// In place: each tensor becomes the sum of its values on all ranks (one collective).
  void all_reduce_sum(const std::vector<torch::Tensor>& tensors);
  /// Every rank's `tensor` (same shape and type on all), stacked: (world_size, ...).
  torch::Tensor all_gather(const torch::Tensor& tensor);
  /// In place: every rank receives rank `root`'s values (one collective for all).
  void broadcast(const std::vector<torch::Tensor>& tensors, int64_t root = 0);
  /// Whether `flag` is true on any rank (a stop request seen by one is honoured by all,
  /// at the same step).
  bool any(bool flag);
  void barrier();

  /// Checks, before the first collective, that every rank describes the job the same
  /// way: `settings` (name, value) in the same order on every rank, exchanged through
  /// the store. At the first difference every rank throws the same one-line error
  /// naming the setting, rank 0's value and the other rank's.
  void agree(const std::vector<std::pair<std::string, std::string>>& settings);

 private:
  explicit ProcessGroup(DistributedOptions options);
  void all_reduce(const std::vector<torch::Tensor>& tensors, bool mean);
  /// Says this rank has joined; rank 0 waits for every other rank (see connect).
  void arrive();
  std::function<std::string()> silent() const;  // the ranks whose heartbeat stopped
  struct Impl;
  /// The buffer a collective runs on: `flat` itself, or a copy on the backend's side
  /// (host memory for Gloo, the rank's GPU for NCCL), copied back by finish().
  torch::Tensor stage(const torch::Tensor& flat) const;
  DistributedOptions options_;
  DistBackend backend_ = DistBackend::gloo;
  std::unique_ptr<Impl> impl_;
  int64_t agreements_ = 0;  // agree() calls so far: each uses keys of its own
};

}  // namespace tinylm::train
