// tinylm bench: the figures of docs/performance.md, as JSON lines.
// Every figure is a median over repetitions after warm-up, with min and max.
// Over 400 lines on purpose: one harness (timing, pairing, JSON output) and its cases,
// each a few dozen lines that share those helpers.
#include "bench.h"
#include "onednn_peak.h"
#include "op_profile.h"
#include "spawn.h"

#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/run.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/tinylm.h>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

using namespace tinylm;

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median = 0, min = 0, max = 0;
  int reps = 0;
};

/// Seconds per call of fn: `warmup` calls, then `reps` timings of `inner` calls each.
Stats time_per_call(const std::function<void()>& fn, int warmup, int reps, int inner) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < inner; ++i) fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count() / inner);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back(), reps};
}

using Json = nlohmann::ordered_json;

/// Six significant digits, as the figures are quoted.
double rounded(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return std::strtod(text, nullptr);
}

void print_line(const Json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

/// A rate from a per-call time: value = scale / seconds (so min/max swap).
void emit(const std::string& name, const std::string& metric, const std::string& unit, double scale,
          const Stats& s, const Json& config) {
  print_line({{"case", name}, {"metric", metric}, {"value", rounded(scale / s.median)},
              {"unit", unit}, {"min", rounded(scale / s.max)}, {"max", rounded(scale / s.min)},
              {"reps", s.reps}, {"threads", at::get_num_threads()}, {"config", config}});
}

void emit_value(const std::string& name, const std::string& metric, const std::string& unit,
                double value, const Json& config) {
  print_line({{"case", name}, {"metric", metric}, {"value", rounded(value)}, {"unit", unit},
              {"threads", at::get_num_threads()}, {"config", config}});
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

double current_rss_mib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1048576.0);
}

std::string scratch_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("tinylm-bench-" + std::to_string(::getpid()));
  return dir.string();
}

/// The thread count every case runs with (run_bench sets it; the configs record it).
int64_t g_threads = 1;
/// --bf16: the training cases with bfloat16 products (each config's bf16), named <case>_bf16.
bool g_bf16 = false;
/// The bfloat16 matmul peak (oneDNN), once matmul_peak() has measured it; 0 before or where none.
double g_bf16_peak = 0;

std::string named(const std::string& name) { return g_bf16 ? name + "_bf16" : name; }

RunConfig p1_config() {  // the reference run
  RunConfig c;
  c.threads = g_threads;
  c.trainer.bf16(g_bf16);
  c.trainer.out_dir(scratch_dir());
  return c;
}

/// A transformer trained with AdamW on sequences of 128, batches of 16.
RunConfig transformer_config(const char* task, int64_t vocab, int64_t d_model, int64_t heads, int64_t layers) {
  RunConfig c;
  c.threads = g_threads;
  c.trainer.bf16(g_bf16);
  c.set("model", "transformer");
  c.task = task;
  c.set("vocab-size", vocab);
  c.set("d-model", d_model);
  c.set("n-heads", heads);
  c.set("n-layers", layers);
  c.task_options.seq_len(128);
  c.trainer.batch_size(16);
  c.set("optimizer", "adamw");
  return c;
}

/// The medium model; quick: one block, sequences of 32, batches of 4 (a smoke run).
RunConfig p2_config(bool quick = false) {
  RunConfig c = transformer_config("copy", 256, 256, 8, 4);
  c.trainer.optimizer().weight_decay(0.1);
  c.trainer.optimizer().lr(1e-3);
  c.trainer.out_dir(scratch_dir());
  if (quick) {
    c.set("n-layers", 1);
    c.task_options.seq_len(32);
    c.trainer.batch_size(4);
  }
  return c;
}

Json describe(const RunConfig& c) {
  return {{"model", c.model.kind()}, {"vocab", c.get<int64_t>("vocab-size")}, {"d_model", c.get<int64_t>("d-model")},
          {"heads", c.get<int64_t>("n-heads")}, {"layers", c.model.kind() == "tiny" ? 1 : c.get<int64_t>("n-layers")},
          {"seq", c.task_options.seq_len()}, {"batch", c.trainer.batch_size()}, {"optimizer", c.get<std::string>("optimizer")},
          {"attention_kernel", c.get<std::string>("attention-kernel")}, {"fused_optimizer", c.trainer.optimizer().flat()},
          {"bf16", c.trainer.bf16()}};
}

/// The weights of one step's linear products: N x K, `count` of them (each layer's qkv,
/// output, MLP up and down; the LM head).
struct LinearShape {
  int64_t N, K, count;
};
std::vector<LinearShape> linear_shapes(const RunConfig& c) {
  const int64_t D = c.get<int64_t>("d-model"), V = c.get<int64_t>("vocab-size"), L = c.get<int64_t>("n-layers"),
                e = c.get<int64_t>("mlp-expansion");
  return {{3 * D, D, L}, {D, D, L}, {e * D, D, L}, {D, e * D, L}, {V, D, 1}};
}

/// Model FLOPs of one training step (forward + backward = 3 x forward): the matmuls of
/// every layer and the LM head, and attention's two T x T products (full, not causal).
double train_flops_per_step(const RunConfig& c) {
  const double D = c.get<int64_t>("d-model"), T = c.task_options.seq_len(), L = c.get<int64_t>("n-layers");
  double per_token = 4.0 * L * T * D;
  for (const auto& z : linear_shapes(c)) per_token += 2.0 * static_cast<double>(z.count * z.N * z.K);
  return 3.0 * per_token * T * c.trainer.batch_size() * c.trainer.grad_accum();
}

/// The matmul peaks at the bench's thread count, n x n float32 products: BLAS (OpenBLAS
/// with its own threads at that count, its kernels as wide as OPENBLAS_CORETYPE lets them
/// be: AVX2 for Haswell) and libxsmm's tiles (the widest code libxsmm writes here: AVX-512
/// where the CPU has it). Returns the higher: what MFU is measured against.
double matmul_peak(bool quick) {
  const int64_t n = quick ? 256 : 1024;
  auto a = torch::randn({n, n}), b = torch::randn({n, n}), out = torch::empty({n, n});
  const double flops = 2.0 * n * n * n;
  double best = 0;
  std::vector<nn::GemmBackend> backends = {nn::GemmBackend::blas};
  if (nn::gemm_backend_available(nn::GemmBackend::libxsmm)) backends.push_back(nn::GemmBackend::libxsmm);
  for (auto backend : backends) {
    if (backend == nn::GemmBackend::blas) set_blas_threads(g_threads);  // BLAS at its best
    auto s = time_per_call([&] {
      nn::gemm(false, false, n, n, n, a.data_ptr<float>(), n, b.data_ptr<float>(), n, out.data_ptr<float>(), n,
               false, backend);
    }, quick ? 1 : 3, quick ? 3 : 9, quick ? 1 : 3);
    set_cpu_threads(g_threads);
    const std::string name = nn::to_string(backend);
    emit("peak_" + name, "matmul_gflops", "GFLOP/s", flops / 1e9, s,
         Json{{"op", "mm"}, {"n", n}, {"dtype", "float32"}, {"backend", name},
              {"blas_core", nn::blas_core_name()}});
    best = std::max(best, flops / 1e9 / s.median);
  }
  emit_value("peak", "matmul_gflops", "GFLOP/s", best,
             Json{{"op", "mm"}, {"n", n}, {"dtype", "float32"}, {"of", "the higher of peak_blas and peak_libxsmm"},
                  {"kernels", nn::cpu_kernels_description()}});
  // bfloat16 products (issue 40): oneDNN's, float32 and bfloat16 in (float32 out), with
  // the kernel it picks for this CPU (AMX, AVX512-BF16 or a conversion to float32).
  double float32 = best;
  for (const bool bf16 : {false, true}) {
    if (!onednn_missing(bf16).empty()) {  // listed as skipped, with why (stdout is JSON lines)
      print_line({{"case", bf16 ? "peak_bf16_onednn" : "peak_onednn"}, {"skipped", onednn_missing(bf16)}});
      continue;
    }
    const auto r = onednn_matmul(n, bf16, quick ? 3 : 15);
    const double gflops = flops / 1e9 / r.seconds;
    emit_value(bf16 ? "peak_bf16_onednn" : "peak_onednn", "matmul_gflops", "GFLOP/s", gflops,
               Json{{"op", "mm"}, {"n", n}, {"dtype", bf16 ? "bfloat16 in, float32 out" : "float32"},
                    {"backend", "onednn " + onednn_version()}, {"impl", r.impl}});
    if (!bf16) float32 = std::max(float32, gflops);
    if (bf16) g_bf16_peak = gflops;
    if (bf16)
      emit_value("peak_bf16_onednn", "over_float32_peak", "x", gflops / float32,
                 Json{{"n", n}, {"of", "peak_bf16_onednn over the highest float32 peak (BLAS, libxsmm, oneDNN)"},
                      {"impl", r.impl}});
  }
  // P2's products as its linear layers make them (4 x 128 tokens; x W^T), through the
  // library: float32 (nn::gemm as the policy chooses) against bfloat16 (nn::gemm_bf16, the
  // rounding of both operands included).
  if (!nn::bf16_products_missing().empty()) {
    print_line({{"case", "peak_bf16_p2_linears"}, {"skipped", nn::bf16_products_missing()}});
    return best;
  }
  const int64_t M = quick ? 64 : 512;
  double seconds[2] = {0, 0};
  for (const auto& shape : std::vector<std::pair<int64_t, int64_t>>{{768, 256}, {256, 256}, {1024, 256}, {256, 1024}}) {
    const int64_t N = shape.first, K = shape.second;  // captured below: C++17 captures no structured binding
    auto x = torch::randn({M, K}), w = torch::randn({N, K}), y = torch::empty({M, N});
    for (const bool bf16 : {false, true}) {
      const auto s = time_per_call([&] {
        if (bf16)
          nn::gemm_bf16(false, true, M, N, K, x.data_ptr<float>(), K, w.data_ptr<float>(), K, y.data_ptr<float>(), N,
                        false);
        else
          nn::gemm(false, true, M, N, K, x.data_ptr<float>(), K, w.data_ptr<float>(), K, y.data_ptr<float>(), N,
                   false, nn::GemmBackend::automatic);
      }, quick ? 1 : 3, quick ? 3 : 9, quick ? 1 : 5);
      seconds[bf16] += s.median;
    }
  }
  emit_value("peak_bf16_p2_linears", "over_float32", "x", seconds[0] / seconds[1],
             Json{{"M", M}, {"shapes", "x W^T, (N, K): (768, 256), (256, 256), (1024, 256), (256, 1024)"},
                  {"float32_ms", 1e3 * seconds[0]}, {"bfloat16_ms", 1e3 * seconds[1]},
                  {"of", "the sum of P2's four products' times, float32 over bfloat16"},
                  {"kernels", nn::bf16_products_description()}});
  return best;
}

