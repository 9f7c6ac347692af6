#pragma once
// The reference optimizer trajectories of
// tests/python/fixtures/optimizers_fp64/trajectories.json, recorded in
// float64 by tests/python/optimizer_reference.py from lion-pytorch's Lion and
// transformers.optimization.Adafactor: three parameter tensors (a 7 x 5
// matrix, a norm gain of 6 excluded from weight decay, a 3 x 8 matrix), ten
// steps of gradients, and each run's parameters (and state) after every
// step. Read with nlohmann-json, whose strtod gives back the float64 that
// Python's repr wrote. tests/optim/lion.cpp and tests/optim/adafactor.cpp
// hold tessera's optimizers to it; the file's path comes from
// TESSERA_SOURCE_DIR (the repository root, tests/CMakeLists.txt).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/optim/optimizer.hpp"

#ifndef TESSERA_SOURCE_DIR
#error "optimizer_reference.hpp needs TESSERA_SOURCE_DIR (the repository root)"
#endif

namespace tessera::testing {

/// The fixture, laid out in one flat buffer as a model's parameters are:
/// the tensors in file order, `gap` elements of padding (in no range)
/// after each.
struct optimizer_reference {
  /// One tensor: elements [begin, begin + size) of the flat buffer.
  struct tensor {
    std::string name;
    std::int64_t begin = 0, rows = 1, cols = 1;
    int dims = 1;
    bool decay = true;
    std::int64_t size() const { return rows * cols; }
    std::int64_t end() const { return begin + size(); }
  };
  static constexpr std::int64_t gap = 3;
  /// What padding holds before and after every step.
  static constexpr double padding_value = 0.25;

  nlohmann::json doc;
  std::vector<tensor> tensors;
  std::vector<optim::param_range> ranges;  ///< one a tensor, with its shape and decay flag
  std::int64_t n = 0;                      ///< elements of the flat buffer, padding included

  optimizer_reference() {
    const std::string path = std::string(TESSERA_SOURCE_DIR) +
                             "/tests/python/fixtures/optimizers_fp64/trajectories.json";
    INFO("the optimizer fixture " << path);
    std::ifstream f(path);
    REQUIRE(f.good());
    doc = nlohmann::json::parse(f);
    for (const auto& t : doc.at("tensors")) {
      tensor x;
      x.name = t.at("name").get<std::string>();
      const auto shape = t.at("shape").get<std::vector<std::int64_t>>();
      x.dims = static_cast<int>(shape.size());
      REQUIRE((x.dims == 1 || x.dims == 2));
      x.rows = x.dims == 2 ? shape[0] : 1;
      x.cols = shape.back();
      x.decay = t.at("decay").get<bool>();
      x.begin = n;
      optim::param_range r{x.begin, x.begin + x.size(), x.decay};
      r.dims = x.dims;
      r.rows = x.rows;
      r.cols = x.cols;
      ranges.push_back(r);
      tensors.push_back(x);
      n += x.size() + gap;
    }
  }

  /// The named run ("lion", "adafactor", "adafactor_beta1").
  const nlohmann::json& run(const std::string& name) const {
    for (const auto& r : doc.at("runs"))
      if (r.at("name") == name) return r;
    FAIL("no run " << name << " in the optimizer fixture");
    return doc;
  }

  /// Per-tensor lists (the fixture's [tensor][element], each tensor
  /// row-major) in the flat layout (n), `pad` in the padding.
  std::vector<double> flat(const nlohmann::json& per_tensor, double pad) const {
    std::vector<double> v(static_cast<std::size_t>(n), pad);
    REQUIRE(per_tensor.size() == tensors.size());
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const auto x = per_tensor[k].get<std::vector<double>>();
      REQUIRE(static_cast<std::int64_t>(x.size()) == tensors[k].size());
      std::copy(x.begin(), x.end(), v.begin() + tensors[k].begin);
    }
    return v;
  }
  /// The initial parameters.
  std::vector<double> params0() const { return flat(doc.at("params0"), padding_value); }
  /// The gradients of step t (0-based); NaN in the padding, which no
  /// optimizer may read into a parameter.
  std::vector<double> grads(int t) const { return flat(doc.at("grads").at(t), std::nan("")); }
  /// The steps recorded.
  int steps() const { return static_cast<int>(doc.at("grads").size()); }
};

/// Largest |got - want| / |want| (|got| where want is exactly 0) over
/// want's elements; infinite if a value got is not finite.
inline double reference_rel_error(const double* got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = std::abs(got[i] - want[i]);
    worst = std::max(worst, want[i] == 0 ? d : d / std::abs(want[i]));
  }
  return worst;
}

}  // namespace tessera::testing
