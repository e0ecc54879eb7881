// LibTorch Adam/AdamW behind tinylm's Optimizer interface, and the flat fused Adam.
// Over 400 lines on purpose: both optimizers behind one interface, sharing the checks that
// a saved state fits the model (entry, step_entry) and which parameters AdamW decays.
#include <tinylm/train/optimizer.h>

#include "nn/bf16_operands.h"
#include "nn/cpu/kernels.h"
#include "nn/gradient_slots.h"

#include <ATen/Parallel.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

namespace tinylm::train {

std::set<std::string> decayed_parameters(const torch::nn::Module& model, DecayedParameters which) {
  std::set<std::string> out;
  if (which == DecayedParameters::matrices) {
    for (const auto& p : model.named_parameters())
      if (p.value().dim() >= 2) out.insert(p.key());
    return out;
  }
  if (dynamic_cast<const torch::nn::LinearImpl*>(&model)) out.insert("weight");
  for (const auto& m : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    if (m.value()->as<torch::nn::Linear>()) out.insert(m.key() + ".weight");
  return out;
}

namespace {

/// One tensor of `state`, checked to exist with the given shape and dtype.
torch::Tensor entry(const TensorMap& state, const std::string& key, torch::IntArrayRef shape,
                           torch::ScalarType dtype) {
  auto it = state.find(key);
  TORCH_CHECK(it != state.end(), "optimizer state lacks '", key, "'");
  TORCH_CHECK(it->second.sizes() == shape && it->second.scalar_type() == dtype,
              "optimizer state '", key, "' is ", it->second.scalar_type(), " ", it->second.sizes(),
              ", expected ", dtype, " ", shape);
  return it->second;
}

int64_t step_entry(const TensorMap& state, const std::string& key) {
  const int64_t step = entry(state, key, {}, torch::kLong).item<int64_t>();
  TORCH_CHECK(step >= 0, "optimizer state '", key, "' is ", step, ", expected a step count >= 0");
  return step;
}

torch::Tensor scalar_step(int64_t step) { return torch::scalar_tensor(step, torch::kLong); }

/// The key LibTorch's optimizers file a parameter's state under: the TensorImpl's
/// address, as a string in LibTorch 1.x and as the pointer itself in 2.x.
template <typename Key>
Key state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

class TorchAdam final : public Optimizer {
 public:
  TorchAdam(torch::nn::Module& model, const AdamConfig& c) : decoupled_(c.decoupled) {
    for (const auto& p : model.named_parameters()) {
      names_.push_back(p.key());
      params_.push_back(p.value());
    }
    if (!c.decoupled) {
      impl_ = std::make_unique<torch::optim::Adam>(
          params_, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps));
      return;
    }
    std::vector<torch::Tensor> decay, no_decay;
    const auto decayed = decayed_parameters(model, c.decayed);
    for (const auto& p : model.named_parameters())
      (decayed.count(p.key()) ? decay : no_decay).push_back(p.value());
    auto options = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, options(c.weight_decay));
    groups.emplace_back(no_decay, options(0.0));
    impl_ = std::make_unique<torch::optim::AdamW>(std::move(groups), *options(0.0));
  }
  void zero_grad() override {
    for (auto& p : params_)
      if (p.grad().defined()) p.mutable_grad().zero_();
  }
  double clip_grad_norm(double max_norm) override {
    return torch::nn::utils::clip_grad_norm_(params_, max_norm);
  }
  void step(double lr) override {
    for (auto& group : impl_->param_groups()) group.options().set_lr(lr);
    impl_->step();
  }
  TensorMap state_dict() const override {
    return decoupled_ ? save_as<torch::optim::AdamWParamState>() : save_as<torch::optim::AdamParamState>();
  }
  void load_state_dict(const TensorMap& state) override {
    if (decoupled_) load_as<torch::optim::AdamWParamState>(state);
    else load_as<torch::optim::AdamParamState>(state);
  }
  /// Format 1 held LibTorch's own optimizer archive: per-parameter state filed under the
  /// saving process's TensorImpl addresses, and each group's list of those addresses in
  /// parameter order; here it is by position, named by this optimizer's groups.
  TensorMap state_from_groups(const GroupedState& groups) const override {
    const auto& ours = impl_->param_groups();
    TORCH_CHECK(groups.size() == ours.size(), "the state has ", groups.size(), " parameter groups, this optimizer ",
                ours.size());
    TensorMap out;
    for (size_t g = 0; g < ours.size(); ++g) {
      const auto& params = ours[g].params();
      TORCH_CHECK(groups[g].size() == params.size(), "parameter group ", g, " of the state has ", groups[g].size(),
                  " parameters, this optimizer's ", params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        const auto it = std::find_if(params_.begin(), params_.end(),
                                     [&](const torch::Tensor& p) { return p.is_same(params[i]); });
        TORCH_CHECK(it != params_.end(), "parameter group ", g, " holds a tensor the model does not");
        const std::string& name = names_[static_cast<size_t>(it - params_.begin())];
        for (const auto& [key, t] : groups[g][i]) out[name + "." + key] = t;
      }
    }
    return out;
  }
  std::string kind() const override { return decoupled_ ? "adamw" : "adam"; }
  std::vector<torch::Tensor> gradients() const override {
    std::vector<torch::Tensor> out;
    for (const auto& p : params_) {
      auto& g = const_cast<torch::Tensor&>(p).mutable_grad();
      if (!g.defined()) g = torch::zeros_like(p);  // unused this step: its gradient is 0
      out.push_back(g);
    }
    return out;
  }
  std::vector<torch::Tensor> parameters() const override { return params_; }

 private:
  using Key = typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

  /// Per parameter `name`: name.step, name.exp_avg, name.exp_avg_sq (and
  /// name.max_exp_avg_sq with amsgrad), for the parameters that have state yet.
  template <typename ParamState>
  TensorMap save_as() const {
    TensorMap out;
    const auto& state = impl_->state();
    for (size_t i = 0; i < params_.size(); ++i) {
      auto it = state.find(state_key<Key>(params_[i]));
      if (it == state.end()) continue;
      const auto& s = static_cast<const ParamState&>(*it->second);
      out[names_[i] + ".step"] = scalar_step(s.step());
      out[names_[i] + ".exp_avg"] = s.exp_avg().detach().to(torch::kCPU);
      out[names_[i] + ".exp_avg_sq"] = s.exp_avg_sq().detach().to(torch::kCPU);
      if (s.max_exp_avg_sq().defined())
        out[names_[i] + ".max_exp_avg_sq"] = s.max_exp_avg_sq().detach().to(torch::kCPU);
    }
    return out;
  }

  template <typename ParamState>
  void load_as(const TensorMap& in) {
    size_t used = 0;
    std::vector<std::pair<Key, std::unique_ptr<torch::optim::OptimizerParamState>>> loaded;
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::string& n = names_[i];
      if (in.count(n + ".step") == 0) continue;  // no update has touched it yet
      const auto& p = params_[i];
      auto s = std::make_unique<ParamState>();
      s->step(step_entry(in, n + ".step"));
      s->exp_avg(entry(in, n + ".exp_avg", p.sizes(), p.scalar_type()).to(p.device()));
      s->exp_avg_sq(entry(in, n + ".exp_avg_sq", p.sizes(), p.scalar_type()).to(p.device()));
      used += 3;
      if (in.count(n + ".max_exp_avg_sq")) {
        s->max_exp_avg_sq(entry(in, n + ".max_exp_avg_sq", p.sizes(), p.scalar_type()).to(p.device()));
        ++used;
      }
      loaded.emplace_back(state_key<Key>(p), std::move(s));
    }
    TORCH_CHECK(used == in.size(), "optimizer state holds ", in.size() - used,
                " entries for parameters this model does not have");
    auto& state = impl_->state();
    state.clear();
    for (auto& [key, s] : loaded) state[key] = std::move(s);
  }

  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  bool decoupled_;
  std::unique_ptr<torch::optim::Optimizer> impl_;
};