void bench_p1(bool quick) {
  for (bool fused : {true, false}) {
    RunConfig c = p1_config();
    c.trainer.optimizer().flat(fused);
    c.set("attention-kernel", fused ? "automatic" : "plain");
    train::Trainer t = make_trainer(c);
    auto s = time_per_call([&] { t.train_step(); }, quick ? 2 : 50, quick ? 2 : 9, quick ? 5 : 100);
    emit(named(fused ? "p1" : "p1_plain"), "train_steps_per_s", "steps/s", 1.0, s, describe(c));
    std::filesystem::remove_all(c.trainer.out_dir());
  }
}

/// P1 with the fused path under each matrix-product backend and each instruction set of
/// tinylm's loops (the model's KernelPolicy, the loops' CpuIsa), rounds alternating.
void bench_p1_kernels(bool quick) {
  struct Setting {
    std::string name;
    nn::GemmBackend gemm;
    nn::CpuIsa isa;
  };
  std::vector<Setting> settings;
  for (auto b : {nn::GemmBackend::libxsmm, nn::GemmBackend::blas, nn::GemmBackend::hand})
    if (nn::gemm_backend_available(b)) settings.push_back({std::string("gemm_") + nn::to_string(b), b, nn::CpuIsa::automatic});
  for (auto i : {nn::CpuIsa::generic, nn::CpuIsa::avx2, nn::CpuIsa::avx512})
    if (nn::cpu_isa_available(i)) settings.push_back({std::string("loops_") + nn::to_string(i), nn::GemmBackend::automatic, i});
  const int rounds = quick ? 1 : 3;
  std::map<std::string, std::vector<double>> seconds;
  RunConfig c = p1_config();
  for (int round = 0; round < rounds; ++round) {
    for (const auto& z : settings) {
      nn::set_cpu_isa(z.isa);
      train::Trainer t = make_trainer(c);
      nn::KernelPolicy policy;
      policy.gemm = z.gemm;  // the model's products through this backend
      t.model()->set_kernel_policy(policy);
      seconds[z.name].push_back(time_per_call([&] { t.train_step(); }, quick ? 2 : 30, quick ? 2 : 5, quick ? 5 : 100).median);
    }
  }
  nn::set_cpu_isa(nn::CpuIsa::automatic);
  for (auto& [name, v] : seconds) {
    std::sort(v.begin(), v.end());
    Json config = describe(c);
    config["kernels"] = name;
    config["rounds"] = rounds;
    emit_value("p1_" + name, "train_steps_per_s", "steps/s", 1.0 / v[v.size() / 2], config);
  }
  std::filesystem::remove_all(c.trainer.out_dir());
}

/// Where a P1 step's time goes: the loop of Trainer::train_step written out with a clock
/// around each part. forward = the loss (the fused op), backward = loss.backward(),
/// optimizer = the Adam update; other = drawing the batch, zeroing gradients, reading the
/// loss and the loop itself.
void bench_p1_parts(bool quick) {
  RunConfig c = p1_config();
  auto model = build_model(c);
  auto task = make_task(c);
  auto opt = train::make_flat_adam(*model, train::AdamConfig{});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const int64_t warmup = quick ? 5 : 300, steps = quick ? 10 : 3000;
  double forward = 0, backward = 0, optimizer = 0, total = 0;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    auto batch = task->sample(c.trainer.batch_size(), data::Split::train, gen);
    opt->zero_grad();
    const auto t1 = Clock::now();
    auto loss = model->loss(batch.inputs, batch.targets);
    const auto t2 = Clock::now();
    loss.backward();
    const auto t3 = Clock::now();
    volatile double value = loss.item<double>();
    (void)value;
    const auto t4 = Clock::now();
    opt->step(c.trainer.optimizer().lr());
    const auto t5 = Clock::now();
    if (i < warmup) continue;
    auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    forward += sec(t1, t2);
    backward += sec(t2, t3);
    optimizer += sec(t4, t5);
    total += sec(t0, t5);
  }
  Json config = describe(c);
  config["steps"] = steps;
  config["kernels"] = nn::cpu_kernels_description();
  const double other = total - forward - backward - optimizer;
  emit_value("p1_step", "us_per_step", "us", 1e6 * total / steps, config);
  for (auto [name, t] : {std::pair<const char*, double>{"forward", forward}, {"backward", backward},
                         {"optimizer", optimizer}, {"other", other}}) {
    emit_value(std::string("p1_step_") + name, "us_per_step", "us", 1e6 * t / steps, config);
    emit_value(std::string("p1_step_") + name, "share", "fraction of the step", t / total, config);
  }
}

