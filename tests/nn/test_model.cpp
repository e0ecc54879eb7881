// src/nn/model.cpp: the two language models: shapes, checks, ties, init, clones, learning.
#include "../test_util.h"

#include <tinylm/data/tasks.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/model.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/any.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

using namespace tinylm;
using namespace tinylm::nn;
using tinylm::test::error_message;
using tinylm::test::max_abs_diff;

TEST_CASE("TinyAttentionLM: logits (B, T, V) and weights (B, H, T, T)", "[nn][model]") {
  TinyAttentionLM model(TinyAttentionLMOptions(64, 12, 32, 4));
  auto out = model->forward(torch::randint(64, {2, 12}, torch::kLong), true);
  CHECK(out.logits.sizes() == torch::IntArrayRef({2, 12, 64}));
  REQUIRE(out.attention.size() == 1);
  CHECK(out.attention[0].sizes() == torch::IntArrayRef({2, 4, 12, 12}));
  // The reference shape: embedding + sinusoidal positions + attention + head only.
  auto names = model->named_parameters().keys();
  CHECK(names == std::vector<std::string>{"token_embedding.weight", "attention.qkv_proj.weight",
                                          "attention.qkv_proj.bias", "attention.out_proj.weight",
                                          "attention.out_proj.bias", "lm_head.weight",
                                          "lm_head.bias"});
}

TEST_CASE("language models validate token ids", "[nn][model][errors]") {
  TinyAttentionLM tiny(TinyAttentionLMOptions(16, 6, 8, 2));
  TransformerLM deep(TransformerLMOptions(16, 6, 8, 2, 1));
  CHECK_THAT(error_message([&] { tiny->forward(torch::zeros({1, 7}, torch::kLong)); }),
             Catch::Contains("TinyAttentionLM: sequence length 7 exceeds context_length 6"));
  CHECK_THAT(error_message([&] { deep->forward(torch::zeros({1, 7}, torch::kLong)); }),
             Catch::Contains("TransformerLM: sequence length 7 exceeds context_length 6"));
  CHECK_THAT(error_message([&] { deep->forward(torch::full({1, 3}, 16, torch::kLong)); }),
             Catch::Contains("token ids must be in [0, 16), got ids in [16, 16]"));
  CHECK_THAT(error_message([&] { deep->forward(torch::full({1, 3}, -1, torch::kLong)); }),
             Catch::Contains("got ids in [-1, -1]"));
  CHECK_THAT(error_message([&] { deep->forward(torch::zeros({1, 3})); }),
             Catch::Contains("token ids must be int64"));
  CHECK_THAT(error_message([&] { deep->forward(torch::zeros({3}, torch::kLong)); }),
             Catch::Contains("expected token ids of rank 2 (B, T), got rank 1"));
}

TEST_CASE("TransformerLM validates its configuration", "[nn][model][errors]") {
  CHECK_THAT(error_message([] { TransformerLM(TransformerLMOptions(16, 8, 10, 4, 2)); }),
             Catch::Contains("d_model 10 must be divisible by n_heads 4"));
  CHECK_THAT(error_message([] { TransformerLM(TransformerLMOptions(16, 8, 8, 2, 0)); }),
             Catch::Contains("n_layers must be >= 1, got 0"));
  CHECK_THAT(error_message([] { TransformerLM(TransformerLMOptions(1, 8, 8, 2, 1)); }),
             Catch::Contains("vocab_size must be >= 2 (one token leaves nothing to learn), got 1"));
  CHECK_THAT(error_message([] { TinyAttentionLM(TinyAttentionLMOptions(1, 8, 8, 2)); }),
             Catch::Contains("vocab_size must be >= 2"));
  CHECK_THAT(error_message([] { TransformerLM(TransformerLMOptions(16, 8, 8, 2, 1).dropout(1)); }),
             Catch::Contains("dropout must be in [0, 1), got 1"));
  CHECK_THAT(error_message([] { TransformerLM(test::with(TransformerLMOptions(16, 8, 8, 2, 1), {{"attn_dropout", "1"}})); }),
             Catch::Contains("attn_dropout must be in [0, 1), got 1"));
  CHECK_THAT(error_message([] { position_encoding_from_string("alibi"); }),
             Catch::Contains("unknown position encoding 'alibi'"));
}

