// tinylm export CKPT --out FILE: a checkpoint's model as nanoGPT's ckpt.pt (--format
// pytorch), as an ONNX graph (--format onnx) or as a page that generates in a browser
// (--format web: web/export_web.h).
#include "../command.h"
#include "../web/export_web.h"

#include <tinylm/interop.h>
#include <tinylm/log.h>
#include <tinylm/onnx.h>
#include <tinylm/run.h>
#include <tinylm/version.h>

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

namespace tinylm::cli {

namespace {

struct ExportArgs {
  std::string checkpoint, out, format = "pytorch", onnxruntime_web;
  bool overwrite = false, kv_cache = false;
};

/// The ONNX file's metadata_props: what the model is and how its ids are made.
std::map<std::string, std::string> onnx_metadata(const InferenceRun& run) {
  const auto& ck = run.checkpoint;
  nlohmann::json options(ck.architecture.options);
  std::map<std::string, std::string> m = {
      {"tinylm.kind", ck.architecture.kind},
      {"tinylm.architecture_version", std::to_string(ck.architecture.version)},
      {"tinylm.architecture", options.dump()},
      {"tinylm.step", std::to_string(ck.state.step)},
      {"tinylm.context_length", std::to_string(run.model->context_length())},
      {"tinylm.vocab_size", std::to_string(run.model->vocab_size())},
      {"tinylm.version", TINYLM_VERSION_STRING}};
  return m;
}

int run_export(const ExportArgs& a) {
  TORCH_CHECK(a.format == "pytorch" || a.format == "onnx" || a.format == "web",
              "--format must be pytorch (nanoGPT's checkpoint layout), onnx or web, got '", a.format, "'");
  TORCH_CHECK(!a.out.empty(), "--out must name a file");
  TORCH_CHECK(!a.kv_cache || a.format == "onnx",
              "--kv-cache is for --format onnx (nanoGPT's checkpoint has no graph; the web page's has the cache always)");
  TORCH_CHECK(a.onnxruntime_web.empty() || a.format == "web", "--onnxruntime-web is for --format web");
  if (a.format == "pytorch") {
    const auto ck = open_checkpoint(a.checkpoint);
    const auto notes = interop::export_nanogpt(ck, a.out, a.overwrite);
    for (const auto& note : notes) logger()->warn("note: {}", note);
    logger()->info("wrote {}: step {}, {} parameters with nanoGPT's names; in Python: "
                   "GPT(GPTConfig(**ck['model_args'])).load_state_dict(ck['model'])",
                   a.out, ck.state.step, ck.parameter_names.size());
    return 0;
  }
  // ONNX: the model as inference builds it (sizes checked before allocating); refused
  // where ONNX export does not cover it.
  auto run = open_for_inference(open_checkpoint(a.checkpoint));
  const auto refusal = interop::onnx_refusal(*run.model);
  TORCH_CHECK(refusal.empty(), "cannot export '", run.checkpoint.path, "' as ONNX: ", refusal);
  run.model->eval();
  if (a.format == "web") {
    const auto written = export_web(run, onnx_metadata(run), {a.out, a.onnxruntime_web, a.overwrite});
    logger()->info("wrote {}: a page that generates with the model in a browser ({} files: the KV-cache ONNX graph, "
                   "ONNX Runtime Web's WebAssembly); serve the folder over HTTP, e.g. python3 -m http.server -d {}",
                   a.out, written.size(), a.out);
    return 0;
  }
  interop::OnnxOptions options;
  options.kv_cache = a.kv_cache;
  const auto written =
      interop::export_onnx(*run.model, a.out, onnx_metadata(run), a.overwrite, run.tokenizer.get(), options);
  logger()->info("wrote {}: ONNX opset {}, input_ids (batch, sequence{} <= {}) int64 -> logits (batch, sequence, {}) "
                 "float32{}; step {}{}",
                 a.out, interop::kOnnxOpset, a.kv_cache ? " + past_sequence" : "", run.model->context_length(),
                 run.model->vocab_size(),
                 a.kv_cache ? ", with the KV cache (past_key_values.N.key/value -> present.N.key/value, attentions.N)"
                            : "",
                 run.checkpoint.state.step, written.size() > 1 ? "; its SentencePiece model: " + written[1] : "");
  return 0;
}

}  // namespace

Command add_export(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  ExportArgs& export_args = *args;
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model for PyTorch (nanoGPT's GPT) or as ONNX");
  export_cmd->add_option("checkpoint", export_args.checkpoint, "checkpoint file or run directory")->required();
  export_cmd->add_option("--out", export_args.out, "the file to write (.pt, .onnx), or web's folder")->required();
  export_cmd->add_option("--format", export_args.format,
                         "pytorch: nanoGPT's ckpt.pt (state dict with its names, model_args); onnx: an ONNX "
                         "graph; web: a page that generates in a browser (docs/export.md)")
      ->capture_default_str();
  export_cmd->add_flag("--overwrite", export_args.overwrite, "replace --out if it exists");
  export_cmd->add_flag("--kv-cache", export_args.kv_cache,
                       "onnx: the graph that takes and returns the KV cache, to generate a token at a time "
                       "(docs/export.md)");
  export_cmd->add_option("--onnxruntime-web", export_args.onnxruntime_web,
                         "web: the npm package onnxruntime-web's folder (1.17 or later), whose script and "
                         "WebAssembly the page loads");

  return {export_cmd, [args] { return run_export(*args); }};
}

}  // namespace tinylm::cli