/// Matrix products, each through every candidate: libxsmm (one JIT kernel for a small
/// product, AVX-512 tiles over the intra-op threads for a larger one), BLAS sgemm called
/// directly, tinylm's hand kernel (for each instruction set; small products only), and
/// LibTorch's matmul, in alternating rounds. P1's fused loss (N = 16 x 12 rows, d 32,
/// vocab 64) and P2's linear layers (N = 16 x 128 rows, d 256, MLP 1024), forward and
/// both backward products.
void bench_gemm(bool quick) {
  const int64_t N = 16 * 12, D = 32, V = 64, N2 = 16 * 128, D2 = 256, F2 = 1024;
  struct Product {
    const char* name;
    bool ta, tb;
    int64_t M, Nc, K;
  };
  std::vector<Product> products = {
      {"qkv_forward", false, true, N, 3 * D, D},  {"qkv_grad_input", false, false, N, D, 3 * D},
      {"qkv_grad_weight", true, false, 3 * D, D, N}, {"out_forward", false, true, N, D, D},
      {"out_grad_input", false, false, N, D, D},  {"out_grad_weight", true, false, D, D, N},
      {"head_forward", false, true, N, V, D},     {"head_grad_input", false, false, N, D, V},
      {"head_grad_weight", true, false, V, D, N},
      {"p2_qkv_forward", false, true, N2, 3 * D2, D2}, {"p2_qkv_grad_input", false, false, N2, D2, 3 * D2},
      {"p2_qkv_grad_weight", true, false, 3 * D2, D2, N2}, {"p2_fc_forward", false, true, N2, F2, D2},
      {"p2_proj_forward", false, true, N2, D2, F2}, {"p2_proj_grad_input", false, false, N2, F2, D2},
      {"p2_proj_grad_weight", true, false, D2, F2, N2}};
  if (quick) products.resize(10);
  struct Candidate {
    std::string name;
    nn::GemmBackend backend;
    nn::CpuIsa isa;
  };
  const int rounds = quick ? 1 : 3;
  torch::manual_seed(0);
  for (const auto& p : products) {
    const double flops = 2.0 * p.M * p.Nc * p.K;
    const bool small = flops <= nn::KernelPolicy{}.small_gemm_flops;
    std::vector<Candidate> candidates;
    if (nn::gemm_backend_available(nn::GemmBackend::libxsmm))
      candidates.push_back({"libxsmm", nn::GemmBackend::libxsmm, nn::CpuIsa::automatic});
    candidates.push_back({"blas", nn::GemmBackend::blas, nn::CpuIsa::automatic});
    for (auto i : {nn::CpuIsa::avx512, nn::CpuIsa::avx2, nn::CpuIsa::generic})
      if (small && nn::cpu_isa_available(i))
        candidates.push_back({std::string("hand_") + nn::to_string(i), nn::GemmBackend::hand, i});
    candidates.push_back({"libtorch", nn::GemmBackend::automatic, nn::CpuIsa::automatic});
    // Operands as stored: A is M x K (K x M when transposed), B K x N (N x K).
    auto a = p.ta ? torch::randn({p.K, p.M}) : torch::randn({p.M, p.K});
    auto b = p.tb ? torch::randn({p.Nc, p.K}) : torch::randn({p.K, p.Nc});
    auto out = torch::empty({p.M, p.Nc});
    const auto lhs = p.ta ? a.t() : a, rhs = p.tb ? b.t() : b;
    const auto expected = torch::mm(lhs, rhs);
    // About 0.1 s of work per timing, whatever the size.
    const int inner = static_cast<int>(std::clamp(1e9 / flops, 1.0, 500.0));
    std::map<std::string, std::vector<double>> us;
    for (int round = 0; round < rounds; ++round) {
      for (const auto& cand : candidates) {
        std::function<void()> call;
        if (cand.name == "libtorch") {
          call = [&] { torch::mm_out(out, lhs, rhs); };
        } else {
          nn::set_cpu_isa(cand.isa);
          call = [&] {
            nn::gemm(p.ta, p.tb, p.M, p.Nc, p.K, a.data_ptr<float>(), a.size(1), b.data_ptr<float>(),
                     b.size(1), out.data_ptr<float>(), p.Nc, false, cand.backend);
          };
        }
        // BLAS at its own best: its pool at the bench's thread count (set_cpu_threads may
        // hold it to one where libxsmm's tiles take the large products).
        if (cand.backend == nn::GemmBackend::blas || cand.name == "libtorch") set_blas_threads(g_threads);
        us[cand.name].push_back(1e6 * time_per_call(call, quick ? 1 : std::max(2, inner / 2), quick ? 2 : 7,
                                                    quick ? 2 : inner).median);
        set_cpu_threads(g_threads);
        // Relative to the operands' scale: K products of unit normals sum to ~sqrt(K).
        const double tol = 1e-5 * std::sqrt(static_cast<double>(p.K)) * 10;
        TORCH_CHECK(torch::allclose(out, expected, tol, tol), "bench gemm: ", cand.name, " computed ",
                    p.name, " wrong");
        nn::set_cpu_isa(nn::CpuIsa::automatic);
      }
    }
    Json config = {{"product", p.name}, {"M", p.M}, {"N", p.Nc}, {"K", p.K},
                   {"trans_a", p.ta}, {"trans_b", p.tb}, {"rounds", rounds},
                   {"automatic", nn::to_string(nn::KernelPolicy{}.gemm_backend(p.M, p.Nc, p.K))}};
    for (auto& [name, v] : us) {
      std::sort(v.begin(), v.end());
      Json cfg = config;
      cfg["candidate"] = name;
      cfg["gflops"] = rounded(flops / v[v.size() / 2] / 1e3);
      emit_value("gemm_" + std::string(p.name), "us_per_call", "us", v[v.size() / 2], cfg);
    }
  }
}

/// Training steps timed as time_per_call times them, and the time the step's bfloat16
/// products took inside the timed steps (kernel_counts), per step: the warmup steps, which
/// make the products' kernels, are not counted.
struct StepTimes {
  Stats stats;
  double bf16_products_seconds = 0;
};

StepTimes time_train_steps(train::Trainer& t, int warmup, int reps, int inner) {
  for (int i = 0; i < warmup; ++i) t.train_step();
  const auto before = nn::kernel_counts();
  const Stats s = time_per_call([&] { t.train_step(); }, 0, reps, inner);
  return {s, (nn::kernel_counts() - before).gemm_bf16_seconds / static_cast<double>(reps * inner)};
}

/// With --bf16: one step's linear products alone (each layer's and the head's x Wᵀ, dy W and
/// dyᵀ x, as nn::linear's backward runs them, on operands rounded beforehand), timed shape
/// by shape and summed: the least a step could take on these kernels were everything else
/// free, printed as `<case>_bf16 products_ms` with its share of the measured step; and the
/// time the products took inside the timed steps, `products_in_step_ms` (the same products
/// on operands as the step leaves them: the step less it is the time outside the products).
void emit_bf16_products(const std::string& name, const RunConfig& c, const StepTimes& timed, bool quick) {
  const double seconds_per_step = timed.stats.median;
  if (!g_bf16 || !nn::bf16_products_missing().empty()) return;
  const int64_t M = c.task_options.seq_len() * c.trainer.batch_size();
  double seconds = 0;
  for (const auto& z : linear_shapes(c)) {
    auto bf16 = [](int64_t rows, int64_t cols) {
      std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
      const auto x = torch::randn({rows, cols});
      nn::round_to_bf16(x.data_ptr<float>(), out.data(), x.numel());
      return out;
    };
    const auto x = bf16(M, z.K), w = bf16(z.N, z.K), dy = bf16(M, z.N);
    std::vector<float> y(static_cast<size_t>(M * z.N)), dx(static_cast<size_t>(M * z.K)),
        dw(static_cast<size_t>(z.N * z.K));
    const int64_t N = z.N, K = z.K;
    const auto s = time_per_call([&] {
      nn::gemm_bf16(false, true, M, N, K, x.data(), K, w.data(), K, y.data(), N, false);      // y = x Wᵀ
      nn::gemm_bf16(false, false, M, K, N, dy.data(), N, w.data(), K, dx.data(), K, false);   // dx = dy W
      nn::gemm_bf16(true, false, N, K, M, dy.data(), N, x.data(), K, dw.data(), K, false);    // dW = dyᵀ x
    }, quick ? 1 : 2, quick ? 2 : 5, 1);
    seconds += static_cast<double>(z.count * c.trainer.grad_accum()) * s.median;
  }
  Json config = describe(c);
  config["share_of_step"] = seconds / seconds_per_step;
  config["of"] = "the step's linear products alone, operands already bfloat16, shape by shape at M = " +
                 std::to_string(M) + ": the least a step could take on these kernels";
  config["kernels"] = nn::bf16_products_description();
  emit_value(name, "products_ms", "ms", 1e3 * seconds, config);
  config["share_of_step"] = timed.bf16_products_seconds / seconds_per_step;
  config["of"] = "the time inside the step's bfloat16 products while the timed steps ran, per step: "
                 "products_ms's products on operands as the step leaves them";
  emit_value(name, "products_in_step_ms", "ms", 1e3 * timed.bf16_products_seconds, config);
}

/// A training step's model FLOP/s and its fraction of the matmul peak: float32's, or in a
/// --bf16 run the bfloat16 peak.
void emit_mfu(const std::string& name, const RunConfig& c, double seconds_per_step, double float32_peak) {
  const double gflops = train_flops_per_step(c) / seconds_per_step / 1e9;
  emit_value(name, "model_gflops", "GFLOP/s", gflops, describe(c));
  if (g_bf16 && g_bf16_peak > 0)
    emit_value(name, "mfu", "fraction of the bfloat16 matmul peak", gflops / g_bf16_peak, describe(c));
  else
    emit_value(name, "mfu", "fraction of matmul peak", gflops / float32_peak, describe(c));
}

