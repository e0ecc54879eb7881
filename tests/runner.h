// The Catch2 session both test programs run (tests/runner.cpp: Catch2's implementation,
// compiled once for both).
#pragma once

namespace tinylm::test {

/// Runs the Catch2 session on the command line's test spec, with the library's log
/// silenced to warnings. Returns Catch2's exit status.
int run_catch(int argc, char* argv[]);

}  // namespace tinylm::test