TEST_CASE("a transformer's options reach the part that uses them, the shape set once", "[nn][model][options]") {
  // The stored names set the parts' options (bias: attention and MLP; dropout: the
  // embeddings and both residual branches), and each module is built from its own.
  auto o = test::with(TransformerLMOptions(16, 8, 8, 2, 2),
                      {{"bias", "false"}, {"dropout", "0.125"}, {"attn_dropout", "0.25"}, {"layer_norm_bias", "false"},
                       {"mlp_expansion", "3"}, {"activation", "gelu"}, {"pre_ln", "false"}, {"attention_kernel", "plain"}});
  const auto& block = o.block();
  CHECK_FALSE(block.attention().bias());
  CHECK_FALSE(block.mlp().bias());
  CHECK(block.attention().out_dropout() == 0.125);
  CHECK(block.mlp().dropout() == 0.125);
  CHECK(o.dropout() == 0.125);
  o.d_model(12).n_heads(3).context_length(5);  // the shape, once: every part has it
  CHECK(block.attention().d_model() == 12);
  CHECK(block.attention().n_heads() == 3);
  CHECK(block.attention().context_length() == 5);
  CHECK(block.mlp().d_model() == 12);
  CHECK(block.norm().d_model() == 12);
  TransformerLM model(o);
  for (const auto& module : *model->blocks) {
    const auto& b = *module->as<TransformerBlock>();
    CHECK(b.attn->options.d_model() == 12);
    CHECK(b.attn->options.attn_dropout() == 0.25);
    CHECK(b.attn->options.out_dropout() == 0.125);
    CHECK(b.attn->options.kernel() == AttentionKernel::plain);
    CHECK_FALSE(b.attn->qkv_proj->bias.defined());
    CHECK(b.mlp->fc->weight.size(0) == 36);
    CHECK(b.mlp->options.activation() == Activation::gelu);
    CHECK_FALSE(b.mlp->fc->bias.defined());
    CHECK_FALSE(b.ln1->bias.defined());
    CHECK_FALSE(b.options.pre_ln());
  }
  CHECK(model->ln_f->weight.size(0) == 12);
  CHECK_FALSE(model->ln_f->bias.defined());
  CHECK(model->architecture().options == architecture_of(o).options);

  // What an architecture cannot store is refused, not half-stored.
  auto apart = TransformerLMOptions(16, 8, 8, 2, 1);
  apart.block().mlp().bias(false);
  CHECK_THAT(error_message([&] { TransformerLM{apart}; }),
             Catch::Contains("the attention's bias (1) and the MLP's (0) differ: an architecture stores one bias"));
  auto embedding_only = TransformerLMOptions(16, 8, 8, 2, 1).dropout(0.5);
  CHECK_THAT(error_message([&] { TransformerLM{embedding_only}; }),
             Catch::Contains("an architecture stores one dropout; set them equal"));
}