class FlatAdam final : public Optimizer {
 public:
  FlatAdam(torch::nn::Module& model, const AdamConfig& c) : c_(c) {
    auto named = model.named_parameters();
    TORCH_CHECK(named.size() > 0, "flat Adam: the model has no parameters");
    const auto options = named.values().front().options();
    int64_t n = 0;
    for (const auto& p : named) {
      TORCH_CHECK(p.value().options().dtype() == options.dtype() &&
                      p.value().device() == options.device(),
                  "flat Adam: all parameters must share one dtype and device; '", p.key(), "' differs");
      n += p.value().numel();
    }
    params_ = torch::empty({n}, options.requires_grad(false));
    grads_ = torch::zeros({n}, options.requires_grad(false));
    exp_avg_ = torch::zeros({n}, options.requires_grad(false));
    exp_avg_sq_ = torch::zeros({n}, options.requires_grad(false));
    // Where AdamW decays: spans of the flat arrays (the CPU's loops run each span with its
    // own decay, reading no mask); elsewhere a 0/1 mask for the ops of the generic update.
    const bool loops = runs_loops();
    if (!loops) decay_ = torch::zeros({n}, options.requires_grad(false));
    torch::NoGradGuard no_grad;
    const auto decayed = decayed_parameters(model, c.decayed);
    int64_t offset = 0;
    for (auto& p : named) {
      auto& param = p.value();
      const int64_t k = param.numel();
      auto slot = params_.narrow(0, offset, k);
      slot.copy_(param.reshape({-1}));
      param.set_data(slot.view(param.sizes()));            // the module's tensor now lives here
      param.mutable_grad() = grads_.narrow(0, offset, k).view(param.sizes());
      if (c.decoupled && decayed.count(p.key()) && k > 0) {
        if (!loops) decay_.narrow(0, offset, k).fill_(1.0);
        if (!decay_spans_.empty() && decay_spans_.back().second == offset)
          decay_spans_.back().second += k;  // one span for neighbours
        else
          decay_spans_.emplace_back(offset, offset + k);
      }
      layout_ += p.key() + ":" + std::to_string(k) + "\n";
      names_.push_back(p.key());
      watched_.push_back(param);
      data_.push_back(param.data_ptr());
      grad_slots_.push_back(param.grad());
      numels_.push_back(k);
      nn::offer_gradient_slot(param, param.grad(), this);
      offset += k;
    }
  }

