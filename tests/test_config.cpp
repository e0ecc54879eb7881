// src/config.cpp: the run config: defaults, its model kind's options, refusals and validation.
#include "test_util.h"

#include <tinylm/config.h>
#include <tinylm/nn/model_kind.h>

#include <cmath>
#include <string>

using namespace tinylm;
using tinylm::test::error_message;

TEST_CASE("defaults are the reference run and validate", "[config]") {
  RunConfig c;
  CHECK(c.task == "repeat");
  CHECK(c.get<int64_t>("vocab-size") == 64);
  CHECK(c.get<int64_t>("d-model") == 32);
  CHECK(c.get<int64_t>("n-heads") == 4);
  CHECK(c.task_options.seq_len() == 12);
  CHECK(c.trainer.batch_size() == 16);
  CHECK(c.total_steps() == 360);
  CHECK(c.trainer.optimizer().lr() == 5e-3);
  CHECK(c.trainer.seed() == 42);
  check_config(c);
}

TEST_CASE("a key the chosen model or task kind does not take is refused, naming where it was given",
          "[config][errors]") {
  RunConfig c;
  c.set("n-layers", 8);
  CHECK_THAT(error_message([&] { check_config(c); }),
             Catch::StartsWith("n-layers is not an option of model tiny (its options: vocab-size, context-length, "
                               "d-model, n-heads, ") &&
                 Catch::Contains("n-layers is for model transformer; drop it, or set model to one of those"));
  c.set("model", "transformer");  // given in any order: the final kinds decide
  check_config(c);
  CHECK(takes(c, *find_config_field("n-layers")));

  RunConfig file;
  apply_toml(file, "d-model = 16\npre-ln = true\n", "x.toml");
  CHECK_THAT(error_message([&] { check_config(file); }), Catch::StartsWith("x.toml:2: pre-ln is not an option of model tiny"));
  RunConfig old;  // the older spelling of attention-kernel, which tiny has too
  apply_toml(old, "fused-attention = false\n", "x.toml");
  check_config(old);

  RunConfig data;
  data.set("data", "/etc/passwd");
  CHECK_THAT(error_message([&] { check_config(data); }),
             Catch::StartsWith("task repeat reads no data (it reads seq-len, vocab-size): data is for task text, "
                               "tokens"));
  data.set("task", "tokens");
  check_config(data);
  data.set("val-fraction", 0.2);
  CHECK_THAT(error_message([&] { check_config(data); }),
             Catch::StartsWith("task tokens reads no val-fraction") && Catch::Contains("val-fraction is for task text"));
}

TEST_CASE("the run config holds its model kind's own options struct, whatever the order of the keys",
          "[config]") {
  RunConfig c;
  CHECK(c.model.kind() == "tiny");
  CHECK(c.model.options<nn::TinyAttentionLMOptions>().d_model() == 32);  // the run's preset
  CHECK_THAT(error_message([&] { c.model.options<nn::TransformerLMOptions>(); }),
             Catch::Contains("the options of a 'tiny' model are not of the type asked for"));
  c.set("d-model", 48);
  c.set("n-layers", 3);  // before the kind that has it: kept aside, not in tiny's options
  CHECK(c.other_model_options.count("n_layers") == 1);
  CHECK(c.get<int64_t>("n-layers") == 3);
  c.set("model", "transformer");  // shared options carry over; the one kept aside is taken up
  const auto& t = c.model.options<nn::TransformerLMOptions>();
  CHECK(t.d_model() == 48);
  CHECK(t.n_layers() == 3);
  CHECK(t.n_heads() == 4);
  CHECK(c.other_model_options.empty());
  c.set("mlp-hidden", 40);
  c.set("activation", "swiglu");
  CHECK(c.model.options<nn::TransformerLMOptions>().block().mlp().hidden() == 40);
  check_config(c);
  // Back to tiny: what only the transformer has waits, and is refused as given.
  c.set("model", "tiny");
  CHECK(c.model.options<nn::TinyAttentionLMOptions>().d_model() == 48);
  CHECK(c.other_model_options.count("mlp_hidden") == 1);
  CHECK_THAT(error_message([&] { check_config(c); }), Catch::Contains("is not an option of model tiny"));
  // Building, counting and sizing take the value itself: the model of the options it holds.
  RunConfig d;
  d.set("model", "transformer");
  d.set("n-layers", 2);
  d.set("context-length", 0);  // = seq-len, which the model gets
  const auto settings = d.model_settings();
  CHECK(settings.options<nn::TransformerLMOptions>().context_length() == d.task_options.seq_len());
  CHECK(d.model.options<nn::TransformerLMOptions>().context_length() == 0);
  CHECK(nn::parameter_count(settings) == nn::count_parameters(*nn::build_model(settings)));
}

