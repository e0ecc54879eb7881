// Builds a model through the installed tinylm package and runs one forward pass.
#include <tinylm/tinylm.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  tinylm::nn::TinyAttentionLM model(tinylm::nn::TinyAttentionLMOptions(64, 12, 32, 4));
  auto ids = torch::randint(64, {2, 12}, torch::kLong);
  auto out = model->forward(ids, /*return_weights=*/true);
  const bool ok = out.logits.sizes() == torch::IntArrayRef({2, 12, 64}) &&
                  out.attention.at(0).sizes() == torch::IntArrayRef({2, 4, 12, 12});
  std::cout << "tinylm " << TINYLM_VERSION_STRING << " consumer: logits " << out.logits.sizes()
            << (ok ? " ok" : " WRONG SHAPE") << "\n";
  return ok ? 0 : 1;
}
