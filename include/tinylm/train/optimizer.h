// Optimizers for the Trainer: LibTorch's Adam/AdamW, or the same update fused over one
// flat buffer holding every parameter (and one holding every gradient).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace tinylm::train {

/// Named tensors: what an optimizer saves, and the data part of a checkpoint.
using TensorMap = std::map<std::string, torch::Tensor>;

/// Per-parameter state filed by position, as LibTorch's optimizer archives (format-1
/// checkpoints) kept it: groups[g][i] is the state of parameter group g's i-th parameter
/// ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), empty where no update had touched it.
using GroupedState = std::vector<std::vector<TensorMap>>;

/// The parameters AdamW decays.
enum class DecayedParameters {
  /// The weights of torch::nn::Linear layers (tinylm's default): not biases, norms or
  /// embedding tables (token or position).
  linear_weights,
  /// Every parameter of two or more dimensions: Linear weights and embedding tables,
  /// not biases or norms (nanoGPT's configure_optimizers).
  matrices,
};

struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  /// true: AdamW (decoupled decay, only on decayed_parameters(model, decayed)); false:
  /// Adam (no decay).
  bool decoupled = false;
  DecayedParameters decayed = DecayedParameters::linear_weights;
};

/// The names of the parameters AdamW decays, in tinylm's models and in a user's alike:
/// by the kind of module that owns them (linear_weights: the weights of torch::nn::Linear
/// layers) or by shape (matrices: every parameter with two or more dimensions). A weight
/// shared by two modules (a tied head) is one parameter, under its first name.
std::set<std::string> decayed_parameters(const torch::nn::Module& model,
                                         DecayedParameters which = DecayedParameters::linear_weights);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void zero_grad() = 0;
  /// Scales gradients so their global L2 norm is at most max_norm; returns the norm
  /// before scaling.
  virtual double clip_grad_norm(double max_norm) = 0;
  virtual void step(double lr) = 0;
  /// clip_grad_norm(max_norm) (none for max_norm 0, returning 0) and step(lr) as one: the
  /// same update, which an optimizer may make without writing the scaled gradients out
  /// (the flat Adam scales them as its update reads them, and leaves them as they were).
  virtual double clip_and_step(double max_norm, double lr) {
    const double norm = max_norm > 0 ? clip_grad_norm(max_norm) : 0.0;
    step(lr);
    return norm;
  }
  /// The optimizer's state as named CPU tensors (counters as 0-dim int64 tensors).
  virtual TensorMap state_dict() const = 0;
  /// Restores what state_dict() returned; refuses state that does not fit the model
  /// (missing or unknown entries, other shapes or dtypes).
  virtual void load_state_dict(const TensorMap& state) = 0;
  /// State filed by parameter group position (format 1) in state_dict()'s layout, for
  /// load_state_dict(); refuses groups that do not match this optimizer's (optimizers
  /// without groups refuse all).
  virtual TensorMap state_from_groups(const GroupedState& groups) const = 0;
  /// The gradients step() reads, as few tensors as it keeps them in (the flat optimizer:
  /// one): what data-parallel training averages across processes.
  virtual std::vector<torch::Tensor> gradients() const = 0;
  /// The parameters it updates, likewise (broadcast from rank 0 so all ranks start equal).
  virtual std::vector<torch::Tensor> parameters() const = 0;
  /// "adam", "adamw", "flat-adam" or "flat-adamw": what a checkpoint's state belongs to.
  virtual std::string kind() const = 0;
};

/// torch::optim::Adam / AdamW with parameter groups: one op per tensor per update.
std::unique_ptr<Optimizer> make_torch_adam(torch::nn::Module& model, const AdamConfig& config);

/// The same update, fused: the model's parameters are re-pointed at views of one flat
/// buffer and their gradients at views of another, so clipping and the update are each
/// one pass over memory (a single loop on the CPU). zero_grad() sets the gradients to None
/// (PyTorch's default): Linear layers' backward then writes dW straight into the buffer
/// (nn::gradient_destination), and clip/step/gradients() copy in any gradient made
/// elsewhere and read zeros for a parameter that got none. Call after the model is on its
/// device and dtype: moving or casting the model afterwards (or replacing a parameter)
/// makes the next zero_grad/clip/step throw instead of training nothing, as does a
/// gradient set by hand to another size, dtype or device.
std::unique_ptr<Optimizer> make_flat_adam(torch::nn::Module& model, const AdamConfig& config);

}  // namespace tinylm::train