void bench_p2(bool quick, double peak_gflops, int64_t memory_steps) {
  RunConfig c = p2_config(quick);
  train::Trainer t = make_trainer(c);
  const StepTimes timed = time_train_steps(t, quick ? 1 : 3, quick ? 2 : 5, quick ? 1 : 3);
  const Stats& s = timed.stats;
  const double tokens = static_cast<double>(c.trainer.batch_size() * c.task_options.seq_len());
  const std::string name = named("p2");
  emit(name, "train_tokens_per_s", "tokens/s", tokens, s, describe(c));
  emit_mfu(name, c, s.median, peak_gflops);
  emit_bf16_products(name, c, timed, quick);
  emit_value(name, "peak_rss", "MiB", peak_rss_mib(), describe(c));
  if (memory_steps > 0) {
    const double before = current_rss_mib();
    for (int64_t i = 0; i < memory_steps; ++i) t.train_step();
    const double after = current_rss_mib();
    emit_value(name, "rss_growth_over_" + std::to_string(memory_steps) + "_steps", "MiB",
               after - before, describe(c));
  }
  std::filesystem::remove_all(c.trainer.out_dir());
}

/// An op family's five largest ops, [name, ms per repetition] (seconds over `reps`).
Json top_ops_ms(const std::map<std::string, double>& seconds_by_op, int64_t reps) {
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [op, t] : seconds_by_op) ops.push_back({t, op});
  std::sort(ops.rbegin(), ops.rend());
  Json top = Json::array();
  for (size_t i = 0; i < std::min<size_t>(5, ops.size()); ++i)
    top.push_back({ops[i].second, rounded(1e3 * ops[i].first / static_cast<double>(reps))});
  return top;
}

/// Where a training step's time goes: each op family's share of the wall time of `steps`
/// training steps (self time of the ops, see op_profile.h), printed as `<name>_ops_<family>`;
/// "untimed" is the rest (the step's own code between ops).
void bench_ops(const std::string& name, const RunConfig& c, bool quick) {
  train::Trainer t = make_trainer(c);
  for (int i = 0; i < 2; ++i) t.train_step();
  const int64_t steps = quick ? 2 : 10;
  std::map<std::string, double> seconds;
  std::map<std::string, std::map<std::string, double>> by_op;
  double wall = 0;
  {
    cli::OpProfile profile;
    const auto start = Clock::now();
    for (int64_t i = 0; i < steps; ++i) t.train_step();
    wall = std::chrono::duration<double>(Clock::now() - start).count();
    seconds = profile.seconds();
    by_op = profile.seconds_by_op();
  }
  Json config = describe(c);
  config["steps"] = steps;
  config["kernels"] = nn::cpu_kernels_description();
  double timed = 0;
  for (const auto& [family, s] : seconds) {
    timed += s;
    Json cfg = config;
    cfg["ms_per_step"] = rounded(1e3 * s / steps);
    cfg["top_ops_ms"] = top_ops_ms(by_op[family], steps);  // the family's five largest, ms per step
    emit_value(named(name) + "_ops_" + family, "share", "fraction of the step", s / wall, cfg);
  }
  Json cfg = config;
  cfg["ms_per_step"] = rounded(1e3 * std::max(0.0, wall - timed) / steps);
  emit_value(named(name) + "_ops_untimed", "share", "fraction of the step", std::max(0.0, wall - timed) / wall, cfg);
  std::filesystem::remove_all(c.trainer.out_dir());
}

/// nanoGPT's CPU recipe (its README's settings for a machine without a GPU): 4 layers, 4
/// heads, width 128, block 64, batch 12, no biases (Linear or LayerNorm), exact GELU,
/// learned positions, tied head, AdamW (lr 1e-3, beta2 0.99, decay 0.1 on every 2-D
/// parameter), clip 1.0, on byte-level text (the GPL,
/// as configs/text-small.toml). scripts/bench_pytorch.py runs the same in PyTorch.
RunConfig nanogpt_config() {
  RunConfig c = transformer_config("text", 256, 128, 4, 4);
  c.task_options.data("/usr/share/common-licenses/GPL-3");
  c.task_options.seq_len(64);
  c.trainer.batch_size(12);
  c.set("bias", false);
  c.set("layer-norm-bias", false);
  c.set("activation", "gelu");
  c.set("positions", "learned");
  c.set("tie-weights", true);
  c.trainer.optimizer().lr(1e-3);
  c.trainer.optimizer().weight_decay(0.1);
  c.set("decay-params", "matrices");
  c.set("beta2", 0.99);
  c.set("grad-clip", 1.0);
  c.trainer.out_dir(scratch_dir());
  return c;
}

/// Milliseconds per training iteration of nanoGPT's CPU recipe.
void bench_nanogpt(bool quick, double peak_gflops) {
  RunConfig c = nanogpt_config();
  if (!std::filesystem::exists(c.task_options.data())) {
    print_line({{"case", named("nanogpt")}, {"skipped", c.task_options.data() + " is missing (Debian's base-files has it)"}});
    return;
  }
  train::Trainer t = make_trainer(c);
  const StepTimes timed = time_train_steps(t, quick ? 1 : 10, quick ? 2 : 7, quick ? 2 : 20);
  const Stats& s = timed.stats;
  Json config = describe(c);
  config["recipe"] = "nanoGPT CPU (README): no biases (Linear or LayerNorm), exact GELU, learned positions, tied head, AdamW decaying 2-D parameters, clip 1.0";
  print_line({{"case", named("nanogpt")}, {"metric", "ms_per_iter"}, {"value", rounded(1e3 * s.median)}, {"unit", "ms"},
              {"min", rounded(1e3 * s.min)}, {"max", rounded(1e3 * s.max)}, {"reps", s.reps},
              {"threads", at::get_num_threads()}, {"config", config}});
  emit_mfu(named("nanogpt"), c, s.median, peak_gflops);
  emit_bf16_products(named("nanogpt"), c, timed, quick);
  std::filesystem::remove_all(c.trainer.out_dir());
  bench_ops("nanogpt", nanogpt_config(), quick);
}

/// A GPT-2-small-shaped model (issue 40): 12 blocks of width 768, 12 heads, on nanoGPT's
/// recipe otherwise (byte vocabulary, the GPL), sequences of 256, batches of 4. Quick: one
/// block of width 96 on sequences of 32 (a smoke run).
RunConfig gpt2_config(bool quick) {
  RunConfig c = nanogpt_config();
  c.set("n-layers", quick ? 1 : 12);
  c.set("d-model", quick ? 96 : 768);
  c.set("n-heads", quick ? 4 : 12);
  c.task_options.seq_len(quick ? 32 : 256);
  c.trainer.batch_size(quick ? 2 : 4);
  return c;
}

void bench_gpt2(bool quick, double peak_gflops) {
  RunConfig c = gpt2_config(quick);
  if (!std::filesystem::exists(c.task_options.data())) {
    print_line({{"case", named("gpt2")}, {"skipped", c.task_options.data() + " is missing (Debian's base-files has it)"}});
    return;
  }
  train::Trainer t = make_trainer(c);
  const StepTimes timed = time_train_steps(t, 1, quick ? 2 : 3, 1);
  const Stats& s = timed.stats;
  const double tokens = static_cast<double>(c.trainer.batch_size() * c.task_options.seq_len());
  emit(named("gpt2"), "train_tokens_per_s", "tokens/s", tokens, s, describe(c));
  emit_mfu(named("gpt2"), c, s.median, peak_gflops);
  emit_bf16_products(named("gpt2"), c, timed, quick);
  std::filesystem::remove_all(c.trainer.out_dir());
  if (!quick) bench_ops("gpt2", gpt2_config(quick), quick);  // 12 more steps: not in a smoke run
}

void bench_p3(bool quick) {
  const int64_t C = 256, prompt_len = 16, new_tokens = quick ? 16 : C - prompt_len;
  torch::manual_seed(0);
  nn::TransformerLM model(nn::TransformerLMOptions(256, C, 256, 8, quick ? 1 : 4));
  model->eval();
  auto prompt = torch::randint(256, {1, prompt_len}, torch::kLong);
  const Json config = {{"model", "transformer"}, {"context", 256}, {"d_model", 256}, {"heads", 8},
                       {"layers", quick ? 1 : 4}, {"prompt", 16}, {"new_tokens", new_tokens}};
  torch::Tensor outputs[2];
  Stats stats[2];
  for (int cached = 1; cached >= 0; --cached) {
    GenerateOptions o;
    o.max_new_tokens = new_tokens;
    o.seed = 1;
    o.use_kv_cache = cached;
    stats[cached] = time_per_call([&] { outputs[cached] = generate(*model, prompt, o); }, 1, quick ? 1 : 3, 1);
    emit(cached ? "p3_kv_cache" : "p3_recompute", "generate_tokens_per_s", "tokens/s",
         static_cast<double>(new_tokens), stats[cached], config);
  }
  emit_value("p3", "kv_cache_speedup", "x", stats[0].median / stats[1].median, config);
  emit_value("p3", "identical_tokens", "bool", torch::equal(outputs[0], outputs[1]) ? 1 : 0, config);
}

