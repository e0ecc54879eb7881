// The unit tests' program: ctest runs it once per test file (`-# [#test_attention]`).
#include "runner.h"

int main(int argc, char* argv[]) { return tinylm::test::run_catch(argc, argv); }
