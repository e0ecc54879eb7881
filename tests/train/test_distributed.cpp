// Data-parallel pieces that run in one process: the environment a launcher sets, option
// checks, a one-rank group, and the checkpoint comparison tests/cli/test_distributed.sh
// uses to check that N processes train what one process trains.
#include "../test_util.h"

#include <tinylm/train/checkpoint.h>
#include <tinylm/train/distributed.h>

#include <cstdlib>

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
  CHECK_THAT(error_message([&] { validate(bad); }), Catch::Contains("timeout must be > 0"));
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
  double worst = 0;
  for (const auto& name : a.parameter_names) {
    auto x = a.model.at(name), y = b.model.at(name);
    const std::string suffix = "qkv_proj.bias";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
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
