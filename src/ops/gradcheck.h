// Gradient checking: autograd's gradients against central finite differences, in double.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "src/tensor/tensor.h"

namespace tg {

struct GradCheckResult {
  bool ok = true;
  double max_abs_error = 0;  // over all checked elements of all inputs
  std::string detail;        // the worst element: input, index, analytic vs numeric
};

// Checks d/dx of the scalar L(x) = Σ f(x) ∘ W for every input that requires grad, with W a
// fixed pseudo-random tensor (so every output element contributes with a distinct weight).
// Inputs must be f64. An element passes when |analytic − numeric| ≤ atol + rtol·|numeric|.
GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-7,
                          double rtol = 1e-5);

}  // namespace tg