  ~FlatAdam() override { nn::withdraw_gradient_slots(this); }
  FlatAdam(const FlatAdam&) = delete;
  FlatAdam& operator=(const FlatAdam&) = delete;

  /// The gradients set to None, as PyTorch's zero_grad does: the ops that make a whole
  /// gradient (Linear layers' dW) then write it straight into its place in the flat buffer
  /// (nn::gradient_destination), and gather_gradients() zeroes only the places no gradient
  /// came to. No pass zeroing every gradient, none adding each new one into a zero.
  void zero_grad() override {
    check_in_place();
    for (auto& param : watched_) param.mutable_grad() = torch::Tensor();
    nn::free_gradient_slots(this);
  }

  double clip_grad_norm(double max_norm) override {
    const auto [norm, factor] = norm_and_clip_factor(max_norm);
    if (norm > max_norm) grads_.mul_(factor);
    return norm;
  }

  /// On the CPU's loops the clipping factor multiplies each gradient as the update reads it
  /// (the float32 products clip_grad_norm's multiplication makes), not in a pass of its own.
  double clip_and_step(double max_norm, double lr) override {
    if (max_norm <= 0 || !runs_loops()) return Optimizer::clip_and_step(max_norm, lr);
    const auto [norm, factor] = norm_and_clip_factor(max_norm);
    update(lr, factor);
    return norm;
  }