TEST_CASE("rotary positions, RMSNorm, SwiGLU and grouped-query attention build what they say, and refuse "
          "what cannot be",
          "[nn][model][options]") {
  TransformerLM llama(test::with(TransformerLMOptions(16, 8, 16, 4, 1).positions(PositionEncoding::rotary).pos_base(500),
                                 {{"norm", "rms-norm"}, {"activation", "swiglu"}, {"mlp_hidden", "24"},
                                  {"n_kv_heads", "2"}, {"layer_norm_bias", "false"}, {"bias", "false"}}));
  CHECK_FALSE(llama->learned_positions);
  CHECK_FALSE(llama->sinusoidal_positions);
  const auto& b = *llama->blocks[0]->as<TransformerBlock>();
  CHECK(b.attn->options.rotary_base() == 500);
  CHECK(b.attn->qkv_proj->weight.sizes() == torch::IntArrayRef({16 + 2 * 2 * 4, 16}));  // q, then 2 kv heads of 4
  CHECK(b.mlp->fc->weight.sizes() == torch::IntArrayRef({2 * 24, 16}));                 // gate and up
  CHECK(b.mlp->proj->weight.sizes() == torch::IntArrayRef({16, 24}));
  CHECK(b.ln1->options.kind() == NormKind::rms_norm);
  CHECK_FALSE(b.ln1->bias.defined());
  CHECK(llama->options.block().attention().rotary_base() == 0);  // the model's to set, from positions
  // An RMSNorm without gain leaves each row with a mean square of 1 (to its eps).
  LayerNorm plain_rms(LayerNormOptions(32).kind(NormKind::rms_norm).gain(false).bias(false));
  CHECK(plain_rms->parameters().empty());
  auto y = plain_rms(3 * torch::randn({4, 32}) + 2);
  CHECK(max_abs_diff(y.pow(2).mean(-1), torch::ones({4})) < 1e-4);
  // Each works in a forward and backward pass.
  auto out = llama->forward(torch::randint(16, {2, 8}, torch::kLong), /*return_weights=*/true);
  CHECK(out.attention[0].sizes() == torch::IntArrayRef({2, 4, 8, 8}));  // the query heads'
  out.logits.sum().backward();
  for (const auto& p : llama->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().grad().defined());
  }

  CHECK_THAT(error_message([] { TransformerLM(test::with(TransformerLMOptions(16, 8, 16, 4, 1), {{"n_kv_heads", "3"}})); }),
             Catch::Contains("n_kv_heads 3 must divide n_heads 4"));
  CHECK_THAT(error_message([] { TransformerLM(TransformerLMOptions(16, 8, 6, 2, 1).positions(PositionEncoding::rotary)); }),
             Catch::Contains("the head width d_model / n_heads = 3 must be even"));
  auto set_below = TransformerLMOptions(16, 8, 16, 4, 1);
  set_below.block().attention().rotary_base(10000);
  CHECK_THAT(error_message([&] { TransformerLM{set_below}; }), Catch::Contains("leave it 0 in the block's options"));
  CHECK_THAT(error_message([] { TransformerLM(test::with(TransformerLMOptions(16, 8, 16, 4, 1), {{"mlp_hidden", "-1"}})); }),
             Catch::Contains("mlp_hidden must be >= 0 (0: mlp_expansion x d_model), got -1"));
}

TEST_CASE("TransformerLM: logits shape for every position encoding", "[nn][model]") {
  auto positions = GENERATE(PositionEncoding::learned, PositionEncoding::sinusoidal,
                            PositionEncoding::none);
  TransformerLM model(TransformerLMOptions(50, 16, 32, 4, 2).positions(positions));
  auto out = model->forward(torch::randint(50, {3, 10}, torch::kLong), true);
  CHECK(out.logits.sizes() == torch::IntArrayRef({3, 10, 50}));
  REQUIRE(out.attention.size() == 2);
  CHECK(out.attention[1].sizes() == torch::IntArrayRef({3, 4, 10, 10}));
}

TEST_CASE("tied head shares the embedding storage, untied does not", "[nn][model][tie]") {
  TransformerLM tied(TransformerLMOptions(100, 16, 32, 4, 2).tie_weights(true));
  TransformerLM untied(TransformerLMOptions(100, 16, 32, 4, 2).tie_weights(false));
  CHECK(tied->lm_head_weight().data_ptr() == tied->token_embedding->weight.data_ptr());
  CHECK(untied->lm_head_weight().data_ptr() != untied->token_embedding->weight.data_ptr());
  CHECK(count_parameters(*untied) - count_parameters(*tied) == 100 * 32);
}

TEST_CASE("a tie is one parameter, updated once, and survives save and load", "[nn][model][tie]") {
  torch::manual_seed(0);
  auto options = TransformerLMOptions(40, 8, 16, 2, 1).tie_weights(true);
  TransformerLM model(options);
  // One parameter: the embedding; no separate head weight exists to drift apart.
  int64_t with_vocab_rows = 0;
  for (const auto& p : model->parameters()) with_vocab_rows += p.size(0) == 40;
  CHECK(with_vocab_rows == 1);

  // One SGD step: the shared weight moves by exactly lr * (its one accumulated gradient).
  auto ids = torch::randint(40, {2, 8}, torch::kLong);
  auto before = model->token_embedding->weight.detach().clone();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  sgd.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(ids).logits.view({-1, 40}), ids.view({-1}))
      .backward();
  auto grad = model->token_embedding->weight.grad().clone();
  sgd.step();
  CHECK(max_abs_diff(model->token_embedding->weight, before - 0.1 * grad) < 1e-6);
  CHECK(max_abs_diff(model->lm_head_weight(), model->token_embedding->weight) == 0.0);

  const auto path = tinylm::test::scratch_dir("tie") / "tied.pt";
  torch::save(model, path.string());
  TransformerLM loaded(options);
  torch::load(loaded, path.string());
  std::filesystem::remove(path);
  CHECK(loaded->lm_head_weight().data_ptr() == loaded->token_embedding->weight.data_ptr());
  CHECK(torch::equal(loaded->lm_head_weight(), model->token_embedding->weight));
  CHECK(max_abs_diff(loaded->forward(ids).logits, model->forward(ids).logits) < 1e-6);
}

