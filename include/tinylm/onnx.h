// A model as an ONNX graph: the same forward pass, to run where ONNX Runtime runs (a
// service in another language, a phone, a web page). Written by tinylm itself (no protobuf
// or ONNX library at build time); docs/export.md has the graph's inputs, outputs and ops.
#pragma once

#include <tinylm/data/tokenizer.h>
#include <tinylm/nn/model.h>

#include <map>
#include <string>
#include <vector>

namespace tinylm::interop {

/// The ONNX opset the graphs use (ONNX 1.12 and later read it: LayerNormalization came in 17).
constexpr int64_t kOnnxOpset = 17;

/// Why ONNX export does not cover this model ("" when it does): every TinyAttentionLM
/// and TransformerLM option is covered; another kind (a program's own) is not.
std::string onnx_refusal(const nn::LanguageModelImpl& model);

/// One attention layer of the KV-cache graph, in order: its `past_key_values.N.key` and
/// `.value` are (batch, kv_heads, past_sequence, d_head), its `attentions.N` (batch, heads,
/// sequence, past_sequence + sequence).
struct OnnxLayerCache {
  int64_t heads = 0, kv_heads = 0, d_head = 0;
};

/// The model's attention layers as the KV-cache graph takes them (what a runtime needs to
/// make the first call's empty past). Throws on what onnx_refusal names.
std::vector<OnnxLayerCache> onnx_cache_layout(const nn::LanguageModelImpl& model);

/// Which graph onnx_model() writes.
struct OnnxOptions {
  /// Also takes and returns the KV cache, to generate a token at a time (the layout ONNX
  /// Runtime's generation tools and transformers.js use): inputs
  /// `past_key_values.N.key`/`.value` float32 (batch, kv_heads, past_sequence, d_head),
  /// past_sequence 0 at the first call; outputs `present.N.key`/`.value` (batch, kv_heads,
  /// past_sequence + sequence, d_head), the past and then the new tokens' (keys after
  /// rotation), and `attentions.N` (batch, heads, sequence, past_sequence + sequence), each
  /// layer's attention weights. past_sequence + sequence at most the context length.
  bool kv_cache = false;
};

/// The model's forward pass as a serialized ONNX ModelProto (opset kOnnxOpset): input
/// `input_ids` int64 (batch, sequence), sequence at most the context length; output
/// `logits` float32 (batch, sequence, vocab); with options.kv_cache the cache's inputs and
/// outputs too. The weights as initializers under their tinylm names; `metadata` in
/// metadata_props, with tinylm.graph ("logits" or "kv_cache"). Throws, naming it, on what
/// onnx_refusal names.
std::string onnx_model(nn::LanguageModelImpl& model, std::map<std::string, std::string> metadata = {},
                       const OnnxOptions& options = {});

/// Writes onnx_model(model, metadata, options) to `path` atomically; an existing file is refused
/// unless `overwrite`. With a SentencePiece `tokenizer`, its model is written beside, as
/// `path` + ".sentencepiece.model" (named in the metadata as tinylm.tokenizer_file); both
/// paths are checked before either is written. Returns the files written.
std::vector<std::string> export_onnx(nn::LanguageModelImpl& model, const std::string& path,
                                     std::map<std::string, std::string> metadata = {}, bool overwrite = false,
                                     const data::Tokenizer* tokenizer = nullptr, const OnnxOptions& options = {});

}  // namespace tinylm::interop
