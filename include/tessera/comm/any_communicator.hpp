#pragma once
/// \file comm/any_communicator.hpp
/// `any_communicator<Cs...>`: one communicator type over several
/// implementations, the one in use chosen at run time (as a c10d
/// ProcessGroup is). A program that offers both `--comm local` and
/// `--comm mpi` compiles its trainers once over
/// `any_communicator<local_communicator, mpi_communicator>` instead of once
/// per communicator; each operation forwards to the held communicator
/// (one std::visit, nothing else), so its results, its byte counts, its
/// sequence numbers and its errors are that communicator's.
///
///   // on each rank, `w` its world (a local_communicator or an mpi_communicator)
///   comm::any_communicator<comm::local_communicator, comm::mpi_communicator> a(
///       w.split(0, w.rank()));                                  // this rank's world, as a copy
///   auto g = comm::make_groups(a, comm::device_mesh(2, 2, 1));  // any_communicator groups
///
/// Every Cs must keep its buffers in the same space (host or device
/// memory); a communicator's extras beyond the `communicator` concept
/// (a stream, grouped point-to-point operations, 16-bit elements) are not
/// offered, so code that asks for them with `requires` takes its portable
/// path.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/communicator_base.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

/// A communicator that is one of `Cs` (file comment). Movable, not
/// copyable, as the communicators are. Thread-safety: that of the held one.
template <communicator... Cs>
requires(sizeof...(Cs) >= 1) class any_communicator {
  using first = std::tuple_element_t<0, std::tuple<Cs...>>;

 public:
  /// Where the buffers of every operation live (the same for every Cs).
  static constexpr buffer_space buffers = buffer_space_of<first>;
  static_assert(((buffer_space_of<Cs> == buffers) && ...),
                "any_communicator: every communicator must keep its buffers in the same memory");

  /// The handle of an asynchronous operation: the held communicator's.
  class request {
   public:
    request() = default;
    template <class R>
    explicit request(R r) : r_(std::move(r)) {}
    /// Blocks until the operation finishes; rethrows its error.
    void wait() {
      std::visit(
          [](auto& r) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(r)>, std::monostate>) r.wait();
          },
          r_);
    }
    /// True once the operation finished (successfully or not).
    [[nodiscard]] bool test() {
      return std::visit(
          [](auto& r) -> bool {
            if constexpr (std::is_same_v<std::decay_t<decltype(r)>, std::monostate>)
              return true;
            else
              return r.test();
          },
          r_);
    }

   private:
    std::variant<std::monostate, decltype(std::declval<Cs&>().ibarrier())...> r_;
  };
  // One request type per communicator (every operation's is its ibarrier's),
  // and a different one for each, so a request knows whose it is.
  static_assert(
      ((std::is_same_v<decltype(std::declval<Cs&>().iall_reduce(std::declval<float*>(), 0,
                                                                reduce_op::sum)),
                       decltype(std::declval<Cs&>().ibarrier())> &&
        std::is_same_v<decltype(std::declval<Cs&>().isend(std::declval<const float*>(), 0, 0, 0)),
                       decltype(std::declval<Cs&>().ibarrier())>)&&...),
      "any_communicator: each communicator must return one request type from every operation");

  /// Holds `c` (moved in).
  template <class C>
  requires(std::is_same_v<C, Cs> || ...) explicit any_communicator(C c)
      : c_(std::in_place_type<C>, std::move(c)) {}
  any_communicator(any_communicator&&) noexcept = default;
  any_communicator& operator=(any_communicator&&) noexcept = default;

  /// Whether the held communicator is a `C`; and it (get() throws
  /// tessera::error when another is held).
  template <class C>
  [[nodiscard]] bool holds() const {
    return std::holds_alternative<C>(c_);
  }
  template <class C>
  C& get() {
    TESSERA_THROW_IF(!holds<C>(), error, "any_communicator::get: it holds another communicator");
    return std::get<C>(c_);
  }

  [[nodiscard]] int rank() const {
    return on([](const auto& c) { return c.rank(); });
  }
  [[nodiscard]] int size() const {
    return on([](const auto& c) { return c.size(); });
  }
  [[nodiscard]] comm_stats stats() const {
    return on([](const auto& c) -> comm_stats { return c.stats(); });
  }
  [[nodiscard]] std::uint64_t bytes_sent() const {
    return on([](const auto& c) { return c.bytes_sent(); });
  }
  void reset_stats() {
    on([](auto& c) { c.reset_stats(); });
  }
  void set_timeout(std::chrono::milliseconds t) {
    on([&](auto& c) { c.set_timeout(t); });
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const {
    return on([](const auto& c) { return c.timeout(); });
  }
  void set_debug(bool b) {
    on([&](auto& c) { c.set_debug(b); });
  }
  void set_journal(bool b) {
    on([&](auto& c) { c.set_journal(b); });
  }
  [[nodiscard]] const std::vector<op_record>& journal() const {
    return on([](const auto& c) -> const std::vector<op_record>& { return c.journal(); });
  }
  void verify_collective_hash() {
    on([](auto& c) { c.verify_collective_hash(); });
  }

  template <comm_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) {
    on([&](auto& c) { c.all_reduce(buf, n, op); });
  }
  template <comm_element T>
  void reduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    on([&](auto& c) { c.reduce_scatter(send, recv, chunk, op); });
  }
  template <comm_element T>
  void all_gather(const T* send, T* recv, std::size_t chunk) {
    on([&](auto& c) { c.all_gather(send, recv, chunk); });
  }
  template <comm_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    on([&](auto& c) { c.broadcast(buf, n, root); });
  }
  template <comm_element T>
  void send(const T* buf, std::size_t n, int peer, int tag) {
    on([&](auto& c) { c.send(buf, n, peer, tag); });
  }
  template <comm_element T>
  void recv(T* buf, std::size_t n, int peer, int tag) {
    on([&](auto& c) { c.recv(buf, n, peer, tag); });
  }
  void barrier() {
    on([](auto& c) { c.barrier(); });
  }

  template <comm_element T>
  request iall_reduce(T* buf, std::size_t n, reduce_op op) {
    return on([&](auto& c) { return request(c.iall_reduce(buf, n, op)); });
  }
  template <comm_element T>
  request ireduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    return on([&](auto& c) { return request(c.ireduce_scatter(send, recv, chunk, op)); });
  }
  template <comm_element T>
  request iall_gather(const T* send, T* recv, std::size_t chunk) {
    return on([&](auto& c) { return request(c.iall_gather(send, recv, chunk)); });
  }
  template <comm_element T>
  request ibroadcast(T* buf, std::size_t n, int root) {
    return on([&](auto& c) { return request(c.ibroadcast(buf, n, root)); });
  }
  template <comm_element T>
  request isend(const T* buf, std::size_t n, int peer, int tag) {
    return on([&](auto& c) { return request(c.isend(buf, n, peer, tag)); });
  }
  template <comm_element T>
  request irecv(T* buf, std::size_t n, int peer, int tag) {
    return on([&](auto& c) { return request(c.irecv(buf, n, peer, tag)); });
  }
  request ibarrier() {
    return on([](auto& c) { return request(c.ibarrier()); });
  }

  /// The held communicator's split, held as an any_communicator.
  /// Collective over this communicator.
  any_communicator split(int color, int key) {
    return on([&](auto& c) { return any_communicator(c.split(color, key)); });
  }

 private:
  template <class F>
  decltype(auto) on(F&& f) {
    return std::visit(std::forward<F>(f), c_);
  }
  template <class F>
  decltype(auto) on(F&& f) const {
    return std::visit(std::forward<F>(f), c_);
  }

  std::variant<Cs...> c_;
};

}  // namespace tessera::comm
