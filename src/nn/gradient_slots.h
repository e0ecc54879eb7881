// Gradient slots: where a parameter's gradient may be written by the op that makes it.
//
// An optimizer that keeps every gradient in one flat buffer (the flat Adam) offers each
// parameter's place in it. A backward that makes a parameter's whole gradient (a Linear
// layer's dW) asks for gradient_destination(param) and writes there: autograd then takes
// that tensor as the parameter's .grad() (it steals a new gradient while .grad() is
// undefined), so the gradient lands in the buffer without a zeroing pass before the
// backward or an accumulating pass after it. Where there is no slot, the parameter already
// has a gradient (micro-batches accumulating) or the slot was handed out since it was last
// freed (a weight used twice, such as a tied embedding), the op gets a new tensor, and
// autograd adds or keeps it as it always did; the optimizer gathers what is not in place.
#pragma once

#include <torch/types.h>

namespace tinylm::nn {

/// `param`'s gradient may be written into `slot` (param's size, dtype and device) while
/// param has no gradient; `owner` names who offered it (withdraw_gradient_slots).
void offer_gradient_slot(const torch::Tensor& param, const torch::Tensor& slot, const void* owner);

/// The slots `owner` offered may each be handed out once more (their gradients were set to
/// None: the optimizer's zero_grad).
void free_gradient_slots(const void* owner);

/// The slots `owner` offered are no longer offered (the optimizer is gone).
void withdraw_gradient_slots(const void* owner);

/// A tensor of param's shape, dtype and device for param's whole gradient: a view of its
/// slot where it has one, free, and param has no gradient now (the slot is then taken until
/// freed); else a new uninitialised tensor.
torch::Tensor gradient_destination(const torch::Tensor& param);

}  // namespace tinylm::nn
