// LibTorch Adam/AdamW behind tinylm's Optimizer interface, and the flat fused Adam.
#include <tinylm/train/optimizer.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>

namespace tinylm::train {

bool is_decayed(const std::string& name, const torch::Tensor& p) {
  const bool embedding = name.rfind("token_embedding.", 0) == 0 || name.rfind("positions.", 0) == 0;
  return p.dim() >= 2 && !embedding;
}

namespace {

std::vector<torch::Tensor> all_parameters(torch::nn::Module& model) { return model.parameters(); }

class TorchAdam final : public Optimizer {
 public:
  TorchAdam(torch::nn::Module& model, const AdamConfig& c) : params_(all_parameters(model)), decoupled_(c.decoupled) {
    if (!c.decoupled) {
      impl_ = std::make_unique<torch::optim::Adam>(
          params_, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps));
      return;
    }
    std::vector<torch::Tensor> decay, no_decay;
    for (const auto& p : model.named_parameters())
      (is_decayed(p.key(), p.value()) ? decay : no_decay).push_back(p.value());
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
  void save(torch::serialize::OutputArchive& a) const override { impl_->save(a); }
  void load(torch::serialize::InputArchive& a) override { impl_->load(a); }
  std::string kind() const override { return decoupled_ ? "adamw" : "adam"; }

 private:
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
    decay_ = torch::zeros({n}, options.requires_grad(false));
    torch::NoGradGuard no_grad;
    int64_t offset = 0;
    for (auto& p : named) {
      auto& param = p.value();
      const int64_t k = param.numel();
      auto slot = params_.narrow(0, offset, k);
      slot.copy_(param.reshape({-1}));
      param.set_data(slot.view(param.sizes()));            // the module's tensor now lives here
      param.mutable_grad() = grads_.narrow(0, offset, k).view(param.sizes());
      if (c.decoupled && is_decayed(p.key(), param)) decay_.narrow(0, offset, k).fill_(1.0);
      layout_ += p.key() + ":" + std::to_string(k) + "\n";
      offset += k;
    }
  }

  void zero_grad() override { grads_.zero_(); }

  double clip_grad_norm(double max_norm) override {
    const double norm = grads_.norm().item<double>();
    if (norm > max_norm) grads_.mul_(max_norm / (norm + 1e-6));
    return norm;
  }

  void step(double lr) override {
    ++step_;
    const double bc1 = 1.0 - std::pow(c_.beta1, static_cast<double>(step_));
    const double bc2 = 1.0 - std::pow(c_.beta2, static_cast<double>(step_));
    const double step_size = lr / bc1;
    const double inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    const double decay = c_.decoupled ? lr * c_.weight_decay : 0.0;
    torch::NoGradGuard no_grad;
    if (params_.device().is_cpu() && params_.scalar_type() == torch::kFloat32) {
      float* p = params_.data_ptr<float>();
      const float* g = grads_.data_ptr<float>();
      float* m = exp_avg_.data_ptr<float>();
      float* v = exp_avg_sq_.data_ptr<float>();
      const float* d = decay_.data_ptr<float>();
      const float b1 = c_.beta1, b2 = c_.beta2, eps = c_.eps;
      const float fs = step_size, fi = inv_sqrt_bc2, fd = decay;
      at::parallel_for(0, params_.numel(), 16384, [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) {
          p[i] *= 1.f - fd * d[i];  // AdamW: decoupled decay, decayed tensors only
          m[i] = b1 * m[i] + (1.f - b1) * g[i];
          v[i] = b2 * v[i] + (1.f - b2) * g[i] * g[i];
          p[i] -= fs * m[i] / (std::sqrt(v[i]) * fi + eps);
        }
      });
      return;
    }
    // Other devices and dtypes: the same update as a handful of ops on the flat buffers.
    if (decay != 0.0) params_.mul_(1.0 - decay * decay_);
    exp_avg_.mul_(c_.beta1).add_(grads_, 1.0 - c_.beta1);
    exp_avg_sq_.mul_(c_.beta2).addcmul_(grads_, grads_, 1.0 - c_.beta2);
    params_.addcdiv_(exp_avg_, exp_avg_sq_.sqrt().mul_(inv_sqrt_bc2).add_(c_.eps), -step_size);
  }

  void save(torch::serialize::OutputArchive& a) const override {
    a.write("layout", c10::IValue(layout_));
    a.write("step", c10::IValue(step_));
    a.write("exp_avg", exp_avg_.to(torch::kCPU));
    a.write("exp_avg_sq", exp_avg_sq_.to(torch::kCPU));
  }

  void load(torch::serialize::InputArchive& a) override {
    c10::IValue layout, step;
    TORCH_CHECK(a.try_read("layout", layout) && layout.isString() && a.try_read("step", step),
                "flat Adam state is incomplete");
    TORCH_CHECK(layout.toStringRef() == layout_,
                "flat Adam state was saved for other parameters (names or sizes differ)");
    torch::Tensor m, v;
    TORCH_CHECK(a.try_read("exp_avg", m) && a.try_read("exp_avg_sq", v) &&
                    m.numel() == exp_avg_.numel() && v.numel() == exp_avg_sq_.numel(),
                "flat Adam state has the wrong size");
    torch::NoGradGuard no_grad;
    exp_avg_.copy_(m);
    exp_avg_sq_.copy_(v);
    step_ = step.toInt();
  }

  std::string kind() const override { return c_.decoupled ? "flat-adamw" : "flat-adam"; }

 private:
  AdamConfig c_;
  torch::Tensor params_, grads_, exp_avg_, exp_avg_sq_, decay_;  // flat (N)
  std::string layout_;
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