TEST_CASE("validate names the field, the value and the rule", "[config][errors]") {
  auto bad = [](auto edit) {
    RunConfig c;
    edit(c);
    return error_message([&] { check_config(c); });
  };
  CHECK_THAT(bad([](RunConfig& c) { c.trainer.optimizer().lr(0); }), Catch::Contains("lr must be a finite number > 0, got 0"));
  CHECK_THAT(bad([](RunConfig& c) { c.task = "addition"; }),
             Catch::Contains("task must be one of repeat, copy, reverse, sort, text, tokens, got 'addition'"));
  CHECK_THAT(bad([](RunConfig& c) { c.set("n-heads", 3); }),
             Catch::Contains("d-model 32 must be divisible by n-heads 3"));
  CHECK_THAT(bad([](RunConfig& c) { c.set("context-length", 4); }),
             Catch::Contains("context-length 4 is shorter than seq-len 12"));
  CHECK_THAT(bad([](RunConfig& c) { c.task = "text"; }),
             Catch::Contains("task text needs a training file"));
  CHECK_THAT(bad([](RunConfig& c) { c.task = "text"; c.task_options.data("f"); }),
             Catch::Contains("vocab-size must be 256, got 64"));
  CHECK_THAT(bad([](RunConfig& c) { c.trainer.batch_size(0); }),
             Catch::Contains("batch-size must be >= 1, got 0"));
  // Degenerate settings that would train without a word (issue 35).
  CHECK_THAT(bad([](RunConfig& c) { c.set("vocab-size", 1); }),
             Catch::Contains("vocab-size 1 leaves the repeat task nothing to learn: it needs at least 2 symbols"));
  CHECK_THAT(bad([](RunConfig& c) { c.set("vocab-size", 1); c.task = "copy"; }),
             Catch::Contains("task copy needs vocab-size >= 2, got 1"));
  CHECK_THAT(bad([](RunConfig& c) { c.set("model", "transformer"); c.set("dropout", 1.0); }),
             Catch::Contains("dropout must be in [0, 1), got 1"));
  CHECK_THAT(bad([](RunConfig& c) { c.set("model", "transformer"); c.set("attn-dropout", 1.0); }),
             Catch::Contains("attn-dropout must be in [0, 1), got 1"));
  // A field whose value is one of a set refuses another as it is set: the options
  // behind it (an enum) could not hold it.
  RunConfig c;
  CHECK_THAT(error_message([&] { c.set("optimizer", "sgd"); }),
             Catch::Contains("optimizer must be one of adam, adamw, got 'sgd'"));
  CHECK_THAT(error_message([&] { apply_toml(c, "lr-schedule = \"linear\"\n", "my.toml"); }),
             Catch::Contains("my.toml:1: lr-schedule must be one of constant, cosine, got 'linear'"));
  CHECK(c.get<std::string>("optimizer") == "adam");
}

TEST_CASE("settings whose products overflow or that are not finite are refused", "[config][errors]") {
  RunConfig c;
  c.trainer.epochs(4611686018427387904);  // 2^62
  c.trainer.steps_per_epoch(4);
  CHECK_THAT(error_message([&] { check_config(c); }), Catch::Contains("overflows the step counter"));
  c = RunConfig{};
  c.trainer.grad_accum(1000000000000000000);
  CHECK_THAT(error_message([&] { check_config(c); }), Catch::Contains("overflows the token counter"));
  c = RunConfig{};
  c.trainer.optimizer().weight_decay(INFINITY);
  CHECK_THAT(error_message([&] { check_config(c); }), Catch::Contains("weight-decay must be a finite number"));
  c = RunConfig{};
  c.trainer.grad_clip(NAN);
  CHECK_THAT(error_message([&] { check_config(c); }), Catch::Contains("grad-clip must be a finite number"));
}

