#pragma once
/// \file train/agree.hpp
/// Agreement across ranks, written once over a world reduction: `world` is
/// any callable `world(std::vector<double>& v, comm::reduce_op op)` that
/// reduces v in place so every rank of the world ends with the same result
/// (the trainer's over its tp, dp and pp groups; a program's over its world
/// communicator: world_reduction). Every function here is collective: all
/// ranks call it with vectors of the same length, and every value sent is an
/// integer below 2^53, summed against zeros or maximised, so the transfer
/// is exact in doubles.
///
/// - agree_or_throw: an operation that failed on some ranks (a write, a
///   check) ends all of them with the lowest failing rank's message and
///   error class, at once, not at a later collective's timeout.
/// - agree_settings: ranks launched with different settings (a seed, a step
///   count, a bucket size) are refused naming the setting and both values,
///   instead of training diverged replicas or hanging in a collective.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/parallel/layout.hpp"

namespace tessera::train {

/// The most bytes of a message agree_text sends; longer ones end in "...".
inline constexpr std::size_t agree_max_bytes = 1024;

/// World rank `from`'s `mine` (its first agree_max_bytes bytes, "..." marking
/// a cut; a NUL byte ends it) on every rank. `rank` is this rank's world rank.
template <class World>
std::string agree_text(World& world, int rank, int from, const std::string& mine) {
  std::vector<double> m(agree_max_bytes, 0.0);
  if (rank == from) {
    std::string t = mine;
    if (t.size() > agree_max_bytes) t = t.substr(0, agree_max_bytes - 3) + "...";
    for (std::size_t i = 0; i < t.size(); ++i) m[i] = static_cast<unsigned char>(t[i]);
  }
  world(m, comm::reduce_op::sum);
  std::string t;
  for (std::size_t i = 0; i < m.size() && m[i] != 0; ++i) t += static_cast<char>(m[i]);
  return t;
}

/// The lowest world rank for which `mine` is true, or -1 where it is false
/// on every rank.
template <class World>
int agree_lowest_rank(World& world, int rank, bool mine) {
  // -(world rank + 1), maximised: the lowest such rank.
  std::vector<double> v{mine ? -static_cast<double>(rank + 1) : -1e18};
  world(v, comm::reduce_op::max);
  return v[0] < -1e17 ? -1 : static_cast<int>(-v[0]) - 1;
}

/// Ends an operation that may have failed on some ranks (`failed` null
/// where it succeeded; a barrier when none failed): the lowest failing
/// world rank R is agreed, and every rank throws the same message, "<what>
/// failed on world rank R: <R's error>", as R's class (config_error,
/// io_error, comm_error, out_of_memory (std::bad_alloc too), else error).
/// A failing rank other than R writes its own error to stderr first, so no
/// cause is lost.
template <class World>
void agree_or_throw(World& world, int rank, std::exception_ptr failed, const std::string& what) {
  std::string why;
  char kind = '4';  // 1 config_error, 2 io_error, 3 comm_error, 5 out_of_memory, 4 other
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const config_error& e) {
      why = e.what(), kind = '1';
    } catch (const io_error& e) {
      why = e.what(), kind = '2';
    } catch (const comm_error& e) {
      why = e.what(), kind = '3';
    } catch (const out_of_memory& e) {
      why = e.what(), kind = '5';
    } catch (const std::bad_alloc&) {
      why = "out of memory: a host allocation failed (std::bad_alloc)", kind = '5';
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
      why = "unknown exception";
    }
  }
  const int r = agree_lowest_rank(world, rank, failed != nullptr);
  if (r < 0) return;
  if (failed && r != rank)
    std::fprintf(stderr, "tessera: world rank %d: %s failed here too: %s\n", rank, what.c_str(),
                 why.c_str());
  const std::string m = agree_text(world, rank, r, std::string(1, kind) + why);
  const std::string text =
      tessera::detail::str(what, " failed on world rank ", r, ": ", m.substr(1));
  switch (m.empty() ? '4' : m[0]) {
    case '1':
      throw config_error(text);
    case '2':
      throw io_error(text);
    case '3':
      throw comm_error(text);
    case '5':
      throw out_of_memory(text);
    default:
      throw error(text);
  }
}

