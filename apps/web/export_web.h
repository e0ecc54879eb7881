// tinylm export --format web: a static page that generates with the model in a browser
// (apps/web/page/, compiled in), the model as the KV-cache ONNX graph, and ONNX Runtime
// Web's script and WebAssembly copied from the npm package `onnxruntime-web`.
#pragma once

#include <tinylm/run.h>

#include <map>
#include <string>
#include <vector>

namespace tinylm::cli {

struct WebExportOptions {
  std::string out;              // the folder to write; must not exist (see overwrite)
  std::string onnxruntime_web;  // the npm package's folder (with dist/), or its dist/
  bool overwrite = false;       // replace `out` if it is a page tinylm wrote before
};

/// Writes the page's folder whole or not at all (built beside it, then renamed); refuses
/// a model whose tokenizer the page does not have (SentencePiece). Returns the files.
std::vector<std::string> export_web(InferenceRun& run, const std::map<std::string, std::string>& metadata,
                                    const WebExportOptions& options);

}  // namespace tinylm::cli