  /// The gradients' global L2 norm, and the factor that brings it to max_norm (1 under it).
  std::pair<double, double> norm_and_clip_factor(double max_norm) const {
    gather_gradients();
    const double norm = gradient_norm();
    return {norm, norm > max_norm ? max_norm / (norm + 1e-6) : 1.0};
  }

  void step(double lr) override { update(lr, 1.0); }

  /// One Adam(W) step, each gradient multiplied by grad_scale as it is read (clip_and_step's
  /// factor; 1 otherwise, and always off the CPU's loops, where clip_and_step clips first).
  void update(double lr, double grad_scale) {
    gather_gradients();
    ++step_;
    const double bc1 = 1.0 - std::pow(c_.beta1, static_cast<double>(step_));
    const double bc2 = 1.0 - std::pow(c_.beta2, static_cast<double>(step_));
    const double step_size = lr / bc1;
    const double inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    const double decay = c_.decoupled ? lr * c_.weight_decay : 0.0;
    torch::NoGradGuard no_grad;
    std::vector<char> keeps;  // which parameters' bfloat16 copies the update provides
    bool round = false;
    if (runs_loops()) {
      // Layouts: p, g, m, v are flat float32 arrays of N values, one per parameter
      // element, the model's parameters end to end in named_parameters() order; AdamW
      // decays the spans decay_spans_ (decayed_parameters()), in order.
      float* p = params_.data_ptr<float>();
      const float* g = grads_.data_ptr<float>();
      float* m = exp_avg_.data_ptr<float>();
      float* v = exp_avg_sq_.data_ptr<float>();
      // The (1 - beta) factors are formed in double and rounded once, as LibTorch's Adam
      // does: 1.f - float(0.999) would be off by 1.3e-5 relative (7e-6 per update).
      // AdamW's decoupled decay goes to the decayed spans only. On tinylm's loops:
      // the widest vectors the CPU runs (this file is built for the baseline).
      auto f = [](double x) { return static_cast<float>(x); };
      const nn::cpu::AdamStep decayed{f(c_.beta1), f(c_.beta2), f(1.0 - c_.beta1), f(1.0 - c_.beta2),
                                      f(c_.eps), f(step_size), f(inv_sqrt_bc2), f(decay), f(grad_scale)};
      nn::cpu::AdamStep plain = decayed;
      plain.decay = 0.f;
      const auto& k = nn::cpu::table();
      const auto& spans = decay_spans_;
      // Where bfloat16 products keep copies of weights (nn::rounded_weight), every parameter
      // is rounded in this pass too, each chunk while it is in cache: the copies are then
      // provided below, and no weight is read again to round it.
      keeps.resize(watched_.size());
      for (size_t i = 0; i < watched_.size(); ++i) keeps[i] = nn::keeps_rounded_weight(watched_[i]);
      round = std::find(keeps.begin(), keeps.end(), 1) != keeps.end();
      if (round && !rounded_.defined()) rounded_ = torch::empty({params_.numel()}, params_.options().dtype(torch::kBFloat16));
      uint16_t* p16 = round ? nn::bits(rounded_) : nullptr;
      const auto& k16 = nn::cpu::bf16_table();
      at::parallel_for(0, params_.numel(), 16384, [&](int64_t begin, int64_t end) {
        // The first decayed span that ends past `begin`, then this chunk's pieces in turn.
        auto span = std::upper_bound(spans.begin(), spans.end(), begin,
                                     [](int64_t i, const std::pair<int64_t, int64_t>& s) { return i < s.second; });
        for (int64_t i = begin; i < end;) {
          const bool in_span = span != spans.end() && span->first <= i;
          const int64_t stop = std::min(end, in_span ? span->second : span != spans.end() ? span->first : end);
          k.adam_step(p + i, g + i, m + i, v + i, stop - i, in_span ? decayed : plain);
          if (in_span && stop == span->second) ++span;
          i = stop;
        }
        if (p16) k16.round_bf16(p + begin, p16 + begin, end - begin);
      });
    } else {
      // Other devices and dtypes: the same update as a handful of ops on the flat buffers.
      if (decay != 0.0) params_.mul_(1.0 - decay * decay_);
      exp_avg_.mul_(c_.beta1).add_(grads_, 1.0 - c_.beta1);
      exp_avg_sq_.mul_(c_.beta2).addcmul_(grads_, grads_, 1.0 - c_.beta2);
      params_.addcdiv_(exp_avg_, exp_avg_sq_.sqrt().mul_(inv_sqrt_bc2).add_(c_.eps), -step_size);
    }
    // Each parameter changed, though not through an op of its own (set_data gave it a
    // version counter apart from the flat buffer's): say so, as an in-place op would, for
    // what keeps a copy until the weight changes (the bfloat16 weights of nn::linear).
    for (auto& param : watched_) param.unsafeGetTensorImpl()->bump_version();
    if (!round) return;
    int64_t offset = 0;  // the copies rounded above, for the versions now
    for (size_t i = 0; i < watched_.size(); ++i) {
      if (keeps[i])
        nn::provide_rounded_weight(watched_[i], rounded_.narrow(0, offset, numels_[i]).view(watched_[i].sizes()));
      offset += numels_[i];
    }
  }