/// Checks that every rank holds the same `settings`: each leaf of the JSON
/// (json::flatten, in key order) is hashed as "key=value" (FNV-1a, 52 bits,
/// exact in a double) and compared with world rank 0's, the lists padded to
/// the longest. Throws config_error on every rank naming `what`, the first
/// leaf in which the lowest differing rank departs from rank 0, and both
/// values: "<what> differ between ranks: seed is 7 on world rank 0 but 8 on
/// world rank 1 (...)"; a leaf only one of them holds is named as absent.
template <class World>
void agree_settings(World& world, int rank, const nlohmann::json& settings,
                    const std::string& what) {
  std::vector<std::pair<std::string, std::string>> leaves;
  const nlohmann::json flat = settings.flatten();  // "/a/b" -> leaf, in key order; kept alive
  for (const auto& [k, v] : flat.items()) leaves.emplace_back(k.substr(1), v.dump());
  auto hash = [](const std::string& t) {  // FNV-1a, 52 bits: exact in a double
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : t) h = (h ^ ch) * 1099511628211ull;
    return static_cast<double>((h >> 12) | 1);  // never 0: 0 pads a shorter list
  };
  // The longest list: every rank's is padded with zeros to it.
  std::vector<double> n{static_cast<double>(leaves.size())};
  world(n, comm::reduce_op::max);
  const auto len = static_cast<std::size_t>(n[0]);
  std::vector<double> h(len, 0.0);
  for (std::size_t i = 0; i < leaves.size(); ++i)
    h[i] = hash(leaves[i].first + "=" + leaves[i].second);
  std::vector<double> h0 = rank == 0 ? h : std::vector<double>(len, 0.0);
  world(h0, comm::reduce_op::sum);
  std::size_t first = len;  // this rank's first leaf unlike rank 0's
  for (std::size_t i = 0; i < len && first == len; ++i)
    if (h[i] != h0[i]) first = i;
  const int r = agree_lowest_rank(world, rank, first < len);
  if (r < 0) return;
  // That rank's index, then both ranks' leaves there ("key\nvalue").
  std::vector<double> at{rank == r ? static_cast<double>(first) : -1.0};
  world(at, comm::reduce_op::max);
  const auto i = static_cast<std::size_t>(at[0]);
  auto leaf = [&](std::size_t j) {
    return j < leaves.size() ? leaves[j].first + "\n" + leaves[j].second : std::string("\n");
  };
  const std::string theirs = agree_text(world, rank, r, leaf(i));
  const std::string zeros = agree_text(world, rank, 0, leaf(i));
  auto key = [](const std::string& t) { return t.substr(0, t.find('\n')); };
  auto value = [](const std::string& t) { return t.substr(t.find('\n') + 1); };
  const std::string hint = " (start every rank with the same settings)";
  if (key(theirs) == key(zeros))
    throw config_error(tessera::detail::str(what, " differ between ranks: ", key(theirs), " is ",
                                            value(zeros), " on world rank 0 but ", value(theirs),
                                            " on world rank ", r, hint));
  auto held = [&](const std::string& t, int who) {
    return key(t).empty()
               ? tessera::detail::str("world rank ", who, " has no further setting")
               : tessera::detail::str("world rank ", who, " has ", key(t), "=", value(t));
  };
  throw config_error(tessera::detail::str(what, " differ between ranks: ", held(zeros, 0),
                                          " where ", held(theirs, r), hint));
}

/// The world reduction of a rank's layout (parallel/layout.hpp): every
/// axis of the mesh, through a buffer in `ctx`'s memory. `mesh` and `ctx`
/// must outlive the returned callable.
template <class Layout, class Ctx>
auto mesh_reduction(const Layout& mesh, const Ctx& ctx) {
  return [&mesh, &ctx](std::vector<double>& v, comm::reduce_op op) {
    mesh.reduce(ctx, std::span<double>(v), parallel::axes::all(), op);
  };
}

/// A world reduction over one communicator with host buffers (an
/// mpi_communicator, a local_communicator): what a program passes to
/// agree_settings before its groups and trainer exist.
template <class C>
auto world_reduction(C& c) {
  return [&c](std::vector<double>& v, comm::reduce_op op) {
    if (c.size() > 1) c.all_reduce(v.data(), v.size(), op);
  };
}

}  // namespace tessera::train
