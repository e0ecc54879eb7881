// Op-family timing for tinylm bench (see op_profile.h).
#include "op_profile.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

namespace tinylm::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct Frame {
  std::string name;
  std::string family;
  Clock::time_point start;
  double children = 0;  // seconds spent in ops this one called
};

std::mutex g_mutex;
std::map<std::string, double> g_seconds;                         // under g_mutex
std::map<std::string, std::map<std::string, double>> g_by_op;   // under g_mutex
std::atomic<bool> g_active{false};

std::vector<Frame>& stack() {
  thread_local std::vector<Frame> frames;
  return frames;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  auto& frames = stack();
  const std::string name = fn.name();
  // Inside a tinylm scope, the scope's family; else the op's own.
  std::string family = op_family(name);
  for (auto it = frames.rbegin(); it != frames.rend(); ++it)
    if (it->family == "optimizer" || it->family == "data") {
      family = it->family;
      break;
    }
  frames.push_back({name, family, Clock::now(), 0});
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  auto& frames = stack();
  if (frames.empty()) return;  // an op that started before the profile did
  const Frame f = frames.back();
  frames.pop_back();
  const double total = std::chrono::duration<double>(Clock::now() - f.start).count();
  if (!frames.empty()) frames.back().children += total;
  std::lock_guard<std::mutex> lock(g_mutex);
  const double self = std::max(0.0, total - f.children);
  g_seconds[f.family] += self;
  g_by_op[f.family][f.name] += self;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

at::CallbackHandle g_handle = 0;

}  // namespace

std::string op_family(const std::string& raw) {
  std::string n;
  for (char c : raw) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (contains(n, "tinylm::optimizer") || contains(n, "adam") || contains(n, "clip_grad") ||
      contains(n, "_foreach"))
    return "optimizer";
  if (contains(n, "tinylm::data")) return "data";
  if (contains(n, "log_softmax") || contains(n, "nll_loss") || contains(n, "cross_entropy") ||
      contains(n, "crossentropy") || contains(n, "logsoftmax") || contains(n, "tinylm::loss"))
    return "loss";
  if (contains(n, "attention") || contains(n, "softmax") || contains(n, "masked_fill"))
    return "attention";
  if (contains(n, "layer_norm") || contains(n, "layernorm")) return "layer_norm";
  if (contains(n, "gelu")) return "gelu";
  if (contains(n, "embedding")) return "embedding";
  if (contains(n, "mm") || contains(n, "linear") || contains(n, "matmul") || contains(n, "tinylm::gemm"))
    return "matmul";
  return "elementwise";
}

OpProfile::OpProfile() {
  TORCH_CHECK(!g_active.exchange(true), "OpProfile: one profile at a time");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_seconds.clear();
    g_by_op.clear();
  }
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end));
}

OpProfile::~OpProfile() {
  at::removeCallback(g_handle);
  g_active = false;
}

std::map<std::string, double> OpProfile::seconds() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_seconds;
}

}  // namespace tinylm::cli

namespace tinylm::cli {

std::map<std::string, std::map<std::string, double>> OpProfile::seconds_by_op() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_by_op;
}

}  // namespace tinylm::cli