  /// step, exp_avg and exp_avg_sq (flat, N), and the parameter sizes they cover.
  TensorMap state_dict() const override {
    return {{"step", scalar_step(step_)},
            {"exp_avg", exp_avg_.to(torch::kCPU)},
            {"exp_avg_sq", exp_avg_sq_.to(torch::kCPU)},
            {"numels", torch::tensor(numels_, torch::kLong)}};
  }

  void load_state_dict(const TensorMap& state) override {
    TORCH_CHECK(state.size() == 4, "flat Adam state has ", state.size(),
                " entries, expected 4 (step, exp_avg, exp_avg_sq, numels)");
    const auto numels = entry(state, "numels", {static_cast<int64_t>(numels_.size())}, torch::kLong);
    TORCH_CHECK(torch::equal(numels, torch::tensor(numels_, torch::kLong)),
                "flat Adam state was saved for parameters of other sizes");
    const int64_t step = step_entry(state, "step");
    const auto m = entry(state, "exp_avg", exp_avg_.sizes(), exp_avg_.scalar_type());
    const auto v = entry(state, "exp_avg_sq", exp_avg_sq_.sizes(), exp_avg_sq_.scalar_type());
    torch::NoGradGuard no_grad;
    exp_avg_.copy_(m);
    exp_avg_sq_.copy_(v);
    step_ = step;
  }

  TensorMap state_from_groups(const GroupedState&) const override {
    TORCH_CHECK(false, "flat Adam keeps no parameter groups: its state is one flat buffer (load_state_dict)");
    return {};
  }
  std::string kind() const override { return c_.decoupled ? "flat-adamw" : "flat-adam"; }
  std::vector<torch::Tensor> gradients() const override {
    gather_gradients();
    return {grads_};
  }
  std::vector<torch::Tensor> parameters() const override {
    check_in_place();
    return {params_};
  }

 private:
  /// The model's parameters must still be the views into the flat buffer: model->to(dtype
  /// or device) or set_data would leave this optimizer updating a buffer the model no
  /// longer reads.
  void check_in_place() const {
    for (size_t i = 0; i < watched_.size(); ++i) {
      const auto& p = watched_[i];
      TORCH_CHECK(p.data_ptr() == data_[i],
                  "the flat Adam optimizer no longer holds parameter '", names_[i],
                  "': the model was moved, cast, or had its parameters replaced after "
                  "the optimizer was built (now ", p.scalar_type(), " on ", p.device(),
                  "). Build the optimizer after the model is on its device and dtype");
    }
  }

