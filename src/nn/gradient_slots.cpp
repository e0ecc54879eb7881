// Gradient slots (see gradient_slots.h).
#include "nn/gradient_slots.h"

#include <iterator>
#include <mutex>
#include <unordered_map>

namespace tinylm::nn {

namespace {

struct OfferedSlot {
  c10::weak_intrusive_ptr<c10::TensorImpl> param;  // to tell a reused address from the parameter
  torch::Tensor slot;
  const void* owner;
  bool taken = false;
};

std::mutex g_slots_mutex;
std::unordered_map<const c10::TensorImpl*, OfferedSlot>& offered_slots() {
  static auto* map = new std::unordered_map<const c10::TensorImpl*, OfferedSlot>();  // used by threads until exit
  return *map;
}

}  // namespace

void offer_gradient_slot(const torch::Tensor& param, const torch::Tensor& slot, const void* owner) {
  TORCH_CHECK(param.defined() && slot.defined() && slot.sizes() == param.sizes() &&
                  slot.scalar_type() == param.scalar_type() && slot.device() == param.device() && slot.is_contiguous(),
              "offer_gradient_slot: the slot must be a contiguous tensor of the parameter's size, dtype and device");
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  offered_slots().insert_or_assign(
      param.unsafeGetTensorImpl(),
      OfferedSlot{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()), slot, owner, false});
}

void free_gradient_slots(const void* owner) {
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (auto& [impl, s] : offered_slots())
    if (s.owner == owner) s.taken = false;
}

void withdraw_gradient_slots(const void* owner) {
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  auto& map = offered_slots();
  for (auto it = map.begin(); it != map.end();) it = it->second.owner == owner ? map.erase(it) : std::next(it);
}

torch::Tensor gradient_destination(const torch::Tensor& param) {
  {
    std::lock_guard<std::mutex> lock(g_slots_mutex);
    auto& map = offered_slots();
    const auto it = map.find(param.unsafeGetTensorImpl());
    // Alive, the offered parameter is the tensor at this address; its size, dtype and device
    // are checked again as set_data (a cast model) changes them in place.
    if (it != map.end() && !it->second.taken && !param.grad().defined() && !it->second.param.expired() &&
        it->second.slot.sizes() == param.sizes() && it->second.slot.scalar_type() == param.scalar_type() &&
        it->second.slot.device() == param.device()) {
      it->second.taken = true;
      return it->second.slot.view(param.sizes());  // a tensor of its own: autograd may take it as .grad()
    }
  }
  return torch::empty(param.sizes(), param.options().requires_grad(false));
}

}  // namespace tinylm::nn
