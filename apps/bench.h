// tinylm bench: the benchmark harness (JSON lines on stdout).
#pragma once

#include <cstdint>
#include <string>

struct BenchArgs {
  std::string cases = "peak,p1,p2,p3,attention,gemm,dp,data,nanogpt,arch,decode";
  bool quick = false;       // a smoke run: tiny repetition counts (checks the harness, not speed)
  int64_t threads = 1;
  int64_t memory_steps = 0; // > 0: also train P2 this many steps and report RSS growth
  bool bf16 = false;        // the training cases with bfloat16 products, named <case>_bf16
};

int run_bench(const BenchArgs& args);

/// One worker process of the dp and data cases, which start it (`tinylm bench-worker`, a
/// subcommand left out of --help).
struct BenchWorkerArgs {
  std::string kind;  // dp | data
  std::string data;  // data: the prepared corpus
  bool in_memory = false, quick = false;
  int64_t threads = 1;
};

int run_bench_worker(const BenchWorkerArgs& args);