TEST_CASE("GPT-2 small counts 124,439,808 parameters with the tie", "[nn][model][slow]") {
  const auto gpt2_small = TransformerLMOptions(50257, 1024, 768, 12, 12);  // biases, tied head: the defaults
  TransformerLM gpt2(gpt2_small);
  const int64_t n = count_parameters(*gpt2);
  CHECK(n == 124439808);
  CHECK(std::abs(n - 124e6) / 124e6 < 0.05);
  auto options = TransformerLMOptions(gpt2_small).tie_weights(false);
  CHECK(count_parameters(*TransformerLM(options)) - n == 50257 * 768);
}

TEST_CASE("GPT-2 init: N(0, 0.02), zero biases, residual projections scaled", "[nn][model][init]") {
  torch::manual_seed(0);
  TransformerLM model(TransformerLMOptions(256, 64, 256, 4, 8));
  auto* block = model->blocks[3]->as<TransformerBlock>();
  CHECK(block->attn->qkv_proj->weight.std().item<double>() == Approx(0.02).epsilon(0.03));
  CHECK(block->attn->qkv_proj->bias.abs().max().item<double>() == 0.0);
  const double residual = 0.02 / std::sqrt(16.0);
  CHECK(block->attn->out_proj->weight.std().item<double>() == Approx(residual).epsilon(0.03));
  CHECK(block->mlp->proj->weight.std().item<double>() == Approx(residual).epsilon(0.03));
  CHECK(block->ln1->weight.min().item<double>() == 1.0);
}

TEST_CASE(".to(dtype) moves parameters and buffers of a whole model", "[nn][model][device]") {
  TransformerLM model(TransformerLMOptions(20, 8, 8, 2, 1).positions(PositionEncoding::sinusoidal));
  model->to(torch::kFloat64);
  for (const auto& b : model->named_buffers()) {
    if (b.key().find("anchor") != std::string::npos) CHECK(b.value().scalar_type() == torch::kFloat64);
  }
  auto logits = model->forward(torch::randint(20, {1, 8}, torch::kLong)).logits;
  CHECK(logits.scalar_type() == torch::kFloat64);
}

TEST_CASE("an architecture rebuilds its model, unknown options are skipped and newer versions refused",
          "[nn][model][architecture]") {
  TransformerLM deep(test::with(TransformerLMOptions(30, 9, 16, 2, 3).positions(PositionEncoding::sinusoidal)
                                    .tie_weights(false),
                                {{"dropout", "0.25"}, {"mlp_expansion", "2"}}));
  auto arch = deep->architecture();
  CHECK(arch.kind == "transformer");
  auto rebuilt = build_model(arch);
  auto* same = dynamic_cast<TransformerLMImpl*>(rebuilt.get());
  REQUIRE(same);
  CHECK(same->options.dropout() == 0.25);
  CHECK(same->options.positions() == PositionEncoding::sinusoidal);
  auto a = deep->named_parameters(), b = rebuilt->named_parameters();
  REQUIRE(a.size() == b.size());
  for (const auto& p : a) CHECK(b[p.key()].sizes() == p.value().sizes());

  auto tiny = TinyAttentionLM(TinyAttentionLMOptions(20, 7, 8, 2))->architecture();
  tiny.options["rotary_base"] = "500000";  // from a later tinylm: skipped with a warning
  auto built = build_model(tiny);
  CHECK(built->context_length() == 7);

  auto newer = tiny;
  newer.version = 2;
  CHECK_THAT(error_message([&] { build_model(newer); }), Catch::Contains("upgrade tinylm"));
  auto mine = tiny;
  mine.kind = "mamba";
  CHECK_THAT(error_message([&] { build_model(mine); }), Catch::Contains("cannot build a model of kind 'mamba'"));
  // Weights are what a model allocates up front: a context of 10^12 costs nothing
  // without learned positions (masks and sinusoidal rows are made for the lengths run),
  // and is refused with them, before anything is allocated.
  auto long_context = tiny;
  long_context.options["context_length"] = "1000000000000";
  auto lean = build_model(long_context);
  for (const auto& b : lean->buffers()) CHECK(b.numel() == 0);
  CHECK(lean->forward(torch::randint(20, {2, 9}, torch::kLong)).logits.sizes() == torch::IntArrayRef({2, 9, 20}));
  auto learned = TransformerLM(TransformerLMOptions(20, 7, 8, 2, 1))->architecture();
  learned.options["context_length"] = "1000000000000";
  CHECK_THAT(error_message([&] { build_model(learned); }), Catch::Contains("lower vocab_size, context_length"));
  auto huge = tiny;
  huge.options["vocab_size"] = "100000000000";
  CHECK_THAT(error_message([&] { build_model(huge); }), Catch::Contains("lower vocab_size, context_length"));
  auto garbled = tiny;
  garbled.options["d_model"] = "8x";
  CHECK_THAT(error_message([&] { build_model(garbled); }), Catch::Contains("d_model = '8x'"));
}

