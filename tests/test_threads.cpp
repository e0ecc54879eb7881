// src/threads.cpp: set_cpu_threads() sets LibTorch's thread count, refusing too many.
#include "test_util.h"

#include <tinylm/threads.h>

#include "internal/machine.h"

#include <ATen/Parallel.h>

using namespace tinylm;
using tinylm::test::error_message;

TEST_CASE("thread counts beyond the machine's CPUs are refused", "[resources][errors]") {
  CHECK_THAT(error_message([] { set_cpu_threads(100000); }),
             Catch::Contains("threads 100000 is more than the"));
}

TEST_CASE("set_cpu_threads sets LibTorch's thread count; zero, negative and refused counts leave it alone",
          "[threads]") {
  const int before = at::get_num_threads();
  struct ThreadsBack {  // whatever happens, the count the process had
    int n;
    ~ThreadsBack() { at::set_num_threads(n); }
  } back{before};
  set_cpu_threads(1);
  CHECK(at::get_num_threads() == 1);
  if (internal::usable_cpu_count() >= 2) {
    set_cpu_threads(2);
    CHECK(at::get_num_threads() == 2);
    set_cpu_threads(1);
    CHECK(at::get_num_threads() == 1);
  }
  CHECK_FALSE(set_cpu_threads(0));  // 0: LibTorch's default, nothing is changed
  CHECK(at::get_num_threads() == 1);
  CHECK_FALSE(set_cpu_threads(-3));
  CHECK(at::get_num_threads() == 1);
  const int64_t too_many = internal::usable_cpu_count() + 1;
  CHECK_THAT(error_message([&] { set_cpu_threads(too_many); }), Catch::Contains("is more than the"));
  CHECK(at::get_num_threads() == 1);  // refused before anything was set
}
