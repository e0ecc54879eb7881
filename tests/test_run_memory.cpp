// src/run_memory.cpp: a run config's memory estimate; runs that cannot fit refused up front.
#include "test_util.h"

#include <tinylm/config.h>
#include <tinylm/nn/model.h>
#include <tinylm/run.h>
#include <tinylm/train/resources.h>
#include <tinylm/train/trainer.h>

#include <string>

using namespace tinylm;
using namespace tinylm::train;
using tinylm::test::error_message;

TEST_CASE("memory estimates refuse sizes that cannot fit, naming the setting", "[resources][errors]") {
  const RunConfig reference;
  const auto m = estimate_memory(reference, reference.trainer.batch_size(), /*training=*/true);
  CHECK(m.parameters == 8384);  // the reference model's own count
  CHECK(m.total() < 64e6);
  check_memory(reference, reference.trainer.batch_size(), true);  // the reference run fits anywhere

  if (available_memory_bytes() == 0) return;  // nothing to compare against here
  struct Case {
    const char* key;
    RunConfig config;
  };
  RunConfig batch = reference, seq = reference, ctx = reference, layers = reference, vocab = reference;
  batch.trainer.batch_size(1000000000);
  seq.task_options.seq_len(1000000000);
  ctx.set("model", "transformer");  // learned positions: a weight per position
  ctx.set("context-length", 1000000000);
  layers.set("model", "transformer");
  layers.set("n-layers", 1000000000);
  vocab.set("vocab-size", 1000000000000);
  // Not a structured binding: lambdas capture those from C++20 on (clang refuses before).
  for (const Case& c : {Case{"batch-size 1000000000", batch}, Case{"seq-len 1000000000", seq},
                        Case{"context-length 1000000000", ctx}, Case{"n-layers 1000000000", layers},
                        Case{"vocab-size 1000000000000", vocab}}) {
    const char* key = c.key;
    const RunConfig& config = c.config;
    INFO(key);
    CHECK_THAT(error_message([&] { check_memory(config, config.trainer.batch_size(), true); }),
               Catch::StartsWith(key) && Catch::Contains("is available: lower"));
    CHECK_THAT(error_message([&] { Trainer trainer = make_trainer(config); }), Catch::StartsWith(key));
  }
  // Without learned positions a long context costs nothing until it is used.
  RunConfig lean = reference;
  lean.set("context-length", 1000000000);
  check_memory(lean, lean.trainer.batch_size(), true);
  // Evaluation with a huge batch: the batch is named.
  CHECK_THAT(error_message([&] { check_memory(reference, 1000000000, false); }),
             Catch::StartsWith("batch-size 1000000000"));
}

TEST_CASE("memory estimates count the model's parameters and grow with the batch", "[resources]") {
  // The parameter count is the model's own, for every model setting the formula covers.
  RunConfig tiny, wide, deep, untied, bare;
  wide.set("d-model", 48);
  wide.set("vocab-size", 100);
  for (RunConfig* c : {&deep, &untied, &bare}) c->set("model", "transformer");
  deep.set("n-layers", 3);
  deep.set("context-length", 20);
  untied.set("tie-weights", false);
  untied.set("positions", "sinusoidal");
  untied.set("mlp-expansion", 2);
  bare.set("bias", false);
  bare.set("positions", "none");
  struct Case {
    const char* name;
    RunConfig config;
  };
  for (const auto& [name, c] : {Case{"tiny", tiny}, Case{"tiny, wide", wide}, Case{"transformer, 3 layers", deep},
                                Case{"transformer, untied, sinusoidal", untied},
                                Case{"transformer, no bias, no positions", bare}}) {
    INFO(name);
    const auto model = build_model(c);
    const auto inference = estimate_memory(c, c.trainer.batch_size(), false);
    CHECK(inference.parameters == static_cast<double>(nn::count_parameters(*model)));
    CHECK(inference.parameter_bytes == 4 * inference.parameters);  // float32 weights
    // Training adds gradients and Adam's two moments, and keeps activations for backward.
    const auto training = estimate_memory(c, c.trainer.batch_size(), true);
    CHECK(training.parameter_bytes == 4 * inference.parameter_bytes);
    CHECK(training.activation_bytes > inference.activation_bytes);
    // Activations are per row: twice the batch, twice the bytes; the rest is unchanged.
    const auto doubled = estimate_memory(c, 2 * c.trainer.batch_size(), true);
    CHECK(doubled.activation_bytes == Approx(2 * training.activation_bytes).epsilon(1e-12));
    CHECK(doubled.parameter_bytes == training.parameter_bytes);
    CHECK(doubled.buffer_bytes == training.buffer_bytes);
    // On a GPU the host holds only the weights while the model is built.
    const auto cuda = estimate_memory(c, c.trainer.batch_size(), true, /*on_cuda=*/true);
    CHECK(cuda.total() == inference.parameter_bytes);
  }
  // The text task's file is read, then held: twice its size.
  const auto dir = tinylm::test::scratch_dir("resources_text");
  tinylm::test::write_file(dir / "t.txt", std::string(1000, 'a'));
  RunConfig text;
  text.task = "text";
  text.set("vocab-size", 256);
  text.task_options.data((dir / "t.txt").string());
  CHECK(estimate_memory(text, text.trainer.batch_size(), true).data_bytes == 2000);
  text.task_options.data((dir / "missing.txt").string());  // the task names a missing file itself
  CHECK(estimate_memory(text, text.trainer.batch_size(), true).data_bytes == 0);
}
