// src/nn/model_kind.cpp: the registry of model kinds, tinylm's own and a program's, and
// the checks build_model() makes through it.
#include "../test_util.h"

#include <tinylm/nn/model_kind.h>
#include <tinylm/train/checkpoint.h>

#include <random>

using namespace tinylm;
using namespace tinylm::nn;
using tinylm::test::error_message;

namespace {

// A program's own model kind: a bigram table, with one option besides the vocabulary.
struct TableBigramOptions {
  explicit TableBigramOptions(int64_t vocab_size) : vocab_size_(vocab_size) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(double, init_scale) = 0.02;

 public:
  static const OptionSpec<TableBigramOptions>& spec() {
    static const auto s = [] {
      OptionSpec<TableBigramOptions> out("BigramLM");
      out.add(TINYLM_OPTION(TableBigramOptions, vocab_size), "vocabulary size", at_least(2)).required();
      out.add(TINYLM_OPTION(TableBigramOptions, init_scale), "std of the initial table", positive());
      return out;
    }();
    return s;
  }
};

class TableBigramImpl : public LanguageModelImpl {
 public:
  explicit TableBigramImpl(const TableBigramOptions& o) : options(o) {
    table = register_parameter("table", torch::randn({o.vocab_size(), o.vocab_size()}) * o.init_scale());
  }
  LMOutput forward(const torch::Tensor& ids, bool, const torch::Tensor&) override {
    return {table.index_select(0, ids.reshape(-1)).view({ids.size(0), ids.size(1), -1}), {}};
  }
  int64_t vocab_size() const override { return options.vocab_size(); }
  int64_t context_length() const override { return 1 << 20; }
  torch::Tensor forward_cached(const torch::Tensor& ids, KVCache& cache) override {
    cache.length += ids.size(1);
    return forward(ids, false, {}).logits;
  }
  ModelArchitecture architecture() const override { return {"test-bigram", 1, TableBigramOptions::spec().write(options)}; }
  TableBigramOptions options;
  torch::Tensor table;
};

void register_table_bigram_once() {
  static const bool done = [] {
    register_model_kind(model_kind<TableBigramImpl>("test-bigram", 1, "a bigram table", TableBigramOptions::spec(),
                                               TableBigramOptions(0), std::function<double(const TableBigramOptions&)>(
                                                   [](const TableBigramOptions& o) {
                                                     return static_cast<double>(o.vocab_size()) * o.vocab_size();
                                                   })));
    return true;
  }();
  (void)done;
}

}  // namespace

TEST_CASE("tinylm's kinds are registered, each option described once", "[nn][model_kind]") {
  const auto names = model_kind_names();
  REQUIRE(names.size() >= 2);
  CHECK(names[0] == "tiny");
  CHECK(names[1] == "transformer");
  const auto& t = find_model_kind("transformer");
  // What an architecture stores is exactly what the kind describes.
  const auto stored = architecture_of(TransformerLMOptions(10, 8, 16, 2, 1)).options;
  REQUIRE(stored.size() == t.options.size());
  for (const auto& o : t.options) CHECK(stored.count(o.name) == 1);
  CHECK_THAT(error_message([] { find_model_kind("mamba"); }),
             Catch::Contains("the kinds known are tiny, transformer"));
}

TEST_CASE("an architecture is the exact inverse of the options it came from", "[nn][model_kind]") {
  std::mt19937 rng(3);
  for (int i = 0; i < 20; ++i) {
    const int64_t heads = 1 + rng() % 4;
    TransformerLMOptions o(2 + rng() % 100, 1 + rng() % 64, heads * 2 * (1 + rng() % 8), heads, 1 + rng() % 3);  // even Dh
    // Set where each is used: one dropout for the embeddings and both residual branches,
    // one bias flag for the attention and the MLP (what an architecture stores).
    auto& block = o.block();
    const double dropout = (rng() % 100) / 101.0;
    const bool bias = rng() % 2;
    o.dropout(dropout);
    block.attention().out_dropout(dropout).attn_dropout((rng() % 100) / 103.0).bias(bias);
    block.mlp().dropout(dropout).bias(bias).expansion(1 + rng() % 4);
    block.mlp().activation(rng() % 2 ? Activation::gelu : Activation::gelu_tanh);
    block.pre_ln(rng() % 2);
    block.norm().bias(rng() % 2);
    o.tie_weights(rng() % 2)
        .positions(static_cast<PositionEncoding>(rng() % 3))
        .pos_base(1000.0 + rng() % 100000 / 7.0);
    block.attention().kernel(static_cast<AttentionKernel>(rng() % 4));
    block.norm().kind(rng() % 2 ? NormKind::rms_norm : NormKind::layer_norm).gain(rng() % 2);
    if (rng() % 2) block.mlp().activation(Activation::swiglu).hidden(rng() % 3 * (1 + rng() % 40));
    block.attention().n_kv_heads(rng() % 2 ? heads : 1);
    if (rng() % 4 == 0) o.positions(PositionEncoding::rotary);
    const auto a = architecture_of(o);
    auto model = build_model(a);
    CHECK(model->architecture().options == a.options);
    CHECK(parameter_count(a) == count_parameters(*model));
  }
}