TEST_CASE("both models clone deeply and draw fresh weights on reset_parameters()", "[nn][model][library]") {
  torch::manual_seed(3);
  std::vector<nn::LanguageModel> models = {
      std::make_shared<nn::TinyAttentionLMImpl>(nn::TinyAttentionLMOptions(20, 8, 16, 2)),
      std::make_shared<nn::TransformerLMImpl>(nn::TransformerLMOptions(20, 8, 16, 2, 2))};
  auto ids = torch::randint(20, {2, 8}, torch::kLong);
  for (auto& model : models) {
    model->eval();
    auto copy = std::dynamic_pointer_cast<nn::LanguageModelImpl>(model->clone());
    REQUIRE(copy);
    CHECK(torch::equal(copy->forward(ids).logits, model->forward(ids).logits));
    auto original = model->named_parameters();
    for (auto& p : copy->named_parameters()) {
      INFO(p.key());
      CHECK(p.value().data_ptr() != original[p.key()].data_ptr());
    }
    {
      torch::NoGradGuard g;
      copy->parameters().front().add_(1.0);
    }
    CHECK_FALSE(torch::equal(copy->forward(ids).logits, model->forward(ids).logits));
  }
  nn::TinyAttentionLM tiny(nn::TinyAttentionLMOptions(20, 8, 16, 2));
  const auto before = tiny->lm_head->weight.clone();
  tiny->reset_parameters();
  CHECK(tiny->named_parameters().size() == 7);
  CHECK_FALSE(torch::equal(tiny->lm_head->weight, before));
}

TEST_CASE("models plug into AnyModule with their default forward arguments", "[nn][model][library]") {
  torch::nn::AnyModule tiny(nn::TinyAttentionLM(nn::TinyAttentionLMOptions(20, 8, 16, 2)));
  torch::nn::AnyModule deep(nn::TransformerLM(nn::TransformerLMOptions(20, 8, 16, 2, 1)));
  auto ids = torch::randint(20, {2, 8}, torch::kLong);
  CHECK(tiny.forward<nn::LMOutput>(ids).logits.sizes() == torch::IntArrayRef({2, 8, 20}));
  CHECK(deep.forward<nn::LMOutput>(ids).attention.empty());
  CHECK(deep.forward<nn::LMOutput>(ids, true).attention.size() == 1);
}

// The reference training check: TinyAttentionLM (V 32, D 16, 4 heads, T 10, B 16,
// Adam 5e-3) gets below half its first loss within 150 steps, seeded.
TEST_CASE("TinyAttentionLM learns the repeat task", "[train][repeat][slow]") {
  torch::manual_seed(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  nn::TinyAttentionLM model(nn::TinyAttentionLMOptions(32, 10, 16, 4));
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(5e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    auto b = data::repeat_batch(16, 10, 32, gen);
    auto logits = model->forward(b.inputs).logits;  // (B, T, V)
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 32}),
                                                     b.targets.reshape({-1}));
    adam.zero_grad();
    loss.backward();
    adam.step();
    last = loss.item<double>();
    if (step == 0) first = last;
  }
  INFO("first loss " << first << ", loss after 150 steps " << last);
  CHECK(first == Approx(std::log(32.0)).margin(0.5));
  CHECK(last < 0.5 * first);
}

