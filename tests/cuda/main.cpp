// The CUDA suite: runs its tests where CUDA is available; elsewhere it exits with 77,
// which ctest reports as "Skipped" (visibly), never as passed.
#include "../runner.h"

#include <torch/cuda.h>

#include <cstdio>
#include <string>

int main(int argc, char* argv[]) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::string(argv[i]).rfind("--list", 0) == 0;
  if (!listing && !torch::cuda::is_available()) {
    std::printf("SKIPPED: CUDA is not available on this machine (torch::cuda::is_available() is false)\n");
    return 77;
  }
  return tinylm::test::run_catch(argc, argv);
}
