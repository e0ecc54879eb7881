// tinylm: the command-line tool, a client of the library. One subcommand per file in
// apps/commands/ (see command.h); this file makes the command line, the logger, and turns
// an error into one line on stderr and exit status 1.
//   tinylm train  [--config F] [--flags...] [--resume CKPT|DIR] [--print-config] [--nproc N]
//   tinylm eval   CKPT|DIR [--json]
//   tinylm sample CKPT|DIR --prompt "..." [--heatmap]
//   tinylm prepare --data TEXT... --out DIR [--tokenizer bpe|unigram|byte] [--vocab-size N]
//   tinylm inspect | upgrade | export | import | bench
#include "command.h"

#include <tinylm/version.h>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

using namespace tinylm;

int main(int argc, char** argv) {
  // Training allocates and frees the same large activation buffers every step. glibc
  // would hand them back to the kernel (mmap/trim) and page-fault them in again on the
  // next step; keeping freed memory in the process avoids that. Peak memory is unchanged.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  CLI::App app{"tinylm: train, evaluate and sample tiny transformer language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tinylm ") + TINYLM_VERSION_STRING + ": " +
                                        TINYLM_BUILD_DESCRIPTION);
  app.fallthrough();  // --log-level works after the subcommand too
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  const cli::Invocation invocation(argv, argv + argc);
  const std::vector<cli::Command> commands = {
      cli::add_train(app, invocation), cli::add_eval(app),   cli::add_sample(app),
      cli::add_bench(app),             cli::add_inspect(app), cli::add_upgrade(app),
      cli::add_export(app),            cli::add_import(app),  cli::add_prepare(app), cli::add_serve(app),
      cli::add_bench_worker(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other error: what is wrong, and where the options are listed.
    std::fprintf(stderr, "error: %s (tinylm --help, or tinylm SUBCOMMAND --help, lists the options)\n",
                 e.what());
    return e.get_exit_code();
  }

  auto log = std::make_shared<spdlog::logger>("tinylm", std::make_shared<spdlog::sinks::stdout_sink_mt>());
  log->set_pattern("%v");
  log->set_level(spdlog::level::from_str(log_level));
  spdlog::register_logger(log);

  try {
    for (const auto& command : commands)
      if (*command.app) return command.run();
  } catch (const c10::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
