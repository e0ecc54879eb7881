// ONNX export (tinylm/onnx.h): the forward pass of MultiHeadSelfAttention, TransformerBlock,
// TinyAttentionLM and TransformerLM written as ONNX nodes, op for op as those modules
// compute it, into a ModelProto made of internal/onnx_graph.h's pieces.
#include <tinylm/onnx.h>

#include <tinylm/nn/attention.h>
#include <tinylm/nn/block.h>
#include <tinylm/nn/embedding.h>
#include <tinylm/version.h>

#include "internal/files.h"
#include "internal/onnx_graph.h"

#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace tinylm::interop {

namespace {

using namespace internal::onnx;  // the ModelProto's pieces (internal/onnx_graph.h)
namespace pb = internal::protobuf;

/// One attention layer's cache in the KV-cache graph: its inputs and outputs, and the
/// shapes of (batch, kv_heads, sequence, d_head).
struct LayerCache {
  std::string past_key, past_value, present_key, present_value, attentions;
  int64_t heads, kv_heads, d_head;
};

/// Writes a model's forward pass: the parts are shared by the two kinds. With the KV cache,
/// the new tokens sit at positions past .. past + T - 1 (past = the cache's length), their
/// keys and values are appended to the cache, and each attention layer's weights are an
/// output.
class Writer {
 public:
  Writer(Graph& g, const std::map<std::string, torch::Tensor>& params, int64_t context, bool kv_cache)
      : g_(g), params_(params), context_(context), kv_cache_(kv_cache) {}

  const torch::Tensor& param(const std::string& name) const {
    const auto it = params_.find(name);
    TORCH_CHECK(it != params_.end(), "ONNX export: the model has no parameter '", name, "'");
    return it->second;
  }
  std::string weight(const std::string& name) { return g_.weight(name, param(name)); }

  /// The new tokens' first and last + 1 positions, (1,) int64 each: 0 and T, or with the
  /// cache past and past + T.
  void begin(const std::string& ids) {
    zero_ = g_.ints({0});
    auto seq = g_.op("Slice", {g_.op("Shape", {ids}), g_.ints({1}), g_.ints({2}), zero_});
    if (kv_cache_) {
      start_ = g_.op("Slice", {g_.op("Shape", {cache_name(0, "past_key_values", "key")}), g_.ints({2}), g_.ints({3}), zero_});
      end_ = g_.op("Add", {start_, seq});
    } else {
      start_ = zero_, end_ = seq;
    }
  }
  /// The new tokens' rows of a (C, ...) table of positions.
  std::string position_rows(const std::string& table) { return g_.op("Slice", {table, start_, end_, zero_}); }

  const std::vector<LayerCache>& caches() const { return caches_; }

  /// x Wᵀ (+ b), as torch::nn::Linear computes it.
  std::string linear(const std::string& x, const std::string& prefix, bool bias) {
    auto y = g_.op("MatMul", {x, g_.op("Transpose", {weight(prefix + ".weight")}, attr_ints("perm", {1, 0}))});
    return bias ? g_.op("Add", {y, weight(prefix + ".bias")}) : y;
  }
  bool has(const std::string& name) const { return params_.count(name) > 0; }

  std::string norm(const std::string& x, const std::string& prefix, const nn::LayerNormOptions& o) {
    const int64_t D = o.d_model();
    const bool gain = has(prefix + ".weight"), bias = has(prefix + ".bias");
    if (o.kind() == nn::NormKind::layer_norm) {
      std::vector<std::string> in = {x, gain ? weight(prefix + ".weight") : g_.weight(prefix + ".ones", torch::ones({D}))};
      if (bias) in.push_back(weight(prefix + ".bias"));
      return g_.op("LayerNormalization", in, attr_int("axis", -1) + attr_float("epsilon", static_cast<float>(o.eps())));
    }
    // RMSNorm: x / sqrt(mean(x²) + eps), then the gain and bias.
    auto ms = g_.op("ReduceMean", {g_.op("Mul", {x, x})}, attr_ints("axes", {-1}) + attr_int("keepdims", 1));
    auto y = g_.op("Div", {x, g_.op("Sqrt", {g_.op("Add", {ms, g_.scalar(static_cast<float>(o.eps()))})})});
    if (gain) y = g_.op("Mul", {y, weight(prefix + ".weight")});
    return bias ? g_.op("Add", {y, weight(prefix + ".bias")}) : y;
  }