/// Continuous batching (BatchDecoder): tokens/s of S sequences decoded together against
/// generate()'s single stream (what `tinylm sample` runs), on the reference model's shape
/// (context 12: most of 32 tokens past the context, windows read together) and P2's.
void bench_decode(bool quick) {
  struct Shape {
    const char* name;
    nn::LanguageModel model;
  };
  torch::manual_seed(0);
  std::vector<Shape> shapes = {
      {"reference", nn::LanguageModel(nn::TinyAttentionLM(nn::TinyAttentionLMOptions(64, 12, 32, 4)).ptr())},
      {"p2", nn::LanguageModel(nn::TransformerLM(nn::TransformerLMOptions(256, 128, 256, 8, quick ? 1 : 4)).ptr())}};
  const int64_t new_tokens = quick ? 8 : 32;
  for (auto& shape : shapes) {  // (no structured binding: lambdas below capture these)
    const char* name = shape.name;
    nn::LanguageModel& model = shape.model;
    model->eval();
    const Json config = {{"model", model->architecture().kind}, {"shape", name}, {"context", model->context_length()},
                         {"prompt", 4}, {"new_tokens", new_tokens}};
    GenerateOptions o;
    o.max_new_tokens = new_tokens;
    o.seed = 1;
    const auto prompt = torch::randint(model->vocab_size(), {1, 4}, torch::kLong);
    // Calls of a few milliseconds (the reference shape) repeated within each timing.
    const int inner = quick || std::string(name) == "p2" ? 1 : 10, reps = quick ? 1 : 9;
    const auto single = time_per_call([&] { generate(*model, prompt, o); }, 1, reps, inner);
    emit(std::string("decode_") + name + "_single", "generate_tokens_per_s", "tokens/s", static_cast<double>(new_tokens),
         single, config);
    const std::vector<int64_t> ids(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + 4);
    for (int64_t S : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      const auto batched = time_per_call(
          [&] {
            BatchDecoder d(*model, BatchDecoderOptions{S, 64});
            for (int64_t s = 0; s < S; ++s) d.add(ids, o);
            while (!d.idle()) d.step();
          },
          1, reps, S == 64 ? 1 : inner);
      const std::string c = std::string("decode_") + name + "_batch_" + std::to_string(S);
      emit(c, "decode_tokens_per_s", "tokens/s", static_cast<double>(S * new_tokens), batched, config);
      emit_value(c, "over_single_stream", "x", S * single.median / batched.median, config);
    }
    // Where the widest batch's time goes, by op family (as bench_ops does for training).
    double wall = 0;
    std::map<std::string, double> seconds;
    std::map<std::string, std::map<std::string, double>> by_op;
    {
      BatchDecoder d(*model, BatchDecoderOptions{64, 64});
      for (int64_t s = 0; s < 64; ++s) d.add(ids, o);
      cli::OpProfile profile;
      const auto start = Clock::now();
      while (!d.idle()) d.step();
      wall = std::chrono::duration<double>(Clock::now() - start).count();
      seconds = profile.seconds();
      by_op = profile.seconds_by_op();
    }
    for (const auto& [family, s] : seconds) {
      Json cfg = config;
      cfg["top_ops_ms"] = top_ops_ms(by_op[family], 1);
      emit_value(std::string("decode_") + name + "_batch_64_ops_" + family, "share", "fraction of the decode", s / wall,
                 cfg);
    }
  }
}

void bench_attention(bool quick) {
  struct Size { int64_t B, T, D, H; };
  std::vector<Size> sizes = {{16, 12, 32, 4}, {16, 64, 128, 4}, {16, 128, 256, 8}, {8, 256, 256, 8}};
  if (g_bf16) sizes = {{12, 64, 128, 4}, {16, 128, 256, 8}, {4, 256, 768, 12}};  // nanoGPT's, P2's, GPT-2's
  if (quick) sizes = {g_bf16 ? Size{2, 16, 32, 2} : Size{2, 12, 32, 4}};  // bfloat16's: T, Dh multiples of 16
  struct Kernel {
    nn::AttentionKernel kernel;
    const char* name;
    int64_t blas_from;  // the fused kernel's T x T products through BLAS from this length
    bool bf16 = false, bf16_attention = false;  // the policy's bf16_products and bf16_attention
  };
  const int64_t policy_blas_from = nn::KernelPolicy{}.attention_blas_min_seq_len;
  std::vector<Kernel> kernels = {{nn::AttentionKernel::plain, "manual", policy_blas_from},
                                 {nn::AttentionKernel::fused, "fused", policy_blas_from},
                                 {nn::AttentionKernel::fused, "fused_loops", INT64_MAX},
                                 {nn::AttentionKernel::fused, "fused_blas", 1}};
  if (nn::sdpa_available()) kernels.push_back({nn::AttentionKernel::sdpa, "sdpa", policy_blas_from});
  // --bf16: the fused kernel with bfloat16 projections (bf16_products), its T x T products
  // in float32 (bf16_attention false: "bf16_linears") and in bfloat16 ("bf16"), at the
  // training cases' sizes; the ratio is attention_bf16_vs_bf16_linears.
  if (g_bf16)
    kernels = {{nn::AttentionKernel::fused, "bf16_linears", policy_blas_from, true, false},
               {nn::AttentionKernel::fused, "bf16", policy_blas_from, true, true}};
  const std::string base = g_bf16 ? "bf16_linears" : "fused";
  for (const auto& z : sizes) {
    const Json size = {{"B", z.B}, {"T", z.T}, {"D", z.D}, {"H", z.H}};
    std::map<std::string, double> median;
    // Rounds alternate the kernels, so a noisy machine slows all of them alike (five for
    // --bf16's pair, whose difference is smaller).
    const int rounds = quick ? 1 : (g_bf16 ? 5 : 3);
    for (int round = 0; round < rounds; ++round) {
      for (const auto& k : kernels) {
        torch::manual_seed(0);
        nn::KernelPolicy policy;
        policy.attention_blas_min_seq_len = k.blas_from;
        policy.bf16_products = k.bf16;
        policy.bf16_attention = k.bf16_attention;
        nn::MultiHeadSelfAttention attn(
            nn::MultiHeadSelfAttentionOptions(z.D, z.H, z.T).kernel(k.kernel).kernel_policy(std::make_shared<const nn::KernelPolicy>(policy)));
        auto x = torch::randn({z.B, z.T, z.D}, torch::requires_grad());
        auto upstream = torch::randn({z.B, z.T, z.D});  // a dense gradient, as training has
        const int inner = z.T <= 16 ? 200 : (z.T <= 64 ? 20 : 5);
        auto s = time_per_call([&] {
          attn->zero_grad();
          attn(x).output.backward(upstream);
        }, quick ? 1 : 3, quick ? 2 : 5, quick ? 2 : inner);
        median[k.name] += s.median / rounds;
        if (round == rounds - 1) {
          Stats mean = s;
          mean.median = median[k.name];
          Json config = size;
          config["path"] = k.name;
          config["blas_from_seq_len"] = k.blas_from == INT64_MAX ? -1 : k.blas_from;
          if (g_bf16) config["t_by_t_products"] = k.bf16_attention ? "bfloat16" : "float32";
          emit(std::string("attention_") + k.name, "fwd_bwd_per_s", "calls/s", 1.0, mean, config);
        }
      }
    }
    for (const auto& k : kernels) {
      if (k.name == base) continue;
      if (g_bf16)  // how much faster bfloat16 T x T products make the whole call
        emit_value(std::string("attention_") + k.name + "_vs_" + base, "speedup", "x", median[base] / median[k.name],
                   size);
      else
        emit_value("attention_fused_vs_" + std::string(k.name), "speedup", "x", median[k.name] / median["fused"], size);
    }
  }
}

// ---- today's architectures against their classic counterparts -------------------------

