// oneDNN's matrix products for the bench (onednn_peak.h). Built with oneDNN 2.x (Debian 12)
// or 3.x (Debian 13): their primitive descriptors are made differently.
#include "onednn_peak.h"

#include "tinylm_onednn_config.h"

#include <torch/types.h>

#if defined(TINYLM_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <vector>

namespace tinylm {

#if defined(TINYLM_HAVE_ONEDNN)

std::string onednn_version() {
  const auto* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

namespace {

struct Square {
  dnnl::memory::desc a, b_plain, b_any, c;
};

Square square_product(int64_t n, bool bf16) {
  using dnnl::memory;
  const auto in = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::dims square = {n, n};
  return {memory::desc(square, in, memory::format_tag::ab), memory::desc(square, in, memory::format_tag::ab),
          memory::desc(square, in, memory::format_tag::any),
          memory::desc(square, memory::data_type::f32, memory::format_tag::ab)};
}

dnnl::matmul::primitive_desc describe(const dnnl::engine& eng, const Square& q) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(eng, q.a, q.b_any, q.c);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(q.a, q.b_any, q.c), eng);
#endif
}

}  // namespace

std::string onednn_missing(bool bf16) {
  try {
    describe(dnnl::engine(dnnl::engine::kind::cpu, 0), square_product(64, bf16));
    return "";
  } catch (const dnnl::error& e) {  // oneDNN has no kernel for this data type on this CPU
    return "oneDNN " + onednn_version() + " has no " + (bf16 ? "bfloat16" : "float32") +
           " matmul for this CPU (" + e.what() + ")";
  }
}

OnednnProduct onednn_matmul(int64_t n, bool bf16, int reps) {
  using namespace dnnl;
  TORCH_CHECK(n >= 1 && reps >= 1, "onednn_matmul: n and reps must be >= 1, got ", n, " and ", reps);
  TORCH_CHECK(onednn_missing(bf16).empty(), "onednn_matmul: ", onednn_missing(bf16));
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const Square q = square_product(n, bf16);
  const auto pd = describe(eng, q);
  const memory::desc &a = q.a, &b_plain = q.b_plain, &c = q.c;
  // The weights in the layout oneDNN wants (packed once, as a layer's weights would be).
  // Zeros: a product's time does not depend on its values.
  memory ma(a, eng), mb_plain(b_plain, eng), mb(pd.weights_desc(), eng), mc(c, eng);
  const size_t bytes = static_cast<size_t>(n * n) * (bf16 ? 2 : 4);
  std::vector<unsigned char> zero(bytes, 0);
  std::copy(zero.begin(), zero.end(), static_cast<unsigned char*>(ma.get_data_handle()));
  std::copy(zero.begin(), zero.end(), static_cast<unsigned char*>(mb_plain.get_data_handle()));
  reorder(mb_plain, mb).execute(s, mb_plain, mb);
  matmul product(pd);
  auto run = [&] { product.execute(s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}}); };
  run();
  s.wait();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    s.wait();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return {times[reps / 2], pd.impl_info_str()};
}

#else

std::string onednn_missing(bool) {
  return "this build has no oneDNN (apt-get install libdnnl-dev, then configure again)";
}
std::string onednn_version() { return ""; }
OnednnProduct onednn_matmul(int64_t, bool, int) {
  TORCH_CHECK(false, onednn_missing(true));
  return {};  // LibTorch 2.11's TORCH_CHECK(false, ...) is not seen as not returning
}

#endif

}  // namespace tinylm