  /// (B, T, heads, Dh) rotated by position, halves (a, b) -> (a cos - b sin, b cos + a sin).
  std::string rotate(const std::string& x, int64_t Dh, double base) {
    const int64_t half = Dh / 2;
    if (!rotary_cos_.count(base)) {  // the angles as rotary.cpp makes them: in double, then float
      auto inv_freq = torch::pow(base, torch::arange(half, torch::kDouble) * (-2.0 / static_cast<double>(2 * half)));
      auto a = torch::arange(context_, torch::kDouble).unsqueeze(1) * inv_freq.unsqueeze(0);  // (C, half)
      const auto tag = "rotary_" + std::to_string(rotary_cos_.size());
      auto axis = g_.ints({1});
      rotary_cos_[base] = g_.op("Unsqueeze", {position_rows(g_.weight(tag + ".cos", a.cos().to(torch::kFloat))), axis});
      rotary_sin_[base] = g_.op("Unsqueeze", {position_rows(g_.weight(tag + ".sin", a.sin().to(torch::kFloat))), axis});
    }
    const auto& c = rotary_cos_[base];
    const auto& s = rotary_sin_[base];
    auto halves = g_.node("Split", {x, g_.ints({half, half})}, attr_int("axis", 3), 2);
    const auto& a = halves[0];
    const auto& b = halves[1];
    return g_.op("Concat", {g_.op("Sub", {g_.op("Mul", {a, c}), g_.op("Mul", {b, s})}),
                            g_.op("Add", {g_.op("Mul", {b, c}), g_.op("Mul", {a, s})})},
                 attr_int("axis", 3));
  }