TEST_CASE("parameter_count matches the built model for every option that changes it", "[nn][model]") {
  // A checkpoint's architecture is checked against its weights with this count before
  // any model is built: it must be exact.
  auto tiny = TinyAttentionLMOptions(13, 7, 16, 2);
  CHECK(parameter_count(architecture_of(tiny)) == count_parameters(*build_model(architecture_of(tiny))));
  for (bool bias : {true, false})
    for (bool norm_bias : {true, false})
      for (bool tie : {true, false})
        for (auto positions : {PositionEncoding::learned, PositionEncoding::sinusoidal, PositionEncoding::none})
          for (int64_t expansion : {1, 3}) {
            auto o = test::with(TransformerLMOptions(11, 9, 8, 2, 2).tie_weights(tie).positions(positions),
                                {{"bias", bias ? "true" : "false"},
                                 {"layer_norm_bias", norm_bias ? "true" : "false"},
                                 {"mlp_expansion", std::to_string(expansion)}});
            const auto a = architecture_of(o);
            INFO("bias " << bias << " layer_norm_bias " << norm_bias << " tie " << tie << " positions "
                         << to_string(positions) << " expansion " << expansion);
            CHECK(parameter_count(a) == count_parameters(*build_model(a)));
          }
  // The architectures of today's small models, alone and together.
  const std::vector<std::map<std::string, std::string>> modern = {
      {{"norm", "rms-norm"}},
      {{"norm", "rms-norm"}, {"norm_gain", "false"}, {"layer_norm_bias", "false"}},
      {{"norm_gain", "false"}},
      {{"activation", "swiglu"}},
      {{"activation", "swiglu"}, {"mlp_hidden", "21"}, {"bias", "false"}},
      {{"mlp_hidden", "5"}},
      {{"n_kv_heads", "1"}},
      {{"n_kv_heads", "2"}, {"bias", "false"}},
      {{"positions", "rotary"}},
      {{"positions", "rotary"}, {"norm", "rms-norm"}, {"activation", "swiglu"}, {"n_kv_heads", "1"},
       {"layer_norm_bias", "false"}, {"bias", "false"}, {"mlp_hidden", "24"}}};
  for (const auto& set : modern) {
    const auto a = architecture_of(test::with(TransformerLMOptions(11, 9, 8, 2, 2), set));
    std::string options;
    for (const auto& [key, value] : set) options += key + "=" + value + " ";
    INFO(options);
    CHECK(parameter_count(a) == count_parameters(*build_model(a)));
  }
  // Without LayerNorm biases: gains only, in every block and at the top, and an
  // architecture that rebuilds the same (older checkpoints, which lack the option, have them).
  TransformerLM gains(test::with(TransformerLMOptions(11, 9, 8, 2, 2), {{"bias", "false"}, {"layer_norm_bias", "false"}}));
  for (const auto& p : gains->named_parameters()) {
    INFO(p.key());
    CHECK(p.key().find(".bias") == std::string::npos);
  }
  CHECK(gains->named_parameters().contains("blocks.1.ln2.weight"));
  CHECK(gains->named_parameters().contains("ln_f.weight"));
  auto arch = gains->architecture();
  CHECK(arch.options.at("layer_norm_bias") == "false");
  CHECK_FALSE(build_model(arch)->named_parameters().contains("ln_f.bias"));
  arch.options.erase("layer_norm_bias");
  CHECK(build_model(arch)->named_parameters().contains("ln_f.bias"));
  CHECK_THAT(error_message([] { parameter_count({"mlp", 1, {}}); }), Catch::Contains("cannot build a model of kind 'mlp'"));
  auto huge = architecture_of(TransformerLMOptions(8, 8, 8, 2, 1));
  huge.options["n_layers"] = "100000000000000000";
  CHECK_THAT(error_message([&] { parameter_count(huge); }), Catch::Contains("more than any model can"));
}

