// tinylm bench: the command; the harness and its cases are apps/bench.cpp.
#include "../bench.h"
#include "../command.h"

#include <memory>

namespace tinylm::cli {

Command add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  BenchArgs& bench_args = *args;
  auto* bench_cmd = app.add_subcommand("bench", "benchmarks: JSON lines with medians over repetitions");
  bench_cmd->add_option("--cases", bench_args.cases, "comma-separated: peak, p1, p2, p3, attention, gemm, dp, data, nanogpt, gpt2, arch, decode")
      ->capture_default_str();
  bench_cmd->add_flag("--bf16", bench_args.bf16,
                      "train with bfloat16 products (cases p1, p2, nanogpt, gpt2; named <case>_bf16), or time attention's T x T products in bfloat16 against float32 (case attention)");
  bench_cmd->add_flag("--quick", bench_args.quick, "tiny repetition counts: checks the harness, not speed");
  bench_cmd->add_option("--threads", bench_args.threads, "intra-op CPU threads; 0 = default")
      ->capture_default_str();
  bench_cmd->add_option("--memory-steps", bench_args.memory_steps,
                        "also train P2 this many more steps and report resident-memory growth")
      ->capture_default_str();

  return {bench_cmd, [args] { return run_bench(*args); }};
}

Command add_bench_worker(CLI::App& app) {
  auto args = std::make_shared<BenchWorkerArgs>();
  auto* cmd = app.add_subcommand("bench-worker", "a worker process of tinylm bench (started by it)");
  cmd->group("");  // not listed by --help
  cmd->add_option("kind", args->kind, "dp or data")->required()->check(CLI::IsMember({"dp", "data"}));
  cmd->add_option("--data", args->data, "data: the prepared corpus");
  cmd->add_flag("--in-memory", args->in_memory, "data: copy the corpus into memory");
  cmd->add_flag("--quick", args->quick, "tiny repetition counts");
  integer(cmd->add_option("--threads", args->threads, "intra-op CPU threads"));
  return {cmd, [args] { return run_bench_worker(*args); }};
}

}  // namespace tinylm::cli