/// What each of rotary positions, RMSNorm, SwiGLU and grouped-query attention costs against
/// the piece it replaces, forward and backward at P2's size (B 16, T 128, D 256, H 8), in
/// alternating rounds: the attention without and with rotation, and with 2 key/value
/// heads; LayerNorm against RMSNorm; the GELU MLP (4 x 256) against SwiGLU of the same
/// parameter count (hidden 680); a whole P2 step, GPT-style against LLaMA-style.
void bench_architectures(bool quick) {
  const int64_t B = quick ? 2 : 16, T = quick ? 16 : 128, D = 256, H = 8;
  const auto share = std::make_shared<const nn::KernelPolicy>();
  auto attention = [&](double rotary_base, int64_t kv_heads) {
    return nn::MultiHeadSelfAttention(nn::MultiHeadSelfAttentionOptions(D, H, T).rotary_base(rotary_base).n_kv_heads(kv_heads).kernel_policy(share));
  };
  auto mlp = [&](nn::Activation a, int64_t hidden) {
    return nn::FeedForward(nn::FeedForwardOptions(D).activation(a).hidden(hidden).kernel_policy(share));
  };
  auto norm = [&](nn::NormKind kind) {
    return nn::LayerNorm(nn::LayerNormOptions(D).kind(kind).bias(kind == nn::NormKind::layer_norm).kernel_policy(share));
  };
  struct Piece {
    std::string name, classic;  // classic: "" for a classic piece itself
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    torch::nn::Module* module;
  };
  auto a_plain = attention(0, 0), a_rotary = attention(10000, 0), a_grouped = attention(0, 2);
  auto m_gelu = mlp(nn::Activation::gelu_tanh, 0), m_swiglu = mlp(nn::Activation::swiglu, 680);
  auto n_layer = norm(nn::NormKind::layer_norm), n_rms = norm(nn::NormKind::rms_norm);
  std::vector<Piece> pieces = {
      {"attention", "", [&](const torch::Tensor& x) { return a_plain(x).output; }, a_plain.ptr().get()},
      {"attention_rotary", "attention", [&](const torch::Tensor& x) { return a_rotary(x).output; }, a_rotary.ptr().get()},
      {"attention_gqa2", "attention", [&](const torch::Tensor& x) { return a_grouped(x).output; }, a_grouped.ptr().get()},
      {"mlp_gelu", "", [&](const torch::Tensor& x) { return m_gelu(x); }, m_gelu.ptr().get()},
      {"mlp_swiglu", "mlp_gelu", [&](const torch::Tensor& x) { return m_swiglu(x); }, m_swiglu.ptr().get()},
      {"layer_norm", "", [&](const torch::Tensor& x) { return n_layer(x); }, n_layer.ptr().get()},
      {"rms_norm", "layer_norm", [&](const torch::Tensor& x) { return n_rms(x); }, n_rms.ptr().get()}};
  torch::manual_seed(0);
  auto x = torch::randn({B, T, D}, torch::requires_grad()), upstream = torch::randn({B, T, D});
  std::map<std::string, double> seconds;
  const int rounds = quick ? 1 : 3;
  const Json size = {{"B", B}, {"T", T}, {"D", D}, {"H", H}};
  for (int round = 0; round < rounds; ++round)
    for (const auto& p : pieces) {
      auto s = time_per_call([&] {
        p.module->zero_grad();
        p.forward(x).backward(upstream);
      }, quick ? 1 : 3, quick ? 2 : 5, quick ? 1 : 10);
      seconds[p.name] += s.median / rounds;
      if (round == rounds - 1) {
        s.median = seconds[p.name];
        emit("arch_" + p.name, "fwd_bwd_per_s", "calls/s", 1.0, s, size);
      }
    }
  for (const auto& p : pieces)
    if (!p.classic.empty())
      emit_value("arch_" + p.name + "_vs_" + p.classic, "time_ratio", "x", seconds[p.name] / seconds[p.classic], size);

  // Whole P2 steps (one optimizer step included), GPT-style and LLaMA-style, alternating.
  RunConfig gpt = p2_config(quick), llama = p2_config(quick);
  llama.set("positions", "rotary");
  llama.set("norm", "rms-norm");
  llama.set("layer-norm-bias", false);
  llama.set("bias", false);
  llama.set("activation", "swiglu");
  llama.set("mlp-hidden", int64_t{quick ? 16 : 680});
  llama.set("n-kv-heads", int64_t{2});
  std::map<std::string, double> step;
  for (int round = 0; round < rounds; ++round)
    for (auto* c : {&gpt, &llama}) {
      const std::string name = c == &gpt ? "gpt_style" : "llama_style";
      auto model = build_model(*c);
      auto task = make_task(*c);
      auto opt = train::make_flat_adam(*model, train::AdamConfig{});
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
      auto s = time_per_call([&] {
        auto batch = task->sample(c->trainer.batch_size(), data::Split::train, gen);
        opt->zero_grad();
        model->loss(batch.inputs, batch.targets).backward();
        opt->step(1e-3);
      }, quick ? 1 : 2, quick ? 2 : 5, 1);
      step[name] += s.median / rounds;
      if (round == rounds - 1) {
        s.median = step[name];
        Json config = describe(*c);
        config["parameters"] = nn::count_parameters(*model);
        emit("arch_p2_" + name, "steps_per_s", "steps/s", 1.0, s, config);
      }
    }
  emit_value("arch_p2_llama_style_vs_gpt_style", "time_ratio", "x", step["llama_style"] / step["gpt_style"], size);
}

// ---- data-parallel: P2 in 2 processes x 1 thread vs 1 process ------------------------

/// Steps timed per round of the data-parallel case, after 2 warm-up steps.
int64_t dp_steps(bool quick) { return quick ? 2 : 12; }

RunConfig dp_config(bool quick) {
  return p2_config(quick);  // timing only: train_step writes no files
}

/// CPU seconds this process has used so far (every thread, user and system).
double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// The threads this process really runs: LibTorch's intra-op threads, OpenBLAS's (0 where
/// the BLAS is not OpenBLAS), the OS threads in all, and the CPUs it may run on.
Json thread_report() {
  int64_t os_threads = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task")) ++os_threads;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int cpus = ::sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  return {{"intra_op_threads", at::get_num_threads()}, {"blas_threads", blas_threads()},
          {"os_threads", os_threads}, {"cpus_allowed", cpus}};
}

/// One rank of the data-parallel case (`tinylm bench-worker dp`, started by
/// bench_dp with torchrun's variables): each rank prints, as one JSON line, its threads
/// (thread_report) and the share of a core it used while it trained; rank 0 adds its step
/// time and the time spent in the gradient all-reduce.
void bench_dp_worker(bool quick) {
  auto dist = train::distributed_from_environment();
  TORCH_CHECK(dist, "bench-worker dp is started by the dp case, with WORLD_SIZE and RANK set");
  auto group = train::ProcessGroup::connect(*dist);
  const RunConfig c = dp_config(quick);
  train::Trainer t = make_trainer(c, group);
  for (int i = 0; i < 2; ++i) t.train_step();
  const double comm_before = t.communication_seconds(), cpu_before = process_cpu_seconds();
  const auto start = Clock::now();
  for (int64_t i = 0; i < dp_steps(quick); ++i) t.train_step();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  Json line = thread_report();
  line["rank"] = group->rank();
  line["cpu_use"] = rounded((process_cpu_seconds() - cpu_before) / seconds);
  if (group->rank() == 0) {
    std::filesystem::remove_all(c.trainer.out_dir());
    line["step_seconds"] = seconds / dp_steps(quick);
    line["allreduce_seconds"] = (t.communication_seconds() - comm_before) / dp_steps(quick);
  }
  print_line(line);
}

/// Runs `tinylm bench-worker dp` as `world` ranks on a loopback port, each started as
/// `train --nproc` starts its workers (--threads 1); returns their lines, by rank.
std::vector<Json> run_dp_job(int64_t world, bool quick) {
  const int64_t port = train::free_loopback_port();
  int out[2];
  TORCH_CHECK(::pipe(out) == 0, "bench dp: cannot open a pipe");
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < world; ++rank) {
    cli::SpawnOptions worker;
    worker.args = {"tinylm", "bench-worker", "dp", "--threads", "1"};
    if (quick) worker.args.push_back("--quick");
    worker.env = {{"WORLD_SIZE", std::to_string(world)}, {"RANK", std::to_string(rank)},
                  {"LOCAL_RANK", std::to_string(rank)},  {"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", std::to_string(port)}};
    worker.stdout_fd = out[1];
    worker.close_fds = {out[0], out[1]};
    pids.push_back(cli::spawn_self(worker));
  }
  ::close(out[1]);
  const std::string text = cli::read_all(out[0]);
  ::close(out[0]);
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && cli::exit_code(status) == 0;
  }
  TORCH_CHECK(ok, "bench dp: a worker of the ", world, "-process job failed");
  std::vector<Json> lines(static_cast<size_t>(world));
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;  // a log line
    Json j = Json::parse(line);
    if (j.contains("rank")) lines.at(j["rank"].get<size_t>()) = j;
  }
  for (const auto& j : lines) TORCH_CHECK(!j.is_null(), "bench dp: a worker of the ", world, "-process job printed no report");
  return lines;
}

/// The share of a core this process burns over `seconds` of doing nothing: threads a
/// pool left spinning (or yielding) after its work.
double idle_cpu_use(double seconds) {
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return (process_cpu_seconds() - before) / seconds;
}

