#pragma once
// The multi-rank test bodies, written once and run under both communicators
// (STYLE.md, "Tests"): tests/comm/local.cpp runs them on threads
// (local_world::run, world sizes 1..4), tests/mpi/collectives.cpp under
// mpirun -np 1..4. Bodies report failure by throwing suite_failure (Catch2 v2
// assertions are not thread-safe), naming the rank and the values.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/device_mesh.hpp>

namespace comm_suite {

using namespace tessera::comm;
using tessera::detail::str;

struct suite_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... A>
void check(bool cond, const A&... a) {
  if (!cond) throw suite_failure(str(a...));
}

// Seeded input of rank r, element i: every rank can compute every rank's input.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
template <class T>
T input(std::uint64_t seed, int r, std::size_t i) {
  const std::uint64_t h = mix(seed * 1000003ULL + static_cast<std::uint64_t>(r) * 7919ULL + i);
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);  // [-1, 1)
  else
    return static_cast<T>(static_cast<std::int64_t>(h % 2001) - 1000);  // [-1000, 1000]
}
template <class T>
const char* tname() {
  return to_string(dtype_of<T>());
}

// The serial reference of element i of a reduction over N ranks. With
// `ring_order` the sum is accumulated in the local ring's order for chunk c
// (x[c+1] + x[c+2] + ... + x[c], each step received + own), which must match
// bit for bit; otherwise rank order.
template <class T>
T reference(std::uint64_t seed, int N, std::size_t i, int chunk_owner, reduce_op op,
            bool ring_order) {
  T acc = input<T>(seed, ring_order ? (chunk_owner + 1) % N : 0, i);
  for (int k = 1; k < N; ++k) {
    const int r = ring_order ? (chunk_owner + 1 + k) % N : k;
    const T x = input<T>(seed, r, i);
    acc = op == reduce_op::sum ? acc + x : (acc < x ? x : acc);
  }
  return acc;
}
// Tolerance of a float sum of N values in [-1, 1) against the ring order:
// float32 1e-5 relative to the sum of magnitudes (<= N), float64 1e-12
// (DESIGN.md principle 6); integers and max are exact.
template <class T>
double tolerance(int N) {
  if constexpr (std::is_same_v<T, float>)
    return 1e-5 * N;
  else if constexpr (std::is_same_v<T, double>)
    return 1e-12 * N;
  else
    return 0.0;
}
template <class T>
bool close(T got, T want, double tol, bool exact) {
  if (exact || tol == 0.0) return std::memcmp(&got, &want, sizeof(T)) == 0;
  return std::fabs(static_cast<double>(got) - static_cast<double>(want)) <= tol;
}

// ---------------------------------------------------------------------------------------
template <class T, class Comm>
void all_reduce_case(Comm& c, std::size_t n, reduce_op op, bool ring_order) {
  const int N = c.size(), r = c.rank();
  const std::uint64_t seed = n * 31 + static_cast<std::uint64_t>(op) * 7 + sizeof(T);
  std::vector<T> buf(n);
  for (std::size_t i = 0; i < n; ++i) buf[i] = input<T>(seed, r, i);
  const auto before = c.stats();
  c.all_reduce(buf.data(), n, op);
  const auto after = c.stats();
  for (std::size_t i = 0; i < n; ++i) {
    int owner = 0;
    while (owner + 1 < N && ring_chunk(n, N, owner + 1).offset <= i) ++owner;
    const T want = reference<T>(seed, N, i, owner, op, ring_order);
    check(close(buf[i], want, tolerance<T>(N), ring_order || op == reduce_op::max), "rank ", r,
          " of ", N, ": all_reduce<", tname<T>(), ">(n=", n, ", ", to_string(op), ")[", i,
          "] = ", buf[i], ", reference ", want);
  }
  // Traffic: the ring sends 2(N-1)/N of the buffer, to within the rounding of
  // the chunks (each of the two chunks left out differs from n/N by < 1).
  const std::uint64_t sent = after.all_reduce.bytes - before.all_reduce.bytes;
  check(after.all_reduce.calls == before.all_reduce.calls + 1, "rank ", r,
        ": all_reduce not counted as one call");
  check(sent == ring_all_reduce_bytes(n, sizeof(T), N, r), "rank ", r, " of ", N,
        ": all_reduce n=", n, " counted ", sent, " bytes, ring formula ",
        ring_all_reduce_bytes(n, sizeof(T), N, r));
  const double ideal = 2.0 * (N - 1) / N * static_cast<double>(n * sizeof(T));
  check(std::fabs(static_cast<double>(sent) - ideal) <= 2.0 * sizeof(T), "rank ", r, " of ", N,
        ": all_reduce n=", n, " sent ", sent, " bytes, 2(N-1)/N * bytes = ", ideal);
}

