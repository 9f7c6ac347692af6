#pragma once
/// \file core/dispatch.hpp
/// From a name chosen at run time (a command line's "--optimizer sgd") to
/// a type chosen at compile time, once: `pick` calls a generic function
/// with the type whose name matches, so a program names each type once
/// and every combination is instantiated where it is dispatched.

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>

#include "tessera/core/error.hpp"

namespace tessera {

/// Calls f(std::type_identity<T>{}) for the T of `T...` whose name in
/// `names` (same order) equals `name`, and returns its result (an int: an
/// exit status, a count). Throws config_error "unknown WHAT 'NAME' (valid:
/// ...)" when no name matches. Two names may select one type (aliases).
template <class... T, class F>
int pick(const char* what, const std::string& name,
         const std::array<const char*, sizeof...(T)>& names, F&& f) {
  int rc = 0;
  std::size_t i = 0;
  const bool found =
      ((names[i++] == name ? (rc = f(std::type_identity<T>{}), true) : false) || ...);
  if (found) return rc;
  std::string valid;
  for (const char* n : names) valid += (valid.empty() ? "" : ", ") + std::string(n);
  throw config_error(detail::str("unknown ", what, " '", name, "' (valid: ", valid, ")"));
}

}  // namespace tessera
