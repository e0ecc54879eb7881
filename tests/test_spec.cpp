// src/spec.cpp and tinylm/spec.h: options declared once, stored as text and read back
// exactly, checked rule by rule, described for a front end.
#include "test_util.h"

#include <tinylm/spec.h>

#include <torch/arg.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

using namespace tinylm;
using tinylm::test::error_message;

namespace {

enum class Shape { round, square };

struct ToyOptions {
  explicit ToyOptions(int64_t items) : items_(items) {}
  TORCH_ARG(int64_t, items);
  TORCH_ARG(double, rate) = 0.5;
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(std::string, label) = "toy";
  TORCH_ARG(Shape, shape) = Shape::round;
  TORCH_ARG(int64_t, group) = 1;
};

const OptionSpec<ToyOptions>& toy_spec() {
  static const auto spec = [] {
    OptionSpec<ToyOptions> s("Toy");
    s.add(TINYLM_OPTION(ToyOptions, items), "how many", at_least(1)).required();
    s.add(TINYLM_OPTION(ToyOptions, rate), "a fraction", fraction());
    s.add(TINYLM_OPTION(ToyOptions, shuffle), "shuffle them");
    s.add(TINYLM_OPTION(ToyOptions, label), "a name");
    s.choice(TINYLM_OPTION(ToyOptions, shape), {{"round", Shape::round}, {"square", Shape::square}}, "the shape");
    s.add(TINYLM_OPTION(ToyOptions, group), "items per group", at_least(1));
    s.rule([](const ToyOptions& o, Spelling sp) {
      return o.items() % o.group() == 0 ? std::string()
                                        : spell("group", sp) + " must divide " + spell("items", sp);
    });
    return s;
  }();
  return spec;
}

}  // namespace

TEST_CASE("option_text is the shortest text that reads back exactly", "[spec]") {
  CHECK(option_text(0.1) == "0.1");
  CHECK(option_text(10000.0) == "10000");
  CHECK(option_text(int64_t{-7}) == "-7");
  CHECK(option_text(true) == "true");
  CHECK(option_text(std::string("a b")) == "a b");
  OptionInfo real{"x", OptionType::real, "", {}, {}};
  for (double v : {0.1, 1.0 / 3.0, 1e-300, 5e-324, std::numeric_limits<double>::max(), -2.5e17}) {
    INFO(v);
    CHECK(std::get<double>(parse_option_text(real, option_text(v), "test")) == v);
  }
}

TEST_CASE("a spec writes every field and reads the text back to the same options", "[spec]") {
  ToyOptions o(12);
  o.rate(1.0 / 3.0).shuffle(false).label("with = and \"quotes\"").shape(Shape::square).group(4);
  const auto text = toy_spec().write(o);
  CHECK(text.size() == 6);
  CHECK(text.at("shape") == "square");
  const ToyOptions back = toy_spec().read(text, ToyOptions(0), "test");
  CHECK(toy_spec().write(back) == text);
  CHECK(back.rate() == o.rate());
  CHECK(back.label() == o.label());
  CHECK(back.shape() == Shape::square);
  // Fields absent keep the starting values; a required one absent is refused.
  const ToyOptions partial = toy_spec().read({{"items", "3"}}, ToyOptions(0), "test");
  CHECK(partial.items() == 3);
  CHECK(partial.rate() == 0.5);
  CHECK_THAT(error_message([&] { toy_spec().read({{"rate", "0.1"}}, ToyOptions(0), "f.ckpt"); }),
             Catch::Contains("f.ckpt: Toy option items is missing: it has no default"));
}

TEST_CASE("a spec refuses text that is not its field's type, and unknown keys unless asked", "[spec][errors]") {
  auto read = [](std::map<std::string, std::string> m) {
    m.emplace("items", "4");
    toy_spec().read(m, ToyOptions(1), "f.ckpt");
  };
  CHECK_THAT(error_message([&] { read({{"items", "12x"}}); }),
             Catch::Contains("f.ckpt: option items = '12x' is not an integer"));
  CHECK_THAT(error_message([&] { read({{"rate", ""}}); }), Catch::Contains("option rate = '' is not a number"));
  CHECK_THAT(error_message([&] { read({{"shuffle", "yes"}}); }), Catch::Contains("is not true or false"));
  CHECK_THAT(error_message([&] { read({{"shape", "oval"}}); }),
             Catch::Contains("option shape = 'oval' is not one of round, square"));
  CHECK_THAT(error_message([&] { read({{"colour", "red"}}); }), Catch::Contains("Toy has no option 'colour'"));
  std::vector<std::string> unknown;
  toy_spec().read({{"colour", "red"}, {"items", "2"}}, ToyOptions(1), "f", &unknown);
  CHECK(unknown == std::vector<std::string>{"colour"});
}

TEST_CASE("check states each rule once, in the spelling asked for", "[spec][errors]") {
  ToyOptions o(0);
  CHECK_THAT(error_message([&] { toy_spec().check(o); }), Catch::Contains("Toy: items must be >= 1, got 0"));
  o.items(6).rate(1.0);
  CHECK_THAT(error_message([&] { toy_spec().check(o); }), Catch::Contains("Toy: rate must be in [0, 1), got 1"));
  o.rate(0.25).group(4);
  CHECK_THAT(error_message([&] { toy_spec().check(o); }), Catch::Contains("Toy: group must divide items"));
  CHECK(error_message([&] { toy_spec().check(o, Spelling::config); }) == "group must divide items");
  o.group(3);
  CHECK_NOTHROW(toy_spec().check(o));
  CHECK(spell("attn_dropout", Spelling::config) == "attn-dropout");
}

TEST_CASE("describe gives each field's type, default, choices and help", "[spec]") {
  const auto info = toy_spec().describe(ToyOptions(9));
  REQUIRE(info.size() == 6);
  CHECK(info[0].name == "items");
  CHECK_FALSE(info[0].default_value.has_value());  // required
  CHECK(info[1].type == OptionType::real);
  CHECK(std::get<double>(*info[1].default_value) == 0.5);
  CHECK(info[4].choices == std::vector<std::string>{"round", "square"});
  CHECK(std::get<std::string>(*info[4].default_value) == "round");
  CHECK(info[5].help == "items per group");
}
