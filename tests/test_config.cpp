// src/config.cpp: the run config: defaults, TOML in and out, and validation.
#include "test_util.h"

#include <tinylm/config.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

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

TEST_CASE("to_toml and apply_toml round-trip every field", "[config]") {
  RunConfig c;
  c.set("model", "transformer");
  c.set("task", "text");
  c.set("vocab-size", 256);
  c.trainer.optimizer().lr(3.0000000000000001e-4);
  c.set("dropout", 0.1);
  c.set("pre-ln", false);
  c.task_options.data("some \"quoted\" path\\x");
  c.set("n-layers", 7);
  check_config(c);
  RunConfig back;
  const auto keys = apply_toml(back, to_toml(c), "round-trip");
  // Every field but the older spellings that are read and never written, and in-memory
  // (task text does not read it).
  const auto written = std::count_if(config_fields().begin(), config_fields().end(),
                                     [](const ConfigField& f) { return f.written; });
  CHECK(written == static_cast<long>(config_fields().size()) - 1);
  CHECK(static_cast<long>(keys.size()) == written - 1);
  CHECK(std::find(keys.begin(), keys.end(), "in-memory") == keys.end());
  for (const auto& f : config_fields()) {
    INFO(f.name);
    CHECK(field_value_string(f, back) == field_value_string(f, c));
  }
  CHECK(back.trainer.optimizer().lr() == c.trainer.optimizer().lr());
  // What --print-config writes for a person: each key's accepted values after it, and
  // it reads back the same.
  const std::string annotated = to_toml(c, /*with_accepted=*/true);
  CHECK_THAT(annotated, Catch::Contains("\ndropout = 0.1  # must be in [0, 1)\n"));
  CHECK_THAT(annotated, Catch::Contains("\nvocab-size = 256  # must be >= 2 (one token leaves nothing to learn)\n"));
  CHECK_THAT(annotated, Catch::Contains("\noptimizer = \"adam\"  # one of adam, adamw\n"));
  CHECK_THAT(annotated, Catch::Contains("\npre-ln = false\n"));  // any bool goes: no comment
  CHECK(to_toml(c).find("  # ") == std::string::npos);
  RunConfig again;
  CHECK(apply_toml(again, annotated, "annotated") == keys);
  CHECK(to_toml(again) == to_toml(c));
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

TEST_CASE("a config writes the keys its kinds take", "[config]") {
  RunConfig c;
  const std::string tiny = to_toml(c);
  CHECK_THAT(tiny, Catch::Contains("\nd-model = 32\n") && Catch::Contains("\npos-base = "));
  for (const char* other : {"\nn-layers = ", "\ndropout = ", "\npre-ln = ", "\ndata = ", "\nval-fraction = "}) {
    INFO(other);
    CHECK(tiny.find(other) == std::string::npos);
  }
  c.set("model", "transformer");
  c.set("task", "tokens");
  c.set("data", "corpus");
  const std::string transformer = to_toml(c);
  CHECK_THAT(transformer, Catch::Contains("\nn-layers = 2\n") && Catch::Contains("\ndata = \"corpus\"\n") &&
                              Catch::Contains("\nin-memory = false\n"));
  CHECK(transformer.find("\nval-fraction = ") == std::string::npos);
}

TEST_CASE("config files: unknown keys, wrong types and bad TOML are named", "[config][errors]") {
  RunConfig c;
  CHECK_THAT(error_message([&] { apply_toml(c, "learning-rate = 0.1\n", "x.toml"); }),
             Catch::Contains("x.toml: unknown key 'learning-rate'"));
  CHECK_THAT(error_message([&] { apply_toml(c, "d_model = 8\n", "x.toml"); }),
             Catch::Contains("did you mean 'd-model'?"));
  CHECK_THAT(error_message([&] { apply_toml(c, "lr = \"fast\"\n", "x.toml"); }),
             Catch::Contains("x.toml:1: 'lr' must be a number, got string"));
  CHECK_THAT(error_message([&] { apply_toml(c, "\nepochs = 2.5\n", "x.toml"); }),
             Catch::Contains("x.toml:2: 'epochs' must be an integer"));
  CHECK_THAT(error_message([&] { apply_toml(c, "bf16 = 1\n", "x.toml"); }),
             Catch::Contains("'bf16' must be true or false"));
  CHECK_THAT(error_message([&] { apply_toml(c, "task = repeat\n", "x.toml"); }),
             Catch::Contains("x.toml:1: not valid TOML"));
  CHECK_THAT(error_message([&] { apply_toml(c, "[model]\nd-model = 8\n", "x.toml"); }),
             Catch::Contains("x.toml:1: [model] is a table: tinylm configs use flat keys only"));
  CHECK_THAT(error_message([&] { apply_toml_file(c, "/no/such/file.toml"); }),
             Catch::Contains("config file '/no/such/file.toml' does not exist"));
  // An integer is accepted where a float is expected.
  apply_toml(c, "lr = 1\n", "x.toml");
  CHECK(c.trainer.optimizer().lr() == 1.0);
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
  CHECK_THAT(bad([](RunConfig& c) { c.model = "transformer"; c.set("dropout", 1.0); }),
             Catch::Contains("dropout must be in [0, 1), got 1"));
  CHECK_THAT(bad([](RunConfig& c) { c.model = "transformer"; c.set("attn-dropout", 1.0); }),
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

TEST_CASE("every shipped config file parses and validates", "[config][configs]") {
  const std::filesystem::path dir = TINYLM_SOURCE_DIR "/configs";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    INFO(entry.path());
    RunConfig c;
    apply_toml_file(c, entry.path().string());
    if (c.task == "text") c.task_options.data(TINYLM_SOURCE_DIR "/" + c.task_options.data());
    check_config(c);
    ++n;
  }
  CHECK(n >= 5);
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

TEST_CASE("config keys with control characters are shown escaped on one line", "[config][errors]") {
  RunConfig c;
  const std::string msg = error_message([&] { apply_toml(c, "\"a\\nb\\u001b[31m\" = 1\n", "x.toml"); });
  CHECK_THAT(msg, Catch::Contains("unknown key 'a\\x0Ab\\x1B[31m'"));
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(msg.find('\x1b') == std::string::npos);
}

TEST_CASE("text outside ASCII is read in strings and comments only, before toml++ sees it", "[config][errors]") {
  // toml++ 3.3 reaches __builtin_unreachable() testing U+00A1..U+0499 for whitespace; the
  // fuzzer's input (fuzz/regressions/config) has U+0353 inside a key.
  RunConfig c;
  CHECK_THAT(error_message([&] { apply_toml(c, "model = \"tiny\"\nn\xCD\x93layers = 2\n", "x.toml"); }),
             Catch::Contains("x.toml:2: a character outside ASCII stands outside a string or a comment"));
  CHECK_THAT(error_message([&] { apply_toml(c, "seed =\xC2\xA0" "7\n", "y.toml"); }), Catch::Contains("y.toml:1:"));
  // In strings (basic, literal, multi-line) and comments it is text like any other.
  const auto set = apply_toml(c, "# naïve ☃ comment\nout-dir = \"runs/naïve ☃\"  # é\n"
                                 "data = 'données'\ntask = \"\"\"copy\"\"\"\n", "ok.toml");
  CHECK(set.size() == 3);
  CHECK(c.trainer.out_dir() == "runs/naïve ☃");
  CHECK(c.task_options.data() == "données");
}

TEST_CASE("a config file saved with a UTF-8 byte-order mark reads as without it", "[config]") {
  // Notepad and PowerShell's `Out-File -Encoding utf8` start UTF-8 files with EF BB BF.
  const std::string bom = "\xEF\xBB\xBF";
  const auto dir = std::filesystem::temp_directory_path() / "tinylm-test-config-bom";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const std::string eol : {"\n", "\r\n"}) {
    const auto path = (dir / (eol == "\n" ? "lf.toml" : "crlf.toml")).string();
    std::ofstream(path, std::ios::binary) << bom << "# saved by an editor" << eol << "seed = 7" << eol
                                          << "out-dir = \"runs/bom\"" << eol;
    RunConfig c;
    apply_toml_file(c, path);
    CHECK(c.trainer.seed() == 7);
    CHECK(c.trainer.out_dir() == "runs/bom");
  }
  // The first key right after the mark is a key like any other.
  RunConfig k;
  apply_toml(k, bom + "seed = 9\n", "k.toml");
  CHECK(k.trainer.seed() == 9);
  // Anywhere but the start it is refused, with its line; two marks are one too many.
  RunConfig c;
  CHECK_THAT(error_message([&] { apply_toml(c, "seed = 7\n" + bom + "lr = 0.1\n", "mid.toml"); }),
             Catch::Contains("mid.toml:2: a character outside ASCII stands outside a string or a comment"));
  CHECK_THAT(error_message([&] { apply_toml(c, bom + bom + "seed = 7\n", "twice.toml"); }),
             Catch::Contains("twice.toml:1: a character outside ASCII"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("to_toml writes the largest doubles, which read back exactly", "[config]") {
  // Found by the config fuzz target: the shortest form of 1.797e308 rounds past DBL_MAX
  // at low precision, and std::stod threw std::out_of_range out of to_toml.
  RunConfig c;
  apply_toml(c, "weight-decay = 1.7976931348623157e308\n", "big.toml");
  const std::string text = to_toml(c);
  RunConfig back;
  apply_toml(back, text, "back.toml");
  CHECK(back.trainer.optimizer().weight_decay() == c.trainer.optimizer().weight_decay());
}

TEST_CASE("a quote where TOML has no string opens none for the non-ASCII check", "[config][errors]") {
  // The fuzzer's second toml++ input: `model =2"` then U+0314. toml++ tests what follows
  // the 2 for whitespace; the quote there starts no string.
  RunConfig c;
  CHECK_THAT(error_message([&] { apply_toml(c, "model =2\"\xCC\x94" "ans\"\n", "q.toml"); }),
             Catch::Contains("q.toml:1: a character outside ASCII stands outside a string"));
  CHECK_THAT(error_message([&] { apply_toml(c, "out-dir = \"a\"\xC3\xA9\n", "r.toml"); }),
             Catch::Contains("r.toml:1: a character outside ASCII"));
  apply_toml(c, "\"out-dir\" = \"caf\xC3\xA9\"\n", "s.toml");  // a quoted key, then a value
  CHECK(c.trainer.out_dir() == "caf\xC3\xA9");
}
