// src/config_toml.cpp: the run config as TOML: written with the keys its kinds take, read
// back exactly, and every fault in a file named with its line.
#include "test_util.h"

#include <tinylm/config.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

using namespace tinylm;
using tinylm::test::error_message;

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
             Catch::Contains("x.toml:1: unknown key 'learning-rate'"));
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
  const auto dir = tinylm::test::scratch_dir("config_bom");
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