  /// check_in_place(), then each gradient put in its place in the flat buffer (and the
  /// parameter's .grad() made that place again): none (zero_grad set it to None, or the
  /// parameter took no part) is zeros; one made elsewhere (autograd's own ops, a tied
  /// weight's second use, a gradient set by hand) is copied in.
  void gather_gradients() const {
    check_in_place();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < watched_.size(); ++i) {
      auto& grad = const_cast<torch::Tensor&>(watched_[i]).mutable_grad();
      const auto& slot = grad_slots_[i];
      if (grad.defined() && grad.data_ptr() == slot.data_ptr() && grad.sizes() == slot.sizes() &&
          grad.strides() == slot.strides())
        continue;
      if (!grad.defined()) {
        slot.zero_();
      } else {
        TORCH_CHECK(grad.sizes() == slot.sizes() && grad.scalar_type() == slot.scalar_type() &&
                        grad.device() == slot.device(),
                    "the gradient of parameter '", names_[i], "' is ", grad.sizes(), " ", grad.scalar_type(), " on ",
                    grad.device(), ", the parameter ", slot.sizes(), " ", slot.scalar_type(), " on ", slot.device(),
                    ": give each parameter a gradient of its own size, dtype and device");
        slot.copy_(grad);
      }
      grad = slot;
    }
  }

  /// The update runs on tinylm's CPU loops (float32 on the CPU), else as LibTorch ops.
  /// The flat gradients' L2 norm. On the CPU's loops: blocks of kNormBlock squares, each
  /// summed in double on a thread, the blocks' sums added in order (the same bits at every
  /// thread count): one pass over the threads, where LibTorch's norm ran on one thread
  /// while the other waited (a hundredth of nanoGPT's step).
  double gradient_norm() const {
    if (!runs_loops()) return grads_.norm().item<double>();
    constexpr int64_t kNormBlock = 16384;
    const int64_t n = grads_.numel(), blocks = (n + kNormBlock - 1) / kNormBlock;
    std::vector<double> sums(static_cast<size_t>(blocks));
    const float* g = grads_.data_ptr<float>();
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const float* x = g + b * kNormBlock;
        const int64_t m = std::min(kNormBlock, n - b * kNormBlock);
        // eight sums a lane each (the vector units take them side by side), then added
        double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = 0;
        for (; i + 8 <= m; i += 8)
          for (int j = 0; j < 8; ++j) lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
        double s = 0;
        for (const double lane : lanes) s += lane;
        for (; i < m; ++i) s += static_cast<double>(x[i]) * x[i];
        sums[static_cast<size_t>(b)] = s;
      }
    });
    double total = 0;
    for (const double s : sums) total += s;
    return std::sqrt(total);
  }

  bool runs_loops() const { return params_.device().is_cpu() && params_.scalar_type() == torch::kFloat32; }

  std::vector<std::string> names_;
  std::vector<torch::Tensor> watched_;              // the model's own parameter variables
  std::vector<const void*> data_;                   // where they must keep pointing
  std::vector<torch::Tensor> grad_slots_;           // each one's gradient's place in grads_
  AdamConfig c_;
  torch::Tensor params_, grads_, exp_avg_, exp_avg_sq_;  // flat (N)
  torch::Tensor rounded_;  // flat (N) bfloat16: params_ rounded by the update, where products keep copies
  torch::Tensor decay_;  // flat (N), 1 where AdamW decays: off the CPU's loops only
  std::vector<std::pair<int64_t, int64_t>> decay_spans_;  // [begin, end) where AdamW decays, in order
  std::string layout_;           // "name:numel" lines: what format-1 files recorded
  std::vector<int64_t> numels_;  // each parameter's size, in order
  int64_t step_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_torch_adam(torch::nn::Module& model, const AdamConfig& config) {
  return std::make_unique<TorchAdam>(model, config);
}

std::unique_ptr<Optimizer> make_flat_adam(torch::nn::Module& model, const AdamConfig& config) {
  return std::make_unique<FlatAdam>(model, config);
}

}  // namespace tinylm::train