TEST_CASE("forward_rows decodes rows of different lengths as each decodes alone", "[nn][model][rows]") {
  torch::manual_seed(5);
  TransformerLMOptions rotary(30, 10, 16, 4, 2);
  rotary.positions(PositionEncoding::rotary);
  rotary.block().attention().n_kv_heads(2);
  // Rows of several lengths go through tinylm's loops on the CPU (the automatic kernel)
  // and through LibTorch's operations (the plain one): both as alone.
  auto rotary_plain = rotary;
  rotary_plain.block().attention().kernel(AttentionKernel::plain);
  std::vector<LanguageModel> models = {LanguageModel(TinyAttentionLM(TinyAttentionLMOptions(30, 10, 16, 2)).ptr()),
                                       LanguageModel(TransformerLM(TransformerLMOptions(30, 10, 16, 2, 2)).ptr()),
                                       LanguageModel(TransformerLM(rotary).ptr()),
                                       LanguageModel(TransformerLM(rotary_plain).ptr())};
  for (size_t m = 0; m < models.size(); ++m) {
    auto& model = models[m];
    INFO("model " << m << ": " << model->architecture().kind);
    model->eval();
    torch::NoGradGuard no_grad;
    const std::vector<int64_t> lengths = {3, 1, 6, 9};  // 9: the last position a row can take
    const auto B = static_cast<int64_t>(lengths.size());
    // Each row alone: its prompt through forward_cached, then one more token.
    KVCache rows;
    rows.lengths = lengths;
    std::vector<torch::Tensor> expected;
    const auto next = torch::randint(30, {B, 1}, torch::kLong);
    for (int64_t b = 0; b < B; ++b) {
      KVCache own;
      model->forward_cached(torch::randint(30, {1, lengths[b]}, torch::kLong), own);
      if (rows.keys.empty())
        for (const auto& k : own.keys) {
          auto shape = k.sizes().vec();
          shape[0] = B, shape[2] = 12;  // room past the longest row
          rows.keys.push_back(torch::full(shape, 7.0));  // what lies past a row must not matter
          rows.values.push_back(torch::full(shape, -7.0));
        }
      for (size_t l = 0; l < own.keys.size(); ++l) {
        rows.keys[l][b].narrow(1, 0, lengths[b]).copy_(own.keys[l][0]);
        rows.values[l][b].narrow(1, 0, lengths[b]).copy_(own.values[l][0]);
      }
      expected.push_back(model->forward_cached(next.narrow(0, b, 1), own));
    }
    const auto before = kernel_counts();
    const auto logits = model->forward_rows(next, rows);
    REQUIRE(logits.sizes() == torch::IntArrayRef({B, 1, 30}));
    if (m == 1 || m == 2) CHECK((kernel_counts() - before).attention_loops == 2);  // a pass per layer
    if (m == 3) CHECK((kernel_counts() - before).attention_loops == 0);
    for (int64_t b = 0; b < B; ++b) {
      INFO("row " << b);
      CHECK(max_abs_diff(logits.narrow(0, b, 1), expected[b]) < 1e-5);
    }
    CHECK(rows.lengths == std::vector<int64_t>({4, 2, 7, 10}));
    // A row at the context has no room for another token.
    CHECK_THAT(error_message([&] { model->forward_rows(next, rows); }),
               Catch::Contains("a row of 10 tokens has no room for another within context_length 10"));
    CHECK_THAT(error_message([&] { model->forward_rows(next.narrow(0, 0, 2), rows); }),
               Catch::Contains("forward_rows takes one new token for each of the cache's rows, (4, 1)"));
  }
}