template <class Comm>
void all_reduce_matches_reference(Comm& c, bool ring_order) {
  for (std::size_t n : {0, 1, 7, 1001}) {
    for (auto op : {reduce_op::sum, reduce_op::max}) {
      all_reduce_case<float>(c, n, op, ring_order);
      all_reduce_case<double>(c, n, op, ring_order);
      all_reduce_case<std::int64_t>(c, n, op, ring_order);
    }
  }
  // Same inputs, same bits: run to run and rank to rank.
  std::vector<float> a(1001), b(1001);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = input<float>(99, c.rank(), i);
  c.all_reduce(a.data(), a.size(), reduce_op::sum);
  c.all_reduce(b.data(), b.size(), reduce_op::sum);
  check(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "rank ", c.rank(),
        ": two all_reduce of the same input differ");
  std::uint64_t h = 0;
  for (float x : a) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    h = mix(h ^ u);
  }
  std::vector<std::uint64_t> hs(static_cast<std::size_t>(c.size()));
  c.all_gather(&h, hs.data(), 1);
  for (int q = 0; q < c.size(); ++q)
    check(hs[static_cast<std::size_t>(q)] == h, "rank ", c.rank(),
          ": all_reduce result bits differ from rank ", q);
}

template <class T, class Comm>
void reduce_scatter_case(Comm& c, std::size_t chunk, reduce_op op, bool ring_order, bool in_place) {
  const int N = c.size(), r = c.rank();
  const std::size_t n = chunk * static_cast<std::size_t>(N);
  const std::uint64_t seed = 5000 + chunk * 3 + static_cast<std::uint64_t>(op);
  std::vector<T> send(n), recv(chunk, T(-77));
  for (std::size_t i = 0; i < n; ++i) send[i] = input<T>(seed, r, i);
  T* out = in_place ? send.data() + static_cast<std::size_t>(r) * chunk : recv.data();
  const auto before = c.stats();
  c.reduce_scatter(send.data(), out, chunk, op);
  const auto sent = c.stats().reduce_scatter.bytes - before.reduce_scatter.bytes;
  for (std::size_t j = 0; j < chunk; ++j) {
    const std::size_t i = static_cast<std::size_t>(r) * chunk + j;
    const T want = reference<T>(seed, N, i, r, op, ring_order);
    check(close(out[j], want, tolerance<T>(N), ring_order || op == reduce_op::max), "rank ", r,
          " of ", N, ": reduce_scatter<", tname<T>(), ">(chunk=", chunk, ", ", to_string(op),
          in_place ? ", in place" : "", ")[", j, "] = ", out[j], ", reference ", want);
  }
  check(sent == ring_scatter_gather_bytes(chunk, sizeof(T), N), "rank ", r,
        ": reduce_scatter counted ", sent, " bytes, expected (N-1)*chunk*sizeof(T) = ",
        ring_scatter_gather_bytes(chunk, sizeof(T), N));
}

template <class Comm>
void reduce_scatter_matches_reference(Comm& c, bool ring_order) {
  for (std::size_t chunk : {1, 7, 250})
    for (auto op : {reduce_op::sum, reduce_op::max})
      for (bool in_place : {false, true}) {
        reduce_scatter_case<float>(c, chunk, op, ring_order, in_place);
        reduce_scatter_case<double>(c, chunk, op, ring_order, in_place);
        reduce_scatter_case<std::int64_t>(c, chunk, op, ring_order, in_place);
      }
}

