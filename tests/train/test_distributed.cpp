// Data-parallel pieces that run in one process: the environment a launcher sets, option
// checks, a one-rank group, and the checkpoint comparison tests/cli/test_distributed.sh
// uses to check that N processes train what one process trains.
#include "../test_util.h"

#include <tinylm/data/tasks.h>
#include <tinylm/nn/model.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/distributed.h>
#include <tinylm/train/trainer.h>


#include <cstdlib>
#include <future>
#include <thread>

using namespace tinylm::train;
using tinylm::test::error_message;
using tinylm::test::max_abs_diff;

namespace {

/// Sets environment variables for one scope and restores the old values after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) ::setenv(name, value, 1);
      else ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, old] : saved_) {
      if (old) ::setenv(name.c_str(), old->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

/// Two ranks of one job in this process (a thread each): rank 0's group and rank 1's.
std::pair<std::shared_ptr<ProcessGroup>, std::shared_ptr<ProcessGroup>> two_ranks(double timeout) {
  DistributedOptions o;
  o.world_size = 2;
  o.master_port = free_loopback_port();
  o.timeout_seconds = timeout;
  auto rank1 = std::async(std::launch::async, [o]() mutable {
    o.rank = 1;
    return ProcessGroup::connect(o);
  });
  auto rank0 = ProcessGroup::connect(o);
  return {rank0, rank1.get()};
}

}  // namespace

TEST_CASE("the launcher's environment describes the job, or is refused clearly",
          "[distributed][errors]") {
  {
    ScopedEnv env{{"WORLD_SIZE", nullptr}, {"RANK", nullptr}};
    CHECK_FALSE(distributed_from_environment().has_value());
  }
  {
    ScopedEnv env{{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "1"},
                  {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29511"}};
    auto o = distributed_from_environment();
    REQUIRE(o.has_value());
    CHECK(o->world_size == 4);
    CHECK(o->rank == 3);
    CHECK(o->master_addr == "10.0.0.7");
    CHECK(o->master_port == 29511);
  }
  auto refused = [](std::initializer_list<std::pair<const char*, const char*>> vars) {
    ScopedEnv env(vars);
    return error_message([] { distributed_from_environment(); });
  };
  CHECK_THAT(refused({{"WORLD_SIZE", "0"}, {"RANK", "0"}}), Catch::Contains("WORLD_SIZE=0 must be >= 1"));
  CHECK_THAT(refused({{"WORLD_SIZE", "2"}, {"RANK", "2"}}), Catch::Contains("RANK=2 must be in [0, WORLD_SIZE=2)"));
  CHECK_THAT(refused({{"WORLD_SIZE", "2"}, {"RANK", nullptr}}), Catch::Contains("RANK is not"));
  CHECK_THAT(refused({{"WORLD_SIZE", "two"}, {"RANK", "0"}}), Catch::Contains("WORLD_SIZE='two' is not a whole number"));
  CHECK_THAT(refused({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "70000"}}),
             Catch::Contains("MASTER_PORT=70000 must be in [1, 65535]"));
  DistributedOptions bad;
  bad.timeout_seconds = 0;
  CHECK_THAT(error_message([&] { check_distributed_options(bad); }), Catch::Contains("timeout must be > 0"));
}

TEST_CASE("the backend: Gloo on the CPU, NCCL only for CUDA in a build that has it",
          "[distributed][errors]") {
  CHECK(parse_dist_backend("auto") == DistBackend::automatic);
  CHECK(parse_dist_backend("gloo") == DistBackend::gloo);
  CHECK(parse_dist_backend("nccl") == DistBackend::nccl);
  CHECK_THAT(error_message([] { parse_dist_backend("mpi"); }),
             Catch::Contains("unknown distributed backend 'mpi': use auto, gloo or nccl"));
  DistributedOptions o;  // CPU
  CHECK(resolve_backend(o) == DistBackend::gloo);
  o.backend = DistBackend::gloo;
  CHECK(resolve_backend(o) == DistBackend::gloo);
  o.backend = DistBackend::nccl;
  const std::string why = error_message([&] { resolve_backend(o); });
  if (nccl_available()) CHECK_THAT(why, Catch::Contains("the nccl backend moves CUDA tensors, but this rank trains on cpu"));
  else CHECK_THAT(why, Catch::Contains("the nccl backend is not in this build"));
  o.device = torch::Device(torch::kCUDA, 0);
  o.backend = DistBackend::automatic;
  CHECK(resolve_backend(o) == (nccl_available() ? DistBackend::nccl : DistBackend::gloo));
  // A process's device: its own GPU where there are GPUs, the CPU otherwise.
  if (!torch::cuda::is_available()) {
    CHECK(resolve_device("auto", 1) == torch::Device(torch::kCPU));
    CHECK_THAT(error_message([] { resolve_device("cuda", 1); }), Catch::Contains("CUDA is not available"));
  } else {
    const auto count = static_cast<int64_t>(torch::cuda::device_count());
    CHECK(resolve_device("cuda", count + 1).index() == (count + 1) % count);
  }
}

TEST_CASE("a one-process group leaves tensors as they are", "[distributed]") {
  DistributedOptions o;  // rank 0 of 1: no store, no peers
  auto group = ProcessGroup::connect(o);
  CHECK(group->rank() == 0);
  CHECK(group->world_size() == 1);
  auto t = torch::arange(6, torch::kFloat32);
  group->all_reduce_mean({t});
  CHECK(torch::equal(t, torch::arange(6, torch::kFloat32)));
  CHECK(group->any(true));
  CHECK_FALSE(group->any(false));
}

TEST_CASE("two ranks reduce, gather and broadcast, and evaluation is split and reduced",
          "[distributed]") {
  auto groups = two_ranks(30);
  auto g0 = groups.first, g1 = groups.second;
  REQUIRE(g1->rank() == 1);
  // Each collective runs on both ranks at once: rank 1 in a thread.
  auto both = [&](auto&& f) {
    auto other = std::async(std::launch::async, [&] { return f(*g1); });
    auto mine = f(*g0);
    return std::make_pair(mine, other.get());
  };
  auto [sum0, sum1] = both([](ProcessGroup& g) {
    auto a = torch::full({3}, static_cast<double>(g.rank() + 1), torch::kFloat64);
    auto b = torch::full({2, 2}, 10.0f * static_cast<float>(g.rank()));
    g.all_reduce_sum({a, b});
    return std::make_pair(a, b);
  });
  CHECK(torch::equal(sum0.first, torch::full({3}, 3.0, torch::kFloat64)));
  CHECK(torch::equal(sum1.second, torch::full({2, 2}, 10.0f)));
  auto [mean0, mean1] = both([](ProcessGroup& g) {
    auto a = torch::full({4}, g.rank() == 0 ? 1.0f : 4.0f);
    g.all_reduce_mean({a});
    return a;
  });
  CHECK(torch::equal(mean0, torch::full({4}, 2.5f)));
  CHECK(torch::equal(mean1, mean0));
  auto [gathered0, gathered1] = both([](ProcessGroup& g) {
    return g.all_gather(torch::full({5}, static_cast<uint8_t>(7 + g.rank()), torch::kUInt8));
  });
  REQUIRE(gathered0.sizes() == torch::IntArrayRef({2, 5}));
  CHECK(gathered0[0].eq(7).all().item<bool>());
  CHECK(gathered0[1].eq(8).all().item<bool>());
  CHECK(torch::equal(gathered0, gathered1));
  auto [cast0, cast1] = both([](ProcessGroup& g) {
    auto t = torch::full({3}, g.rank() == 0 ? 5.0f : -1.0f);
    g.broadcast({t});
    return t;
  });
  CHECK(torch::equal(cast1, torch::full({3}, 5.0f)));
  auto [any0, any1] = both([](ProcessGroup& g) { return g.any(g.rank() == 1); });
  CHECK((any0 && any1));

  // Validation split between the ranks gives the figures of the whole batch.
  torch::manual_seed(3);
  tinylm::nn::TinyAttentionLM model(tinylm::nn::TinyAttentionLMOptions(10, 8, 16, 2));
  tinylm::data::RepeatTask task(8, 10);
  const auto whole = evaluate(*model, task, 3, 8, 99, torch::kCPU);
  auto [split0, split1] = both([&](ProcessGroup& g) {
    tinylm::data::RepeatTask own_task(8, 10);  // each rank samples with its own task
    return evaluate(*model, own_task, 3, 8, 99, torch::kCPU, &g);
  });
  CHECK(split0.rows == whole.rows);
  CHECK(split0.tokens == whole.tokens);
  CHECK(split0.loss == Approx(whole.loss).epsilon(1e-6));
  CHECK(split0.scored_loss == Approx(whole.scored_loss).epsilon(1e-6));
  CHECK(split0.accuracy == Approx(whole.accuracy).epsilon(1e-12));
  CHECK(split0.exact_match == Approx(whole.exact_match).epsilon(1e-12));
  CHECK(split1.loss == split0.loss);
  CHECK_THAT(error_message([&] { evaluate(*model, task, 1, 7, 99, torch::kCPU, g0.get()); }),
             Catch::Contains("batch_size 7 must be a multiple of the world size 2"));
}

TEST_CASE("a collective whose peer has left fails at once, naming the rank", "[distributed][errors]") {
  // A generous timeout: joining can take seconds on a loaded machine (the store's client
  // retries); a peer that leaves closes its connections, which ends the wait at once.
  auto groups = two_ranks(30);
  auto g0 = groups.first;
  groups.second.reset();  // rank 1 leaves the job
  auto t = torch::ones({4});
  const auto start = std::chrono::steady_clock::now();
  const std::string why = error_message([&] { g0->all_reduce_mean({t}); });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_THAT(why, Catch::Contains("rank 0 of 2: the all-reduce failed"));
  CHECK_THAT(why, Catch::Contains("another process of the job died, stopped answering for 30 s, or left"));
  CHECK(why.find('\n') == std::string::npos);
  CHECK(took < 30);
}

// Run by tests/cli/test_distributed.sh with TINYLM_COMPARE_A and TINYLM_COMPARE_B set to
// two checkpoints; hidden ([.]) from the plain test run, which has none to compare.
TEST_CASE("two checkpoints hold the same weights", "[.][compare-checkpoints]") {
  const char* a_path = std::getenv("TINYLM_COMPARE_A");
  const char* b_path = std::getenv("TINYLM_COMPARE_B");
  REQUIRE(a_path);
  REQUIRE(b_path);
  const double tolerance = std::getenv("TINYLM_COMPARE_TOLERANCE")
                               ? std::atof(std::getenv("TINYLM_COMPARE_TOLERANCE"))
                               : 1e-5;
  const auto a = read_checkpoint(a_path), b = read_checkpoint(b_path);
  CHECK(a.state.step == b.state.step);
  REQUIRE(a.parameter_names == b.parameter_names);
  // Tolerance 0 asks for bit-identical checkpoints: every weight whole, the optimizer's
  // state and every generator state (one per rank in a data-parallel run).
  const bool exact = tolerance == 0;
  if (exact) {
    REQUIRE(a.optimizer.size() == b.optimizer.size());
    for (const auto& [key, value] : a.optimizer) {
      INFO("optimizer." << key);
      REQUIRE(b.optimizer.count(key));
      CHECK(torch::equal(value, b.optimizer.at(key)));
    }
    CHECK(a.state.world_size == b.state.world_size);
    CHECK(a.state.epoch_loss_sum == b.state.epoch_loss_sum);
    REQUIRE(a.state.data_rng_state.defined() == b.state.data_rng_state.defined());
    if (a.state.data_rng_state.defined()) CHECK(torch::equal(a.state.data_rng_state, b.state.data_rng_state));
    REQUIRE(a.state.dropout_rng_state.defined() == b.state.dropout_rng_state.defined());
    if (a.state.dropout_rng_state.defined())
      CHECK(torch::equal(a.state.dropout_rng_state, b.state.dropout_rng_state));
  }
  double worst = 0;
  for (const auto& name : a.parameter_names) {
    auto x = a.model.at(name), y = b.model.at(name);
    const std::string suffix = "qkv_proj.bias";
    if (!exact && name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      // The key bias adds q . b_k to every score of a row alike, which softmax ignores:
      // its gradient is 0 in exact arithmetic, so Adam turns rounding noise into steps
      // of about lr, differently in every run. Only the query and value biases count.
      const int64_t D = x.numel() / 3;
      x = torch::cat({x.narrow(0, 0, D), x.narrow(0, 2 * D, D)});
      y = torch::cat({y.narrow(0, 0, D), y.narrow(0, 2 * D, D)});
    }
    const double d = max_abs_diff(x, y);
    std::printf("  %-40s %.3g\n", name.c_str(), d);
    worst = std::max(worst, d);
  }
  std::printf("largest weight difference %.3g over %zu tensors (tolerance %.3g)\n", worst,
              a.parameter_names.size(), tolerance);
  CHECK(worst <= tolerance);
}