/// P2 tokens/s: one process at 1 thread and at 2 threads (in this process) and two
/// processes at 1 thread each (each rank its own batch of 16, so the job trains twice
/// the tokens per step), alternated over rounds so a noisy machine slows all alike.
void bench_dp(bool quick) {
  RunConfig c = dp_config(quick);
  train::Trainer t = make_trainer(c);
  const double tokens = static_cast<double>(c.trainer.batch_size() * c.task_options.seq_len());
  const int rounds = quick ? 1 : 3;
  std::vector<double> one_1, one_2, two_1, allreduce_ms, share, idle;
  std::vector<Json> workers;
  const int64_t steps = dp_steps(quick);
  for (int round = 0; round < rounds; ++round) {
    for (int64_t threads : {1, 2}) {
      set_cpu_threads(threads);
      auto s = time_per_call([&] { t.train_step(); }, 2, 1, static_cast<int>(steps));
      (threads == 1 ? one_1 : one_2).push_back(tokens / s.median);
    }
    idle.push_back(idle_cpu_use(0.5));  // after steps at 2 threads: nothing may keep spinning
    set_cpu_threads(g_threads);
    workers = run_dp_job(2, quick);
    const Json& job = workers[0];
    const double step = job["step_seconds"].get<double>();
    two_1.push_back(2 * tokens / step);
    allreduce_ms.push_back(1000 * job["allreduce_seconds"].get<double>());
    share.push_back(job["allreduce_seconds"].get<double>() / step);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  Json config = describe(c);
  config["steps_per_round"] = steps;
  config["rounds"] = rounds;
  auto rate_line = [&](const char* name, const std::vector<double>& v, int64_t procs, int64_t threads) {
    Json cfg = config;
    cfg["processes"] = procs;
    cfg["threads_per_process"] = threads;
    print_line({{"case", name}, {"metric", "train_tokens_per_s"}, {"value", rounded(median(v))},
                {"unit", "tokens/s"}, {"min", rounded(*std::min_element(v.begin(), v.end()))},
                {"max", rounded(*std::max_element(v.begin(), v.end()))}, {"reps", rounds},
                {"config", cfg}});
  };
  rate_line("dp_1proc_1thread", one_1, 1, 1);
  rate_line("dp_1proc_2threads", one_2, 1, 2);
  rate_line("dp_2proc_1thread", two_1, 2, 1);
  std::vector<double> vs1, vs2;  // ratios within a round, then their median
  for (int r = 0; r < rounds; ++r) {
    vs1.push_back(two_1[r] / one_1[r]);
    vs2.push_back(two_1[r] / one_2[r]);
  }
  emit_value("dp_2proc_vs_1proc_1thread", "speedup", "x", median(vs1), config);
  emit_value("dp_2proc_vs_1proc_2threads", "speedup", "x", median(vs2), config);
  emit_value("dp_2proc_1thread", "allreduce_ms_per_step", "ms", median(allreduce_ms), config);
  emit_value("dp_2proc_1thread", "allreduce_share_of_step", "fraction", median(share), config);
  // What each worker really ran (the last round's): a worker pinned to one CPU, or running
  // more threads than asked, shows here.
  Json report = config;
  report["cpus_available"] = thread_report()["cpus_allowed"];
  for (auto& w : workers) {
    w.erase("step_seconds");
    w.erase("allreduce_seconds");
  }
  report["workers"] = workers;
  double cpu_use = 0;
  for (const auto& w : workers) cpu_use += w["cpu_use"].get<double>();
  emit_value("dp_2proc_1thread", "worker_cpu_use", "cores", cpu_use / static_cast<double>(workers.size()), report);
  emit_value("dp_1proc_2threads", "idle_cpu_use_after_steps", "cores", median(idle), config);
  int64_t numel = 0;
  for (const auto& p : t.model()->parameters()) numel += p.numel();
  emit_value("dp_2proc_1thread", "allreduce_mib_per_step", "MiB", numel * 4.0 / 1048576.0, config);
  std::filesystem::remove_all(c.trainer.out_dir());
}

// ---- data: prepare throughput, memory-mapped token files ------------------------------

/// Made-up text, deterministic: lines of words drawn from a 5000-word lexicon of
/// syllables with a Zipf-like (log-uniform) frequency, so BPE has real merges to learn.
void write_corpus(const std::string& path, uint64_t bytes) {
  static const char* syllables[] = {"ta", "ke", "ri", "mo", "su", "na", "lo", "pe", "vi", "da", "the", "an",
                                    "or", "in", "er", "st", "ing", "ou", "ea", "ch", "sh", "ly", "ro", "ma",
                                    "ne", "co", "de", "bu", "fi", "ga", "ha", "je", "wo", "ze", "qu", "al"};
  uint64_t x = 88172645463325252ull;
  auto next = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  std::vector<std::string> lexicon(5000);
  for (auto& word : lexicon) {
    const int n = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < n; ++k) word += syllables[next() % 36];
  }
  std::ofstream f(path, std::ios::binary);
  uint64_t written = 0;
  std::string line;
  while (written < bytes) {
    line.clear();
    const int n = 4 + static_cast<int>(next() % 11);
    for (int k = 0; k < n; ++k) {
      const double u = static_cast<double>(next() % 1000000) / 1e6;
      const auto index = static_cast<size_t>(std::pow(5000.0, u)) - 1;
      line += (k ? " " : "") + lexicon[std::min<size_t>(index, 4999)];
    }
    line += next() % 5 == 0 ? ".\n" : ",\n";
    f << line;
    written += line.size();
  }
}

/// A prepared corpus of random ids (no tokenizer): train.bin of `tokens`, val.bin small.
void write_token_dir(const std::string& dir, uint64_t tokens, int64_t vocab) {
  std::filesystem::create_directories(dir);
  const auto header = data::header_for(nullptr, vocab);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  std::vector<int64_t> chunk(1 << 20);
  for (const auto& [name, n] : {std::pair<std::string, uint64_t>{"train.bin", tokens}, {"val.bin", 1u << 20}}) {
    data::TokenFileWriter w(dir + "/" + name, header);
    for (uint64_t done = 0; done < n; done += chunk.size()) {
      chunk.resize(std::min<uint64_t>(chunk.size(), n - done));
      for (auto& id : chunk) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        id = static_cast<int64_t>(x % static_cast<uint64_t>(vocab));
      }
      w.append(chunk, 0);
    }
    w.finish();
    chunk.resize(1 << 20);
  }
}

RunConfig data_config() {
  RunConfig c = transformer_config("tokens", 4096, 64, 4, 2);
  c.trainer.out_dir(scratch_dir() + "-run");
  return c;
}

int64_t data_steps(bool quick) { return quick ? 4 : 300; }

/// `tinylm bench-worker data --data DIR [--in-memory]` (started by the data case): trains
/// on the prepared corpus DIR (mapped, or copied into memory) and prints its step time
/// and peak resident memory.
void bench_data_worker(const std::string& dir, bool in_memory, bool quick) {
  TORCH_CHECK(!dir.empty(), "bench-worker data needs --data DIR (the data case starts it)");
  RunConfig c = data_config();
  c.task_options.data(dir);
  auto task = std::make_shared<data::TokenFileTask>(
      dir, c.task_options.seq_len(), data::TokenFileTaskOptions{in_memory});
  c.set("vocab-size", task->vocab_size());
  train::Trainer t(build_model(c), task, trainer_options(c));
  for (int i = 0; i < 3; ++i) t.train_step();
  const auto start = Clock::now();
  for (int64_t i = 0; i < data_steps(quick); ++i) t.train_step();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // The data path alone: drawing a batch (windows copied out, pages released).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto batch = time_per_call([&] { task->sample(c.trainer.batch_size(), data::Split::train, gen); }, 10, 5,
                                   quick ? 10 : 200);
  // VmHWM, not getrusage: ru_maxrss carries the parent's peak across fork and exec.
  std::ifstream status("/proc/self/status");
  double hwm_mib = 0;
  for (std::string key; status >> key;) {
    if (key == "VmHWM:") {
      status >> hwm_mib;
      hwm_mib /= 1024;
      break;
    }
  }
  print_line({{"step_seconds", seconds / data_steps(quick)}, {"peak_rss_mib", hwm_mib},
              {"batch_seconds", batch.median}});
}

Json run_data_worker(const std::string& dir, bool in_memory, bool quick) {
  cli::SpawnOptions worker;
  worker.args = {"tinylm", "bench-worker", "data", "--data", dir, "--threads", std::to_string(g_threads)};
  if (in_memory) worker.args.push_back("--in-memory");
  if (quick) worker.args.push_back("--quick");
  return Json::parse(cli::run_self(worker, "bench data: the worker on '" + dir + "'"));
}