template <class T, class Comm>
void all_gather_case(Comm& c, std::size_t chunk, bool in_place) {
  const int N = c.size(), r = c.rank();
  std::vector<T> send(chunk), recv(chunk * static_cast<std::size_t>(N), T(-77));
  for (std::size_t j = 0; j < chunk; ++j) send[j] = input<T>(chunk, r, j);
  const T* src = send.data();
  if (in_place) {
    std::memcpy(recv.data() + static_cast<std::size_t>(r) * chunk, send.data(), chunk * sizeof(T));
    src = recv.data() + static_cast<std::size_t>(r) * chunk;
  }
  const auto before = c.stats();
  c.all_gather(src, recv.data(), chunk);
  const auto sent = c.stats().all_gather.bytes - before.all_gather.bytes;
  for (int q = 0; q < N; ++q)
    for (std::size_t j = 0; j < chunk; ++j)
      check(recv[static_cast<std::size_t>(q) * chunk + j] == input<T>(chunk, q, j), "rank ", r,
            ": all_gather<", tname<T>(), ">(chunk=", chunk, in_place ? ", in place" : "",
            ") block ", q, "[", j, "] wrong");
  check(sent == ring_scatter_gather_bytes(chunk, sizeof(T), N), "rank ", r, ": all_gather counted ",
        sent, " bytes");
}

template <class Comm>
void all_gather_matches_reference(Comm& c) {
  for (std::size_t chunk : {1, 7, 250})
    for (bool in_place : {false, true}) {
      all_gather_case<float>(c, chunk, in_place);
      all_gather_case<double>(c, chunk, in_place);
      all_gather_case<std::int64_t>(c, chunk, in_place);
    }
}

template <class T, class Comm>
void broadcast_case(Comm& c, std::size_t n, int root) {
  const int N = c.size(), r = c.rank();
  std::vector<T> buf(n);
  for (std::size_t i = 0; i < n; ++i) buf[i] = r == root ? input<T>(n, root, i) : T(-77);
  const auto before = c.stats();
  c.broadcast(buf.data(), n, root);
  const auto sent = c.stats().broadcast.bytes - before.broadcast.bytes;
  for (std::size_t i = 0; i < n; ++i)
    check(buf[i] == input<T>(n, root, i), "rank ", r, ": broadcast<", tname<T>(), ">(n=", n,
          ", root ", root, ")[", i, "] wrong");
  check(sent == chain_broadcast_bytes(n, sizeof(T), N, r, root), "rank ", r, ": broadcast counted ",
        sent, " bytes");
}

template <class Comm>
void broadcast_matches_reference(Comm& c) {
  for (std::size_t n : {1, 7, 1001})
    for (int root = 0; root < c.size(); ++root) {
      broadcast_case<float>(c, n, root);
      broadcast_case<double>(c, n, root);
      broadcast_case<std::int64_t>(c, n, root);
    }
}

template <class Comm>
void send_recv_ring(Comm& c) {
  const int N = c.size(), r = c.rank();
  if (N == 1) return;
  const int right = (r + 1) % N, left = (r + N - 1) % N;
  std::vector<double> out(13), in(13, -1.0);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = input<double>(3, r, i);
  const auto before = c.stats();
  // Post the receive first and send after: works for buffered and rendezvous sends.
  auto rq = c.irecv(in.data(), in.size(), left, 42);
  c.send(out.data(), out.size(), right, 42);
  rq.wait();
  check(rq.test(), "rank ", r, ": irecv not complete after wait()");
  for (std::size_t i = 0; i < in.size(); ++i)
    check(in[i] == input<double>(3, left, i), "rank ", r, ": recv from ", left, " [", i, "] wrong");
  const auto s = c.stats();
  check(s.send.bytes - before.send.bytes == out.size() * sizeof(double), "rank ", r,
        ": send counted ", s.send.bytes - before.send.bytes, " bytes");
  check(s.recv.calls == before.recv.calls + 1 && s.recv.bytes == before.recv.bytes, "rank ", r,
        ": recv counters wrong");
}