TEST_CASE("a kind's rules refuse an architecture before anything is built", "[nn][model_kind][errors]") {
  auto a = architecture_of(TransformerLMOptions(10, 8, 16, 2, 1));
  a.options["d_model"] = "30";
  a.options["n_heads"] = "4";
  CHECK_THAT(error_message([&] { build_model(a); }),
             Catch::Contains("TransformerLM: d_model 30 must be divisible by n_heads 4"));
  a.options["n_heads"] = "2";
  a.options["positions"] = "sinusoidal";
  a.options["d_model"] = "15";
  a.options["n_heads"] = "1";
  CHECK_THAT(error_message([&] { build_model(a); }),
             Catch::Contains("d_model must be even for sinusoidal positions, got 15"));
  auto tiny = architecture_of(TinyAttentionLMOptions(10, 8, 16, 2));
  tiny.options.erase("d_model");
  CHECK_THAT(error_message([&] { build_model(tiny); }), Catch::Contains("option d_model is missing"));
}

TEST_CASE("a program's own kind is built, counted and checked by the same path", "[nn][model_kind]") {
  register_table_bigram_once();
  CHECK(find_model_kind("test-bigram").options.size() == 2);
  torch::manual_seed(0);
  auto original = std::make_shared<TableBigramImpl>(TableBigramOptions(7).init_scale(0.5));
  const auto a = original->architecture();
  auto rebuilt = build_model(a);
  CHECK(dynamic_cast<TableBigramImpl*>(rebuilt.get()) != nullptr);
  CHECK(rebuilt->architecture().options == a.options);
  CHECK(parameter_count(a) == 49);
  // Read once into the kind's own struct, which building and counting take.
  const ModelOptions read = read_model_options(a);
  CHECK(read.kind() == "test-bigram");
  CHECK(read.options<TableBigramOptions>().init_scale() == 0.5);
  CHECK(parameter_count(read) == 49);
  CHECK(architecture_of(read).options == a.options);
  CHECK(build_model(read)->architecture().options == a.options);
  CHECK_THAT(error_message([&] { read.options<TransformerLMOptions>(); }),
             Catch::Contains("the options of a 'test-bigram' model are not of the type asked for"));
  CHECK_THAT(error_message([&] { build_model(ModelOptions("test-bigram", TinyAttentionLMOptions(7, 8, 16, 2))); }),
             Catch::Contains("not of the type asked for"));
  auto bad = a;
  bad.options["vocab_size"] = "1";
  CHECK_THAT(error_message([&] { build_model(bad); }), Catch::Contains("BigramLM: vocab_size must be >= 2, got 1"));
  bad.version = 2;
  CHECK_THAT(error_message([&] { build_model(bad); }), Catch::Contains("upgrade tinylm"));
  CHECK_THAT(error_message([&] {
               register_model_kind(model_kind<TableBigramImpl>("tiny", 1, "", TableBigramOptions::spec(), TableBigramOptions(0)));
             }),
             Catch::Contains("a model kind named 'tiny' is already registered"));
}

TEST_CASE("a program's kind round-trips through a checkpoint, and a damaged one is refused", "[nn][model_kind]") {
  register_table_bigram_once();
  const auto dir = tinylm::test::scratch_dir("model_kind");
  torch::manual_seed(1);
  auto model = std::make_shared<TableBigramImpl>(TableBigramOptions(5));
  train::save_checkpoint((dir / "good.ckpt").string(), *model, nullptr, train::TrainingState{});
  const auto ck = train::read_checkpoint((dir / "good.ckpt").string());
  auto rebuilt = build_model(ck.architecture);
  train::load_model_state(ck, *rebuilt);
  CHECK(torch::equal(rebuilt->named_parameters()["table"], model->table));
  // An architecture that does not describe the weights stored with it (the reader counts
  // a registered kind's parameters from its options).
  struct Lying : TableBigramImpl {
    using TableBigramImpl::TableBigramImpl;
    ModelArchitecture architecture() const override {
      auto a = TableBigramImpl::architecture();
      a.options["vocab_size"] = "6";
      return a;
    }
  };
  auto lying = std::make_shared<Lying>(TableBigramOptions(5));
  train::save_checkpoint((dir / "damaged.ckpt").string(), *lying, nullptr, train::TrainingState{});
  CHECK_THAT(error_message([&] { train::read_checkpoint((dir / "damaged.ckpt").string()); }),
             Catch::Contains("the test-bigram model it describes (vocab_size 6) has 36 parameters, but it stores 25"));
}

TEST_CASE("a kind's memory formula sizes a batch; a kind without one counts the logits", "[nn][model_kind]") {
  register_table_bigram_once();
  const auto bigram = std::make_shared<TableBigramImpl>(TableBigramOptions(7))->architecture();
  CHECK(batch_memory(bigram, 2, 3, /*training=*/true).activation_bytes == 4 * 2 * 2 * 3 * 7);
  CHECK(batch_memory(bigram, 2, 3, /*training=*/false).activation_bytes == 4 * 2 * 3 * 7);
  // The transformer keeps each layer's activations for the backward pass: one more layer
  // adds the same amount; inference holds one layer at a time.
  auto layers = [](int64_t n, bool training) {
    return batch_memory(architecture_of(TransformerLMOptions(100, 64, 32, 4, n)), 8, 64, training).activation_bytes;
  };
  CHECK(layers(3, true) - layers(2, true) == Approx(layers(2, true) - layers(1, true)));
  CHECK(layers(3, true) > layers(2, true));
  CHECK(layers(3, false) == layers(1, false));
  // Sinusoidal rows are a buffer; learned positions are weights.
  const auto learned = architecture_of(TransformerLMOptions(100, 64, 32, 4, 1));
  const auto sinusoidal = architecture_of(TransformerLMOptions(100, 64, 32, 4, 1).positions(PositionEncoding::sinusoidal));
  CHECK(batch_memory(sinusoidal, 1, 16, true).buffer_bytes > batch_memory(learned, 1, 16, true).buffer_bytes);
}