/// prepare's throughput (bytes and BPE) on generated text; then training on a large and
/// a small generated token file (peak resident memory, each in its own process) and on
/// the large one mapped vs copied into memory (tokens/s, alternated over rounds).
void bench_data(bool quick) {
  const std::string dir = scratch_dir() + "-data";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const uint64_t text_bytes = quick ? (1u << 20) : (32u << 20);
  write_corpus(dir + "/corpus.txt", text_bytes);
  const Json text_config = {{"text_mib", text_bytes >> 20}, {"text", "made-up words, 5000-word Zipf-like lexicon"}};
  for (const std::string tokenizer : {"byte", "bpe"}) {
    std::string why;
    if (tokenizer == "bpe" && !data::sentencepiece_available(&why)) {
      print_line({{"case", "prepare_bpe"}, {"skipped", why}});
      continue;
    }
    data::PrepareOptions o;
    o.inputs = {dir + "/corpus.txt"};
    o.tokenizer = tokenizer;
    o.vocab_size = 4096;
    o.out_dir = dir + "/prepared-" + tokenizer;
    const auto s = data::prepare(o);
    Json cfg = text_config;
    cfg["tokenizer"] = s.tokenizer;
    emit_value("prepare_" + tokenizer, "encode_mb_per_s", "MB/s", text_bytes / 1e6 / s.encode_seconds, cfg);
    if (tokenizer == "bpe") {
      emit_value("prepare_bpe", "tokenizer_training_s", "s", s.tokenizer_seconds, cfg);
      emit_value("prepare_bpe", "total_mb_per_s", "MB/s", text_bytes / 1e6 / (s.tokenizer_seconds + s.encode_seconds), cfg);
    }
  }
  std::filesystem::remove_all(dir + "/prepared-byte");
  std::filesystem::remove_all(dir + "/prepared-bpe");
  std::filesystem::remove(dir + "/corpus.txt");

  const uint64_t big = quick ? (16u << 20) : (512u << 20), small = quick ? (1u << 20) : (5u << 20);  // tokens
  const std::string big_dir = dir + "/big", small_dir = dir + "/small";
  const auto written = Clock::now();
  write_token_dir(big_dir, big, 4096);
  write_token_dir(small_dir, small, 4096);
  const double write_s = std::chrono::duration<double>(Clock::now() - written).count();
  const RunConfig c = data_config();
  Json cfg = describe(c);
  cfg["steps"] = data_steps(quick);
  cfg["big_file_mib"] = (big * 2) >> 20;
  cfg["small_file_mib"] = (small * 2) >> 20;
  emit_value("data_generate", "write_mb_per_s", "MB/s", (big + small) * 2 / 1e6 / write_s, cfg);
  const int rounds = quick ? 1 : 3;
  std::vector<double> mapped_rate, memory_rate, rate_ratio, big_rss, small_rss, memory_rss, mapped_batch,
      memory_batch;
  const double tokens = static_cast<double>(c.trainer.batch_size() * c.task_options.seq_len());
  for (int r = 0; r < rounds; ++r) {
    const Json mapped = run_data_worker(big_dir, false, quick);
    const Json memory = run_data_worker(big_dir, true, quick);
    const Json small_run = run_data_worker(small_dir, false, quick);
    mapped_rate.push_back(tokens / mapped["step_seconds"].get<double>());
    memory_rate.push_back(tokens / memory["step_seconds"].get<double>());
    rate_ratio.push_back(mapped_rate.back() / memory_rate.back());
    big_rss.push_back(mapped["peak_rss_mib"].get<double>());
    memory_rss.push_back(memory["peak_rss_mib"].get<double>());
    small_rss.push_back(small_run["peak_rss_mib"].get<double>());
    mapped_batch.push_back(1e6 * mapped["batch_seconds"].get<double>());
    memory_batch.push_back(1e6 * memory["batch_seconds"].get<double>());
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(c.trainer.out_dir());
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  cfg["rounds"] = rounds;
  emit_value("data_mmap_big", "train_tokens_per_s", "tokens/s", median(mapped_rate), cfg);
  emit_value("data_in_memory_big", "train_tokens_per_s", "tokens/s", median(memory_rate), cfg);
  emit_value("data_mmap_vs_in_memory", "tokens_per_s_ratio", "x", median(rate_ratio), cfg);
  emit_value("data_mmap_big", "batch_us", "us", median(mapped_batch), cfg);
  emit_value("data_in_memory_big", "batch_us", "us", median(memory_batch), cfg);
  for (int r = 0; r < rounds; ++r)
    emit_value("data_mmap_vs_in_memory_round_" + std::to_string(r + 1), "tokens_per_s_ratio", "x", rate_ratio[r], cfg);
  emit_value("data_mmap_big", "peak_rss_mib", "MiB", median(big_rss), cfg);
  emit_value("data_mmap_small", "peak_rss_mib", "MiB", median(small_rss), cfg);
  emit_value("data_in_memory_big", "peak_rss_mib", "MiB", median(memory_rss), cfg);
  emit_value("data_mmap_big_vs_small", "peak_rss_ratio", "x", median(big_rss) / median(small_rss), cfg);
}

}  // namespace

int run_bench(const BenchArgs& a) {
  TORCH_CHECK(a.threads >= 0, "--threads must be >= 0 (0 = LibTorch's default), got ", a.threads);
  set_cpu_threads(a.threads);
  g_threads = a.threads;
  auto wants = [&](const std::string& name) {
    std::string list = "," + a.cases + ",";
    return list.find("," + name + ",") != std::string::npos;
  };
  {
    std::stringstream ss(a.cases);
    for (std::string item; std::getline(ss, item, ',');) {
      TORCH_CHECK(item == "peak" || item == "p1" || item == "p2" || item == "p3" || item == "attention" ||
                      item == "gemm" || item == "dp" || item == "data" || item == "nanogpt" || item == "arch" ||
                      item == "decode" || item == "gpt2",
                  "unknown bench case '", item,
                  "': use peak, p1, p2, p3, attention, gemm, dp, data, nanogpt, gpt2, arch, decode (comma-separated)");
      TORCH_CHECK(!a.bf16 || item == "p1" || item == "p2" || item == "nanogpt" || item == "gpt2" ||
                      item == "attention",
                  "--bf16 trains in bfloat16 (or runs attention's bfloat16 kernel), and case '", item,
                  "' has no bfloat16 form: give --cases from p1, p2, nanogpt, gpt2, attention");
    }
  }
  g_bf16 = a.bf16;
  TORCH_CHECK(!g_bf16 || nn::bf16_products_missing().empty(), "--bf16: bf16 on the CPU needs bfloat16 products, and ",
              nn::bf16_products_missing(), ": run the bench without --bf16");
  // Emulated products (for tests) are not bfloat16 kernels: their figures would be
  // compared as something they are not.
  TORCH_CHECK(!g_bf16 || !nn::bf16_products_emulated(), "--bf16 measures bfloat16 kernels, and TINYLM_BF16_EMULATION=1 "
              "emulates them in float32 (for tests): unset it");
  // The training cases' utilisation needs the peak: measure it whenever one of them runs.
  const double peak =
      (wants("peak") || wants("p2") || wants("nanogpt") || wants("gpt2")) ? matmul_peak(a.quick) : 0.0;
  if (wants("p1")) bench_p1(a.quick);
  if (wants("gemm")) {
    bench_gemm(a.quick);
    bench_p1_kernels(a.quick);
    bench_p1_parts(a.quick);
  }
  if (wants("p2")) {
    bench_p2(a.quick, peak, a.memory_steps);
    bench_ops("p2", p2_config(a.quick), a.quick);
  }
  if (wants("nanogpt")) bench_nanogpt(a.quick, peak);
  if (wants("gpt2")) bench_gpt2(a.quick, peak);
  if (wants("p3")) bench_p3(a.quick);
  if (wants("decode")) bench_decode(a.quick);
  if (wants("attention")) bench_attention(a.quick);
  if (wants("arch")) bench_architectures(a.quick);
  if (wants("dp")) bench_dp(a.quick);
  if (wants("data")) bench_data(a.quick);
  return 0;
}

int run_bench_worker(const BenchWorkerArgs& a) {
  TORCH_CHECK(a.threads >= 0, "--threads must be >= 0 (0 = LibTorch's default), got ", a.threads);
  set_cpu_threads(a.threads);
  g_threads = a.threads;
  if (a.kind == "dp") bench_dp_worker(a.quick);
  else bench_data_worker(a.data, a.in_memory, a.quick);
  return 0;
}