// Every asynchronous form, several in flight at once, against the blocking results.
template <class Comm>
void async_forms(Comm& c, bool ring_order) {
  const int N = c.size(), r = c.rank();
  const std::size_t n = 1001, chunk = 7;
  std::vector<float> a(n), b(n), ref(n);
  std::vector<std::int64_t> rs_send(chunk * static_cast<std::size_t>(N)), rs_recv(chunk);
  std::vector<double> ag_send(chunk), ag_recv(chunk * static_cast<std::size_t>(N));
  std::vector<std::int64_t> bc(5, r == N - 1 ? 123 : 0);
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] = ref[i] = input<float>(11, r, i);
  for (std::size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = input<std::int64_t>(12, r, i);
  for (std::size_t i = 0; i < chunk; ++i) ag_send[i] = input<double>(13, r, i);
  c.all_reduce(ref.data(), n, reduce_op::sum);

  auto h1 = c.iall_reduce(a.data(), n, reduce_op::sum);
  auto h2 = c.ireduce_scatter(rs_send.data(), rs_recv.data(), chunk, reduce_op::sum);
  auto h3 = c.iall_gather(ag_send.data(), ag_recv.data(), chunk);
  auto h4 = c.ibroadcast(bc.data(), bc.size(), N - 1);
  auto h5 = c.iall_reduce(b.data(), n, reduce_op::max);
  auto h6 = c.ibarrier();
  h6.wait();
  h5.wait();
  h4.wait();
  h3.wait();
  h2.wait();
  h1.wait();
  check(h1.test() && h6.test(), "rank ", r, ": test() false after wait()");
  // A blocking collective issued while an asynchronous one is pending runs
  // after it, on every rank alike.
  std::vector<double> d1(33, 1.0), d2(5, 2.0);
  auto h7 = c.iall_reduce(d1.data(), d1.size(), reduce_op::sum);
  c.all_reduce(d2.data(), d2.size(), reduce_op::sum);
  h7.wait();
  check(d1[32] == N && d2[4] == 2.0 * N, "rank ", r, ": mixed async/blocking order wrong");
  for (std::size_t i = 0; i < n; ++i) {
    check(close(a[i], ref[i], tolerance<float>(N), ring_order), "rank ", r,
          ": iall_reduce differs from all_reduce at ", i);
    check(b[i] == reference<float>(11, N, i, 0, reduce_op::max, false), "rank ", r,
          ": iall_reduce(max) wrong at ", i);
  }
  for (std::size_t j = 0; j < chunk; ++j)
    check(rs_recv[j] == reference<std::int64_t>(12, N, static_cast<std::size_t>(r) * chunk + j, r,
                                                reduce_op::sum, false),
          "rank ", r, ": ireduce_scatter wrong at ", j);
  for (int q = 0; q < N; ++q)
    for (std::size_t j = 0; j < chunk; ++j)
      check(ag_recv[static_cast<std::size_t>(q) * chunk + j] == input<double>(13, q, j), "rank ", r,
            ": iall_gather wrong");
  for (auto x : bc) check(x == 123, "rank ", r, ": ibroadcast wrong");
}

