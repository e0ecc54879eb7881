// A kernel policy kept whole in an autograd context: a backward computes with the policy
// its forward had, every field of it (a field copied by hand is a field forgotten).
#pragma once

#include <tinylm/nn/kernel_policy.h>

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

namespace tinylm::nn {

struct SavedPolicy : torch::CustomClassHolder {
  explicit SavedPolicy(const KernelPolicy& p) : policy(p) {}
  KernelPolicy policy;
};

inline void save_policy(torch::autograd::AutogradContext* ctx, const KernelPolicy& policy) {
  ctx->saved_data["policy"] = c10::IValue::make_capsule(c10::make_intrusive<SavedPolicy>(policy));
}

inline KernelPolicy saved_policy(torch::autograd::AutogradContext* ctx) {
  return static_cast<const SavedPolicy*>(ctx->saved_data.at("policy").toCapsule().get())->policy;
}

}  // namespace tinylm::nn
