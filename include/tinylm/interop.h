// Weights in and out of PyTorch, through LibTorch's own pickle format (what Python's
// torch.load reads and torch.save writes).
#pragma once

#include <tinylm/train/checkpoint.h>

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace tinylm::interop {

/// nanoGPT's name for a TransformerLM parameter ("blocks.0.attn.qkv_proj.weight" ->
/// "transformer.h.0.attn.c_attn.weight"); throws on a name nanoGPT has no place for.
std::string nanogpt_name(const std::string& tinylm_name);

/// The bytes Python's `torch.save(obj, f)` writes for `value` (dicts, lists, strings,
/// numbers, bools and tensors): a zip archive whose pickle uses only what `torch.load`'s
/// default `weights_only=True` allows. (PyTorch 2.6 and later refuse the TorchScript type
/// tags that `torch::pickle_save` adds to every dict.)
std::string torch_save_bytes(const c10::IValue& value);

/// What export_nanogpt would say of a checkpoint: empty when nanoGPT's GPT expresses
/// its model exactly; otherwise the differences that make it refuse (`refusals`) or
/// that it writes anyway and reports (`notes`).
struct NanoGPTFit {
  std::vector<std::string> refusals;
  std::vector<std::string> notes;
};
NanoGPTFit nanogpt_fit(const train::Checkpoint& checkpoint);

/// Writes a nanoGPT checkpoint to `path` (atomically; an existing file is refused unless
/// `overwrite`): {"model": state dict with nanoGPT's names and layout (lm_head.weight
/// tied to transformer.wte.weight), "model_args": {n_layer, n_head, n_embd, block_size,
/// bias, vocab_size, dropout}, "iter_num", "best_val_loss", "tinylm_architecture"}, which
/// nanoGPT's GPT loads with load_state_dict(strict=True). Refuses, naming the reason, a
/// model nanoGPT cannot express (the tiny model, post-LN, sinusoidal or no positions,
/// untied head, no Linear biases but non-zero LayerNorm biases, an MLP expansion other than
/// 4; a model without Linear biases exports as bias=False when its LayerNorms have no
/// biases or zero ones). Returns the notes (a model with tanh-approximated GELU: nanoGPT's
/// exact GELU gives slightly different logits; LayerNorms without biases in a model with
/// Linear biases, written as zero biases).
std::vector<std::string> export_nanogpt(const train::Checkpoint& checkpoint, const std::string& path,
                                        bool overwrite = false);

/// A model read from a nanoGPT checkpoint.
struct NanoGPTImport {
  nn::LanguageModel model;         // a TransformerLM with nanoGPT's weights (exact GELU)
  int64_t iter_num = 0;            // the checkpoint's, 0 for a bare state dict
  std::vector<std::string> notes;  // what was skipped or inferred
};

/// Reads `path`, written by Python's torch.save: nanoGPT's ckpt.pt ({"model": state dict,
/// "model_args": {...}, ...}) or a bare state dict, whose number of heads the weights do
/// not tell (`n_heads`, 0 = take model_args'). A "_orig_mod." prefix (torch.compile) is
/// stripped and nanoGPT's causal-mask buffers ("attn.bias", when it ran without flash
/// attention) are skipped. Every weight must be there with the shape the model args
/// imply, and nothing else: a missing or extra key, or a shape that does not fit, is an
/// error naming it. A head that differs from the token embedding makes an untied model;
/// bias=False makes a model without Linear or LayerNorm biases (layer_norm_bias false),
/// which trains as nanoGPT's does.
NanoGPTImport import_nanogpt(const std::string& path, int64_t n_heads = 0);

}  // namespace tinylm::interop
