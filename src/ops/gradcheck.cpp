// Central-difference gradient checker used by the op tests.
#include "src/ops/gradcheck.h"

#include <cmath>
#include <sstream>

#include "src/autograd/autograd.h"
#include "kernels/cpu/hash.h"
#include "src/ops/ops.h"

namespace tg {

namespace {
double weighted_sum(const Tensor& out, const std::vector<double>& w) {
  std::vector<double> o = out.to_double_vector();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
  return s;
}
}  // namespace

GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, double eps, double atol, double rtol) {
  for (const Tensor& t : inputs)
    TG_CHECK(t.dtype() == DType::f64, "gradcheck: inputs must be f64, got ", t.desc());
  // Analytic: backward through L = sum(f(x) * W).
  std::vector<Tensor> xs;
  for (const Tensor& t : inputs) {
    Tensor c = t.clone();
    c.set_requires_grad(t.requires_grad());
    xs.push_back(c);
  }
  Tensor out = f(xs);
  std::vector<double> w(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + cpu::uniform_from(7, i);  // fixed, distinct weights in [0.5, 1.5)
  Tensor W = Tensor::from_vector(w, out.shape(), DType::f64);
  Tensor loss = ops::sum(ops::mul(out, W));
  loss.backward();

  GradCheckResult result;
  NoGradGuard no_grad;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (!inputs[k].requires_grad()) continue;
    Tensor g = xs[k].grad();
    std::vector<double> analytic = g.defined() ? g.to_double_vector() : std::vector<double>(size_t(xs[k].numel()), 0.0);
    std::vector<Tensor> probe;
    for (const Tensor& t : inputs) probe.push_back(t.clone());
    double* p = probe[k].data<double>();
    for (int64_t i = 0; i < probe[k].numel(); ++i) {
      double saved = p[i];
      p[i] = saved + eps;
      double plus = weighted_sum(f(probe), w);
      p[i] = saved - eps;
      double minus = weighted_sum(f(probe), w);
      p[i] = saved;
      double numeric = (plus - minus) / (2 * eps);
      double err = std::abs(analytic[size_t(i)] - numeric);
      if (err > result.max_abs_error) result.max_abs_error = err;
      if (err > atol + rtol * std::abs(numeric) && result.ok) {
        result.ok = false;
        std::ostringstream os;
        os << "input " << k << " element " << i << ": analytic " << analytic[size_t(i)] << " vs numeric "
           << numeric;
        result.detail = os.str();
      }
    }
  }
  return result;
}

}  // namespace tg