  /// MultiHeadSelfAttention's forward: (B, T, D) -> (B, T, D); with the cache, the keys
  /// and values attended to are the past's and then these.
  std::string attention(const std::string& x, const std::string& prefix, const nn::MultiHeadSelfAttentionImpl& m) {
    const auto& o = m.options;
    const int64_t D = o.d_model(), H = o.n_heads(), Hkv = m.n_kv_heads(), Dh = m.d_head();
    const bool bias = has(prefix + ".qkv_proj.bias");
    auto qkv = linear(x, prefix + ".qkv_proj", bias);
    auto parts = g_.node("Split", {qkv, g_.ints({D, Hkv * Dh, Hkv * Dh})}, attr_int("axis", 2), 3);
    auto q = g_.op("Reshape", {parts[0], g_.ints({0, 0, H, Dh})});    // (B, T, H, Dh)
    auto k = g_.op("Reshape", {parts[1], g_.ints({0, 0, Hkv, Dh})});  // (B, T, Hkv, Dh)
    auto v = g_.op("Reshape", {parts[2], g_.ints({0, 0, Hkv, Dh})});
    if (o.rotary_base() > 0) {
      q = rotate(q, Dh, o.rotary_base());
      k = rotate(k, Dh, o.rotary_base());
    }
    const auto heads_first = attr_ints("perm", {0, 2, 1, 3});
    q = g_.op("Transpose", {q}, heads_first);  // (B, H, T, Dh)
    k = g_.op("Transpose", {k}, heads_first);  // (B, Hkv, T, Dh)
    v = g_.op("Transpose", {v}, heads_first);
    LayerCache cache;
    if (kv_cache_) {  // (B, Hkv, past + T, Dh), keys after rotation, before GQA's repeat
      const auto l = static_cast<int64_t>(caches_.size());
      cache = {cache_name(l, "past_key_values", "key"), cache_name(l, "past_key_values", "value"),
               cache_name(l, "present", "key"), cache_name(l, "present", "value"),
               "attentions." + std::to_string(l), H, Hkv, Dh};
      k = g_.node("Concat", {cache.past_key, k}, attr_int("axis", 2), 1, cache.present_key).front();
      v = g_.node("Concat", {cache.past_value, v}, attr_int("axis", 2), 1, cache.present_value).front();
      caches_.push_back(cache);
    }
    if (Hkv != H) {  // each key/value head serves H / Hkv query heads, in order
      const auto repeat = [&](const std::string& t) {
        auto wide = g_.op("Expand", {g_.op("Unsqueeze", {t, g_.ints({2})}), g_.ints({1, 1, H / Hkv, 1, 1})});
        return g_.op("Reshape", {wide, g_.ints({0, H, -1, Dh})});
      };
      k = repeat(k), v = repeat(v);
    }
    auto scores = g_.op("Mul", {g_.op("MatMul", {q, g_.op("Transpose", {k}, attr_ints("perm", {0, 1, 3, 2}))}),
                                g_.scalar(static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh))))});
    if (o.causal()) scores = g_.op("Add", {scores, causal_mask()});
    auto weights = g_.node("Softmax", {scores}, attr_int("axis", -1), 1, cache.attentions).front();
    auto context = g_.op("Transpose", {g_.op("MatMul", {weights, v})}, heads_first);  // (B, T, H, Dh)
    return linear(g_.op("Reshape", {context, g_.ints({0, 0, D})}), prefix + ".out_proj", bias);
  }

  std::string feed_forward(const std::string& x, const std::string& prefix, const nn::FeedForwardImpl& m) {
    const bool bias = has(prefix + ".fc.bias");
    auto a = linear(x, prefix + ".fc", bias);
    std::string h;
    switch (m.options.activation()) {
      case nn::Activation::swiglu: {
        const int64_t F = m.hidden();
        auto gate_up = g_.node("Split", {a, g_.ints({F, F})}, attr_int("axis", -1), 2);
        h = g_.op("Mul", {g_.op("Mul", {gate_up[0], g_.op("Sigmoid", {gate_up[0]})}), gate_up[1]});
        break;
      }
      case nn::Activation::gelu: {  // x Φ(x) = 0.5 x (1 + erf(x / sqrt 2))
        auto erf = g_.op("Erf", {g_.op("Mul", {a, g_.scalar(static_cast<float>(1.0 / std::sqrt(2.0)))})});
        h = g_.op("Mul", {g_.op("Mul", {a, g_.scalar(0.5f)}), g_.op("Add", {erf, g_.scalar(1.0f)})});
        break;
      }
      case nn::Activation::gelu_tanh: {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))
        auto cube = g_.op("Mul", {g_.op("Mul", {a, a}), a});
        auto inner = g_.op("Mul", {g_.op("Add", {a, g_.op("Mul", {cube, g_.scalar(0.044715f)})}),
                                   g_.scalar(static_cast<float>(std::sqrt(2.0 / std::acos(-1.0))))});
        h = g_.op("Mul", {g_.op("Mul", {a, g_.scalar(0.5f)}), g_.op("Add", {g_.op("Tanh", {inner}), g_.scalar(1.0f)})});
        break;
      }
    }
    return linear(h, prefix + ".proj", bias);
  }

 private:
  static std::string cache_name(int64_t layer, const std::string& part, const std::string& which) {
    return part + "." + std::to_string(layer) + "." + which;
  }

  /// (T, past + T): 0 where a query may look, -inf past it (the table's rows past .. past + T).
  const std::string& causal_mask() {
    if (mask_.empty()) {
      auto m = torch::full({context_, context_}, -std::numeric_limits<float>::infinity()).triu(1);
      auto table = g_.weight("causal_mask", m);
      mask_ = g_.op("Slice", {table, g_.op("Concat", {start_, zero_}, attr_int("axis", 0)),
                              g_.op("Concat", {end_, end_}, attr_int("axis", 0)), g_.ints({0, 1})});
    }
    return mask_;
  }

  Graph& g_;
  const std::map<std::string, torch::Tensor>& params_;
  int64_t context_;
  bool kv_cache_;
  std::vector<LayerCache> caches_;
  std::string zero_, start_, end_, mask_;
  std::map<double, std::string> rotary_cos_, rotary_sin_;
};

}  // namespace