// A rank that skips a collective: the others fail with comm_error within the
// timeout, naming their rank, the operation and its sequence number; then
// everyone meets on a second communicator, so nothing hangs. `names_missing`:
// the implementation can also name the missing rank (local can; MPI cannot).
template <class Comm>
void skipped_collective_times_out(Comm& c, bool names_missing) {
  const int N = c.size(), r = c.rank();
  if (N == 1) return;
  const int skipper = N - 1;
  Comm side = c.split(0, r);  // collective #0 of c
  c.set_timeout(std::chrono::milliseconds(200));
  std::vector<float> g(64, 1.0f);
  c.all_reduce(g.data(), g.size(), reduce_op::sum);  // #1, everyone
  if (r != skipper) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string msg;
    try {
      c.all_reduce(g.data(), g.size(), reduce_op::sum);  // #2, rank N-1 skips it
    } catch (const tessera::comm_error& e) {
      msg = e.what();
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check(!msg.empty(), "rank ", r, ": all_reduce #2 with rank ", skipper, " absent did not throw");
    check(secs < 10.0, "rank ", r, ": took ", secs, " s to fail, timeout is 0.2 s");
    for (const std::string& want : {str("rank ", r, " of ", N), std::string("all_reduce #2"),
                                    std::string("n=64 float"), std::string("256 bytes")})
      check(msg.find(want) != std::string::npos, "rank ", r, ": error lacks '", want, "': ", msg);
    if (names_missing)
      check(msg.find(str("rank ", skipper, " (last entered all_reduce #1")) != std::string::npos,
            "rank ", r, ": error does not name the missing rank ", skipper, ": ", msg);
  }
  side.barrier();
}

// Debug mode: ranks agree -> verify passes; rank 1 uses max where the others
// sum -> verify names collective #3 and both descriptions.
template <class Comm>
void debug_hash_names_divergence(Comm& c) {
  const int N = c.size(), r = c.rank();
  c.set_debug(true);
  std::vector<double> x(8, 1.0);
  c.all_reduce(x.data(), x.size(), reduce_op::sum);  // #0
  c.broadcast(x.data(), 3, 0);                       // #1
  c.verify_collective_hash();                        // #2 (its all-gather)
  if (N == 1) return;
  c.all_reduce(x.data(), x.size(), r == 1 ? reduce_op::max : reduce_op::sum);  // #3
  c.barrier();                                                                 // #4
  std::string msg;
  try {
    c.verify_collective_hash();
  } catch (const tessera::comm_error& e) {
    msg = e.what();
  }
  check(!msg.empty(), "rank ", r, ": verify_collective_hash missed a divergent reduction");
  for (const std::string& want :
       {std::string("at collective #3"), std::string("rank 1: all_reduce(n=8 double, max"),
        std::string("all_reduce(n=8 double, sum")})
    check(msg.find(want) != std::string::npos, "rank ", r, ": verify message lacks '", want,
          "': ", msg);
}

// device_mesh groups as sub-communicators: each of the five groups
// all-reduces its world ranks and checks the sum against the mesh's group
// lists (cp 1 unless given).
template <class Comm>
void mesh_groups_reduce(Comm& world, int dp, int tp, int pp, int cp = 1) {
  const device_mesh mesh(tessera::comm::mesh_degrees{.dp = dp, .cp = cp, .tp = tp, .pp = pp},
                         world.size());
  auto g = make_groups(world, mesh);
  const int r = world.rank();
  const auto coord = mesh.coord(r);
  auto expect = [&](Comm& sub, const std::vector<int>& members, int index, const char* name) {
    check(sub.size() == static_cast<int>(members.size()) && sub.rank() == index, "rank ", r, ": ",
          name, " group size/rank ", sub.size(), "/", sub.rank(), " expected ", members.size(), "/",
          index);
    std::int64_t v = r, want = 0;
    for (int m : members) want += m;
    sub.all_reduce(&v, 1, reduce_op::sum);
    check(v == want, "rank ", r, ": ", name, " group sum ", v, " expected ", want);
  };
  expect(g.tp, mesh.tp_group(r), coord.tp, "tp");
  expect(g.dp, mesh.dp_group(r), coord.dp, "dp");
  expect(g.pp, mesh.pp_group(r), coord.pp, "pp");
  expect(g.cp, mesh.cp_group(r), coord.cp, "cp");
  expect(g.dp_cp, mesh.dp_cp_group(r), mesh.dp_cp_index(r), "dp x cp");
  world.barrier();
}

}  // namespace comm_suite