TEST_CASE("next_logits is the last position of forward and of forward_cached, and fills the same cache",
          "[nn][model][generate]") {
  torch::manual_seed(11);
  TransformerLMOptions post_ln(30, 10, 16, 4, 2);
  post_ln.block().pre_ln(false);
  TransformerLMOptions rotary(30, 10, 16, 4, 2);
  rotary.positions(PositionEncoding::rotary);
  rotary.block().attention().n_kv_heads(2);
  auto rotary_plain = rotary;
  rotary_plain.block().attention().kernel(AttentionKernel::plain);
  TinyAttentionLMOptions tiny_plain(30, 10, 16, 2);
  tiny_plain.attention_kernel(AttentionKernel::plain);  // not fused: through the module
  std::vector<LanguageModel> models = {LanguageModel(TinyAttentionLM(TinyAttentionLMOptions(30, 10, 16, 2)).ptr()),
                                       LanguageModel(TinyAttentionLM(tiny_plain).ptr()),
                                       LanguageModel(TransformerLM(TransformerLMOptions(30, 10, 16, 2, 2)).ptr()),
                                       LanguageModel(TransformerLM(post_ln).ptr()),
                                       LanguageModel(TransformerLM(rotary).ptr()),
                                       LanguageModel(TransformerLM(rotary_plain).ptr())};
  for (size_t m = 0; m < models.size(); ++m) {
    auto& model = models[m];
    INFO("model " << m << ": " << model->architecture().kind);
    model->eval();
    torch::NoGradGuard no_grad;
    for (int64_t T : {1, 6, 10}) {
      INFO("T = " << T);
      const auto ids = torch::randint(30, {3, T}, torch::kLong);
      const auto alone = model->next_logits(ids);
      REQUIRE(alone.sizes() == torch::IntArrayRef({3, 30}));
      CHECK(max_abs_diff(alone, model->forward(ids).logits.select(1, -1)) < 1e-5);
      KVCache expected, got;
      const auto cached = model->next_logits(ids, &got);
      CHECK(max_abs_diff(cached, model->forward_cached(ids, expected).select(1, -1)) < 1e-5);
      REQUIRE(got.length == T);
      REQUIRE(got.keys.size() == expected.keys.size());
      for (size_t l = 0; l < got.keys.size(); ++l) {
        CHECK(max_abs_diff(got.keys[l], expected.keys[l]) < 1e-6);
        CHECK(max_abs_diff(got.values[l], expected.values[l]) < 1e-6);
      }
      if (T < 10) {  // one more token on each cache
        const auto next = torch::randint(30, {3, 1}, torch::kLong);
        CHECK(max_abs_diff(model->next_logits(next, &got), model->forward_cached(next, expected).select(1, -1)) <
              1e-5);
        CHECK(got.length == T + 1);
      }
    }
    const auto bad = torch::full({1, 4}, 30, torch::kLong);
    CHECK_THAT(error_message([&] { model->next_logits(bad); }), Catch::Contains("token ids must be in [0, 30)"));
    CHECK_THAT(error_message([&] { model->next_logits(torch::zeros({1, 11}, torch::kLong)); }),
               Catch::Contains("exceeds context_length 10"));
  }
}

TEST_CASE("next_token_loss in training: LibTorch's cross-entropy and its gradient, ignored targets skipped",
          "[nn][model][loss]") {
  torch::manual_seed(21);
  const int64_t B = 3, T = 70, V = GENERATE(256, 37);  // 37: rows of no whole vector; 210 rows: a last block of 18
  INFO("V " << V);
  auto logits = torch::randn({B, T, V}) * 3;
  auto targets = torch::randint(V, {B, T});
  targets.index_put_({0, torch::indexing::Slice(0, 9)}, kIgnoreTarget);
  const auto upstream = torch::tensor(0.75f);
  auto ours = logits.clone().requires_grad_();
  auto loss = next_token_loss(ours, targets);
  (loss * upstream).backward();
  auto theirs = logits.clone().requires_grad_();
  auto want = torch::nn::functional::cross_entropy(
      theirs.reshape({B * T, V}), targets.reshape({B * T}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreTarget));
  (want * upstream).backward();
  CHECK(loss.dim() == 0);
  CHECK(std::abs(loss.item<double>() - want.item<double>()) < 1e-6 * want.item<double>());
  CHECK(max_abs_diff(ours.grad(), theirs.grad()) < 1e-7);
  CHECK(ours.grad().index({0, torch::indexing::Slice(0, 9)}).abs().max().item<float>() == 0.f);
  // The same loss without a gradient to make (evaluation): LibTorch's op.
  {
    torch::NoGradGuard no_grad;
    CHECK(std::abs(next_token_loss(logits, targets).item<double>() - want.item<double>()) < 1e-6 * want.item<double>());
  }
  // Every target ignored: NaN, as LibTorch's mean gives; a target past the vocabulary: refused.
  auto none = torch::full({B, T}, kIgnoreTarget, torch::kLong);
  CHECK(std::isnan(next_token_loss(logits.clone().requires_grad_(), none).item<double>()));
  auto past = targets.clone();
  past.index_put_({1, 3}, V);
  CHECK_THROWS_WITH(next_token_loss(logits.clone().requires_grad_(), past),
                    Catch::Contains("target " + std::to_string(V) + " is outside the vocabulary"));
}