std::string onnx_refusal(const nn::LanguageModelImpl& model) {
  if (dynamic_cast<const nn::TinyAttentionLMImpl*>(&model) || dynamic_cast<const nn::TransformerLMImpl*>(&model))
    return "";
  return "ONNX export covers the kinds 'tiny' and 'transformer', not '" + model.architecture().kind + "'";
}

std::vector<OnnxLayerCache> onnx_cache_layout(const nn::LanguageModelImpl& model) {
  const auto refusal = onnx_refusal(model);
  TORCH_CHECK(refusal.empty(), refusal);
  std::vector<const nn::MultiHeadSelfAttentionImpl*> layers;
  if (const auto* tiny = dynamic_cast<const nn::TinyAttentionLMImpl*>(&model)) {
    layers.push_back(tiny->attention.get());
  } else {
    const auto& t = dynamic_cast<const nn::TransformerLMImpl&>(model);
    for (const auto& block : *t.blocks) layers.push_back(block->as<nn::TransformerBlock>()->attn.get());
  }
  std::vector<OnnxLayerCache> out;
  for (const auto* a : layers) out.push_back({a->options.n_heads(), a->n_kv_heads(), a->d_head()});
  return out;
}

std::string onnx_model(nn::LanguageModelImpl& model, std::map<std::string, std::string> metadata,
                       const OnnxOptions& options) {
  const auto refusal = onnx_refusal(model);
  TORCH_CHECK(refusal.empty(), refusal);
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  const int64_t C = model.context_length(), V = model.vocab_size();
  Graph g;
  Writer w(g, params, C, options.kv_cache);
  const std::string ids = "input_ids";
  w.begin(ids);
  std::string logits;
  if (auto* tiny = dynamic_cast<nn::TinyAttentionLMImpl*>(&model)) {
    torch::NoGradGuard no_grad;
    auto x = g.op("Gather", {w.weight("token_embedding.weight"), ids});  // (B, T, D)
    x = g.op("Add", {x, w.position_rows(g.weight("sinusoidal_positions.table", tiny->sinusoidal_positions(C)))});
    logits = w.linear(w.attention(x, "attention", *tiny->attention), "lm_head", true);
  } else {
    auto& t = dynamic_cast<nn::TransformerLMImpl&>(model);
    torch::NoGradGuard no_grad;
    auto x = g.op("Gather", {w.weight("token_embedding.weight"), ids});
    if (t.learned_positions) x = g.op("Add", {x, w.position_rows(w.weight("learned_positions.weight"))});
    if (t.sinusoidal_positions)
      x = g.op("Add", {x, w.position_rows(g.weight("sinusoidal_positions.table", t.sinusoidal_positions(C)))});
    for (size_t l = 0; l < t.blocks->size(); ++l) {
      const auto& block = *t.blocks[l]->as<nn::TransformerBlock>();
      const std::string p = "blocks." + std::to_string(l);
      const auto& norm = block.options.norm();
      if (block.options.pre_ln()) {  // h = x + attn(ln1(x)); x = h + mlp(ln2(h))
        auto h = g.op("Add", {x, w.attention(w.norm(x, p + ".ln1", norm), p + ".attn", *block.attn)});
        x = g.op("Add", {h, w.feed_forward(w.norm(h, p + ".ln2", norm), p + ".mlp", *block.mlp)});
      } else {  // h = ln1(x + attn(x)); x = ln2(h + mlp(h))
        auto h = w.norm(g.op("Add", {x, w.attention(x, p + ".attn", *block.attn)}), p + ".ln1", norm);
        x = w.norm(g.op("Add", {h, w.feed_forward(h, p + ".mlp", *block.mlp)}), p + ".ln2", norm);
      }
    }
    x = w.norm(x, "ln_f", t.options.block().norm());
    const std::string head = t.options.tie_weights() ? "token_embedding.weight" : "lm_head.weight";
    logits = g.op("MatMul", {x, g.op("Transpose", {w.weight(head)}, attr_ints("perm", {1, 0}))});
  }
  logits = g.node("Identity", {logits}, "", 1, "logits").front();
  auto inputs = pb::field(graph_f::input, value_info(ids, dtype::INT64, {"batch", "sequence"}));
  auto outputs = pb::field(graph_f::output, value_info(logits, dtype::FLOAT, {"batch", "sequence", std::to_string(V)}));
  for (const auto& c : w.caches()) {
    const auto Hkv = std::to_string(c.kv_heads), Dh = std::to_string(c.d_head);
    for (const auto& name : {c.past_key, c.past_value})
      inputs += pb::field(graph_f::input, value_info(name, dtype::FLOAT, {"batch", Hkv, "past_sequence", Dh}));
    for (const auto& name : {c.present_key, c.present_value})
      outputs += pb::field(graph_f::output, value_info(name, dtype::FLOAT, {"batch", Hkv, "total_sequence", Dh}));
  }
  for (const auto& c : w.caches())
    outputs += pb::field(graph_f::output, value_info(c.attentions, dtype::FLOAT,
                                                     {"batch", std::to_string(c.heads), "sequence", "total_sequence"}));
  metadata.emplace("tinylm.graph", options.kv_cache ? "kv_cache" : "logits");
  const auto graph = g.bytes(model.architecture().kind, inputs, outputs);

  std::string m = pb::number_field(model_f::ir_version, kIrVersion);
  m += pb::field(model_f::producer_name, "tinylm");
  m += pb::field(model_f::producer_version, TINYLM_VERSION_STRING);
  m += pb::field(model_f::doc_string,
                 "A tinylm '" + model.architecture().kind + "' language model: input_ids (batch, sequence" +
                     (options.kv_cache ? ") int64 and past_key_values.N.key/value (batch, kv_heads, past_sequence, "
                                         "d_head), past_sequence + sequence <= "
                                       : " <= ") +
                     std::to_string(C) + ") -> logits (batch, sequence, " + std::to_string(V) + ") float32" +
                     (options.kv_cache ? ", present.N.key/value (past and these) and attentions.N (batch, heads, "
                                         "sequence, past_sequence + sequence)"
                                       : ""));
  m += pb::field(model_f::graph, graph);
  m += pb::field(model_f::opset_import, pb::field(1, "") + pb::number_field(2, kOnnxOpset));
  for (const auto& [key, value] : metadata) m += pb::field(model_f::metadata_props, pb::field(1, key) + pb::field(2, value));
  return m;
}

std::vector<std::string> export_onnx(nn::LanguageModelImpl& model, const std::string& path,
                                     std::map<std::string, std::string> metadata, bool overwrite,
                                     const data::Tokenizer* tokenizer, const OnnxOptions& options) {
  const bool sentencepiece = tokenizer && tokenizer->kind() == "sentencepiece";
  const std::string tokenizer_path = path + ".sentencepiece.model";
  internal::check_output_path(path, overwrite);
  if (sentencepiece) internal::check_output_path(tokenizer_path, overwrite);
  if (tokenizer) metadata["tinylm.tokenizer"] = tokenizer->kind();
  if (sentencepiece) metadata["tinylm.tokenizer_file"] = std::filesystem::path(tokenizer_path).filename().string();
  const auto bytes = onnx_model(model, metadata, options);  // before anything is written: it may refuse
  std::vector<std::string> written;
  if (sentencepiece) {
    internal::write_file_atomically(tokenizer_path, tokenizer->model_bytes(), "SentencePiece model");
    written.push_back(tokenizer_path);
  }
  internal::write_file_atomically(path, bytes, "ONNX model");
  written.insert(written.begin(), path);
  return written;
}

}  // namespace tinylm::interop
