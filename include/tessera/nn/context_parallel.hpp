#pragma once
/// \file nn/context_parallel.hpp
/// Context parallelism (Megatron-Core's --context-parallel-size,
/// torchtitan's context_parallel): the T tokens of each sequence are split
/// over the cp ranks of a group, head-tail (core/cp_shard.hpp: rank r holds
/// chunks r and 2 cp - 1 - r of 2 cp), and causal attention, the one layer
/// that mixes tokens, runs over the group in one of two ways:
///
///   cp_kind::ring     ring attention (Liu, Zaharia and Abbeel 2023, "Ring
///                     Attention with Blockwise Transformers"): each rank
///                     keeps its queries; the key/value blocks go around
///                     the ring, each step's send started before that
///                     step's attention, partial outputs merged by their
///                     log-sum-exps. Backward, the blocks go around again
///                     with their dk/dv accumulators. Any nh, nkv.
///   cp_kind::ulysses  DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-alls
///                     trade the token split for a head split, plain
///                     attention runs on whole sequences with nh/cp heads,
///                     an all-to-all trades back. Needs cp | nh.
///
/// Every other layer is token-wise and runs on the local tokens unchanged,
/// but RoPE (which needs each token's global position: cp_shard::position),
/// the loss (its mean over the tokens of every cp rank) and the gradients
/// (summed over dp x cp).
///
/// Both compute the single-rank function: with float64 every rank's out,
/// lse, dq, dk, dv equal single-rank attention's (cut to its tokens) to
/// about 1e-12; Ulysses's are its bits unless key/value heads are
/// replicated (tests/nn/context_parallel.cpp).
///
/// The all-to-alls are sends and receives to every peer issued together
/// (one NCCL group on nccl_communicator, as NCCL's own all-to-all is;
/// isend/irecv on the host communicators): the communicator concept has no
/// all-to-all collective, and these need none.
///
/// On a GPU the group's communicator (an nccl_communicator) must be ordered
/// after the context's stream (nccl_communicator::follow(ctx.stream())):
/// the ring receives into buffers the previous step's kernels read, and
/// the host waits for each exchange before it enqueues the kernels that
/// use it.

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/cp_shard.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/detail/cp_exchange.hpp"
#include "tessera/nn/detail/ring_attention.hpp"
#include "tessera/nn/detail/ulysses_attention.hpp"

namespace tessera::nn {

// ---- a rank's tokens ----------------------------------------------------------------------

/// Cuts this rank's tokens out of a whole tensor: local (outer, T/cp,
/// width) = the rows of whole (outer, T, width) at the positions of `s`, in
/// head-tail order (chunk s.index(0), then s.index(1)). For q, k, v, x:
/// outer B, width heads*hd or H; lse: outer B nh, width 1; doc_start: outer
/// B, width 1. Both in `ctx`'s memory, not overlapping. Precondition:
/// `s` from cp_shard::of (2 cp divides T).
template <class U, class Ctx>
void shard_tokens(const Ctx& ctx, const cp_shard& s, U* local, const U* whole, std::int64_t outer,
                  std::int64_t width) {
  const std::int64_t c = s.chunk() * width;
  for (int j = 0; j < 2; ++j)
    kernels::copy_rows(ctx, local + j * c, s.tokens() * width, whole + s.start(j) * width,
                       s.T * width, c, outer);
}

/// The inverse: writes this rank's rows of whole (outer, T, width) from
/// local (outer, T/cp, width); the other rows are left as they are.
template <class U, class Ctx>
void unshard_tokens(const Ctx& ctx, const cp_shard& s, U* whole, const U* local, std::int64_t outer,
                    std::int64_t width) {
  const std::int64_t c = s.chunk() * width;
  for (int j = 0; j < 2; ++j)
    kernels::copy_rows(ctx, whole + s.start(j) * width, s.T * width, local + j * c,
                       s.tokens() * width, c, outer);
}

// ---- the choice and its costs -------------------------------------------------------------

/// How attention runs over the cp group (a run-time value: both are
/// compiled, a layout picks one).
enum class cp_kind : std::uint8_t {
  ring,     ///< ring attention: k/v blocks passed around; any head counts
  ulysses,  ///< all-to-all to a head split; cp must divide nh
};

/// Name of a kind ("ring", "ulysses").
constexpr const char* to_string(cp_kind k) {
  return k == cp_kind::ring ? "ring" : "ulysses";
}

/// The kind named `name` ("ring" or "ulysses"). Throws config_error naming
/// it and the valid names otherwise.
inline cp_kind parse_cp_kind(const std::string& name) {
  if (name == "ring") return cp_kind::ring;
  if (name == "ulysses") return cp_kind::ulysses;
  throw config_error("unknown context-parallel kind '" + name + "': choose ring or ulysses");
}

/// What one rank's context-parallel attention allocates and sends, for
/// element sizes given at run time (the planner's view;
/// context_parallel_attention::bytes fills it for its types). Every rank
/// of the group has the same figures. S is the whole sequence's length
/// (T), L = S/cp a rank's tokens, c = S/(2 cp) a chunk's.
///
/// Workspace: the bytes the layer holds from the context's memory resource
/// while its attention kernels run, all of it allocated at the start of a
/// call and freed at its end; the kernels' own scratch comes on top
/// (kernels::detail::attention_forward_tile_elements and friends on the
/// host, the flash kernels' scratch on a GPU).
///
/// Sent: payload bytes this rank sends per call (the communicator's
/// counters: send for the point-to-point traffic, all_gather for the
/// documents). Ring: cp - 1 key/value blocks of B L nkv hd elements each
/// forward; backward those again plus the dk, dv accumulators (float).
/// Ulysses, forward: q, k, v out and the output, lse back, (cp - 1)/cp of
/// each (B L nh hd for q; B L hk hd for k, v where hk = nkv/cp, or 1 for
/// replicated heads); backward: q, k, v, out, dout, lse out and dq, dk, dv
/// back (the record keeps the token-sharded tensors, so the head-sharded
/// ones are exchanged again). Documents: an all_gather of doc_start
/// (Ulysses only; a ring's mask needs only its own queries').
///
/// Every figure throws config_error, naming the values, for sizes the
/// layer would refuse (check()).
struct cp_attention_bytes {
  cp_kind kind = cp_kind::ring;
  std::int64_t cp = 1;
  std::int64_t B = 0, S = 0, nh = 0, nkv = 0, hd = 0;
  bool documents = false;       ///< a doc_start mask is given
  std::int64_t param = 4;       ///< bytes of the storage type T
  std::int64_t act_grad = 4;    ///< bytes of the gradient type G
  std::int64_t accum = 4;       ///< bytes of accum_t<T>
  std::int64_t param_wire = 4;  ///< bytes a T travels in (4 for 16-bit on host communicators)
  std::int64_t grad_wire = 4;   ///< bytes a G travels in

  /// Throws config_error, naming the values, unless the layer could run
  /// these sizes (the shape part of context_parallel_attention::check, with
  /// no kernels to ask): cp >= 1; B, S, nh, nkv, hd and the element sizes
  /// >= 1; nkv dividing nh; 2 cp dividing S (head-tail chunks); for
  /// Ulysses cp dividing nh, and cp dividing nkv or nkv dividing cp. Every
  /// figure below calls it first.
  void check() const {
    TESSERA_THROW_IF(cp < 1, config_error, "cp_attention_bytes: cp=", cp, " must be >= 1");
    TESSERA_THROW_IF(B < 1 || S < 1 || nh < 1 || nkv < 1 || hd < 1, config_error,
                     "cp_attention_bytes: every size must be >= 1, got B=", B, " S=", S, " nh=", nh,
                     " nkv=", nkv, " hd=", hd);
    TESSERA_THROW_IF(
        param < 1 || act_grad < 1 || accum < 1 || param_wire < 1 || grad_wire < 1, config_error,
        "cp_attention_bytes: element sizes must be >= 1, got param=", param, " act_grad=", act_grad,
        " accum=", accum, " param_wire=", param_wire, " grad_wire=", grad_wire);
    TESSERA_THROW_IF(nh % nkv != 0, config_error, "cp_attention_bytes: nkv=", nkv,
                     " does not divide nh=", nh);
    TESSERA_THROW_IF(S % (2 * cp) != 0, config_error, "cp_attention_bytes: S=", S,
                     " is not divisible by 2*cp=", 2 * cp, " (cp=", cp,
                     "): head-tail load balancing cuts the sequence into 2*cp equal chunks");
    if (kind == cp_kind::ulysses) {
      TESSERA_THROW_IF(nh % cp != 0, config_error, "cp_attention_bytes: ulysses: cp=", cp,
                       " does not divide nh=", nh, " (each rank runs nh/cp query heads)");
      TESSERA_THROW_IF(nkv % cp != 0 && cp % nkv != 0, config_error,
                       "cp_attention_bytes: ulysses: neither of cp=", cp, " and nkv=", nkv,
                       " divides the other");
    }
  }

  /// Workspace of forward().
  [[nodiscard]] std::int64_t forward_workspace() const {
    check();
    if (kind == cp_kind::ring) {
      const ring r = ring_sizes();
      return 2 * r.nq * param + (documents ? 2 * B * r.c * 4 : 0) +
             std::min<std::int64_t>(cp, 2) * 4 * r.nk * param_wire + narrowed(r) +
             3 * (r.nq + r.nl) * accum;
    }
    const heads h = ulysses();
    return 2 * (h.nqh + h.nkh) * param + h.nlh * accum +
           2 * cp * std::max({h.q * param_wire, h.kv * param_wire, h.lse * accum}) + docs();
  }
  /// Workspace of backward().
  [[nodiscard]] std::int64_t backward_workspace() const {
    check();
    if (kind == cp_kind::ring) {
      const ring r = ring_sizes();
      return 4 * r.nq * param + 2 * r.nl * accum + (documents ? 2 * B * r.c * 4 : 0) +
             4 * r.nq * accum + (act_grad != accum ? std::max(2 * r.nq, 4 * r.nk) * act_grad : 0) +
             std::min<std::int64_t>(cp, 2) * 4 * r.nk * param_wire + narrowed(r) +
             4 * r.nk * accum + (cp > 1 ? 8 * r.nk * accum : 0) + (cp > 2 ? 4 * r.nk * accum : 0) +
             2 * r.nk * accum;
    }
    const heads h = ulysses();
    const std::int64_t gk = h.staged ? accum : act_grad, gkw = h.staged ? accum : grad_wire;
    return 2 * (h.nqh + h.nkh) * param + h.nlh * accum + 2 * (h.nqh + h.nkh) * gk +
           (h.staged ? h.nqh * act_grad + B * (S / cp) * nkv * hd * accum : 0) +
           2 * cp *
               std::max({h.q * param_wire, h.kv * param_wire, h.lse * accum, h.q * grad_wire,
                         h.kv * gkw}) +
           docs();
  }
  /// Bytes this rank sends in forward().
  [[nodiscard]] std::int64_t forward_sent() const {
    check();
    if (kind == cp_kind::ring) return (cp - 1) * 4 * ring_sizes().nk * param_wire;
    const heads h = ulysses();
    return (cp - 1) * (2 * h.q * param_wire + 2 * h.kv * param_wire + h.lse * accum) + gathered();
  }
  /// Bytes this rank sends in backward().
  [[nodiscard]] std::int64_t backward_sent() const {
    check();
    if (kind == cp_kind::ring) return (cp - 1) * 4 * ring_sizes().nk * (param_wire + accum);
    const heads h = ulysses();
    const std::int64_t gkw = h.staged ? accum : grad_wire;
    return (cp - 1) * (2 * h.q * param_wire + 2 * h.kv * param_wire + h.lse * accum +
                       2 * h.q * grad_wire + 2 * h.kv * gkw) +
           gathered();
  }

 private:
  struct ring {
    std::int64_t c, nq, nk, nl;
  };
  ring ring_sizes() const {
    const std::int64_t c = S / (2 * cp);
    return {c, B * c * nh * hd, B * c * nkv * hd, B * nh * c};
  }
  // The narrowed copy of the block in hand (16-bit on a host communicator).
  std::int64_t narrowed(const ring& r) const { return param_wire != param ? 4 * r.nk * param : 0; }
  struct heads {
    std::int64_t nqh, nkh, nlh;  // head-sharded q, k, lse elements
    std::int64_t q, kv, lse;     // one all-to-all slot of each
    bool staged;                 // replicated heads with 16-bit gradients
  };
  heads ulysses() const {
    const std::int64_t nhl = nh / cp, L = S / cp;
    const bool replicated = nkv % cp != 0;
    const std::int64_t hk = replicated ? 1 : nkv / cp;
    return {B * S * nhl * hd,
            B * S * hk * hd,
            B * nhl * S,
            B * L * nhl * hd,
            B * L * hk * hd,
            B * nhl * L,
            replicated && act_grad != accum};
  }
  std::int64_t docs() const { return documents ? 2 * B * S * 4 : 0; }
  std::int64_t gathered() const { return documents ? (cp - 1) * B * (S / cp) * 4 : 0; }
};

// ---- the layer ----------------------------------------------------------------------------

/// Causal self-attention over a context-parallel group: what a transformer
/// block calls in place of kernels::attention_forward/backward when its
/// tokens are split over `group` (not owned; it must outlive the calls).
/// Every rank of the group calls forward (and backward) together, with the
/// same sizes: they are collective.
///
/// Shapes (row-major; S = T the whole sequence's length, L = S/cp this
/// rank's tokens in head-tail order, cp_shard::of(S, cp, rank)):
/// q, out, dq, dout (B, L, nh, hd); k, v, dk, dv (B, L, nkv, hd); lse
/// (B, nh, L); doc_start (B, L) int32, each local query's document's first
/// GLOBAL position (kernels::attention_mask). Query head h reads key/value
/// head h / (nh / nkv). The same layout for both kinds.
///
/// Types: T in {float, double, bf16, fp16} as the context's kernels take it
/// (bf16/fp16 on a GPU); out rounded once from accum_t<T>; lse accum_t<T>;
/// G accum_t<T> or a 16-bit type with 16-bit T. On a host communicator
/// (local, mpi), 16-bit tensors travel as float (exact both ways).
///
/// Workspace and traffic: bytes() (cp_attention_bytes).
template <class Comm>
struct context_parallel_attention {
  using comm_type = Comm;
  Comm* group = nullptr;         ///< the cp group: the ranks that share each sequence
  cp_kind kind = cp_kind::ring;  ///< how attention runs over it

  /// Ranks of the group and this rank's index. Throw config_error when no
  /// group was given.
  [[nodiscard]] int size() const { return checked().size(); }
  [[nodiscard]] int rank() const { return checked().rank(); }
  /// This rank's tokens of sequences of S tokens (throws as cp_shard::of).
  [[nodiscard]] cp_shard shard(std::int64_t S) const { return cp_shard::of(S, size(), rank()); }

  /// Throws config_error, naming the values, unless these sizes can run:
  /// every size >= 1; 2 cp dividing S (cp_shard::of: head-tail chunks of
  /// S/(2 cp) tokens); the context's attention kernels on what each kind
  /// runs (kernels::attention_check_shape: nkv dividing nh, tiles >= 1, and
  /// on a GPU hd in {32, 64, 128} and the kernels' size limits). Ring: the
  /// chunks' shape, and every block's span (kernels::attention_check_span
  /// of each chunk's global offset: on a GPU the block kernels take
  /// positions below 2^30). Ulysses: cp dividing nh, and cp dividing nkv
  /// or nkv dividing cp (then each rank gets the one key/value head its
  /// nh/cp query heads share, replicated on cp/nkv ranks, and dk, dv are
  /// summed over the replicas), and the kernels' shape on the whole
  /// sequence with nh/cp heads. The model calls it at construction;
  /// forward and backward call it first, before any send, receive or
  /// all-to-all, so sizes that cannot run are refused by every rank alike
  /// and none is left waiting on a peer that threw. Precondition (not
  /// checkable without traffic): every rank passes the same sizes.
  template <class Ctx>
  void check(const Ctx& ctx, std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv,
             std::int64_t hd) const {
    static_assert((comm::buffer_space_of<Comm> == comm::buffer_space::host) == Ctx::host_accessible,
                  "context-parallel attention: the communicator's buffer space and the context's "
                  "memory differ (a host context takes a host communicator, a cuda_context an "
                  "nccl_communicator)");
    TESSERA_THROW_IF(B < 1 || nh < 1 || nkv < 1 || hd < 1, config_error,
                     "context-parallel attention: every size must be >= 1, got B=", B, " nh=", nh,
                     " nkv=", nkv, " hd=", hd);
    const cp_shard s = shard(S);
    if (kind == cp_kind::ring) {
      const std::int64_t c = s.chunk();
      attention_check_shape(ctx, c, nh, nkv, hd);
      // A block's span is {start of a query chunk, start of a key chunk, c};
      // the kernels' limits bound each offset alone, so checking every
      // chunk's offset as both covers every pair the ring runs.
      for (std::int64_t i = 0; i < 2 * s.cp; ++i)
        attention_check_span(ctx, c, kernels::attention_span{i * c, i * c, c});
    } else {
      attention_check_shape(ctx, S, nh, nkv, hd);
      const auto h = detail::ulysses_heads::of(s.cp, nh, nkv);
      attention_check_shape(ctx, S, h.nhl, h.hk, hd);
    }
  }

  /// Forward: out and lse of this rank's queries against the keys of the
  /// whole sequence at or before them (within their documents under a
  /// mask), the same values single-rank attention gives these tokens.
  /// - `out` (B, L, nh, hd) T: written. `lse` (B, nh, L) accum_t<T>:
  ///   written, natural-log log-sum-exp; keep it for backward.
  /// - `q` (B, L, nh, hd), `k`, `v` (B, L, nkv, hd) T: this rank's tokens
  ///   (after RoPE at their global positions).
  /// - `mask`: doc_start (B, L) as above, or null (causal only).
  /// - Ring: cp steps; at step i this rank holds rank (r - i) mod cp's
  ///   block, starts sending it to r + 1 and receiving the next from r - 1,
  ///   then runs its two query chunks against the block's two key chunks
  ///   (chunk pairs wholly in the future skipped) in accum_t<T>, merged
  ///   into one accumulator (kernels::attention_merge), rounded once.
  ///   Ulysses: q, k, v to heads, attention over the whole sequence with
  ///   nh/cp heads, out and lse back.
  /// - Deterministic: the same bits every run for the same group size.
  /// - Aliasing: outputs must not overlap inputs.
  /// - Throws config_error as check() (before any traffic); comm_error as
  ///   the communicator (timeouts name the rank and the operation);
  ///   tessera::error if the context's resource cannot allocate.
  template <class Ctx, class T>
  void forward(const Ctx& ctx, T* out, accum_t<T>* lse, const T* q, const T* k, const T* v,
               std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
               kernels::attention_mask mask = {}) const {
    check(ctx, B, S, nh, nkv, hd);
    if (kind == cp_kind::ring)
      detail::ring_attention_forward(ctx, checked(), out, lse, q, k, v, B, S, nh, nkv, hd,
                                     mask.doc_start);
    else
      detail::ulysses_attention_forward(ctx, checked(), out, lse, q, k, v, B, S, nh, nkv, hd,
                                        mask.doc_start);
  }

  /// Backward: dq, dk, dv of this rank's tokens (=, written), the same
  /// values single-rank attention_backward gives them.
  /// - `dq` (B, L, nh, hd), `dk`, `dv` (B, L, nkv, hd) G: written; dk, dv
  ///   summed over every rank's queries that see these keys.
  /// - `dout` (B, L, nh, hd) G; `q`, `k`, `v`, `out`, `lse`, `mask`: as
  ///   given to and returned by forward() (the same kind and group).
  /// - Ring: the blocks go around again, each with a float dk/dv
  ///   accumulator ([dk, dv] of the block, accum_t<T>) that every rank
  ///   adds its part to (attention_backward on the block, dq accumulated
  ///   in accum_t<T> with attention_dq::accumulate) before passing it on;
  ///   after cp - 1 hops each accumulator is back at its block's owner,
  ///   which adds its own part and rounds once. Ulysses: q, k, v, out,
  ///   dout and lse to heads, attention_backward, dq, dk, dv back (summed
  ///   over replicated key/value heads in accum_t<T>, rounded once).
  /// - Deterministic; aliasing and throws as forward().
  template <class Ctx, class T, class G>
  void backward(const Ctx& ctx, G* dq, G* dk, G* dv, const G* dout, const T* q, const T* k,
                const T* v, const T* out, const accum_t<T>* lse, std::int64_t B, std::int64_t S,
                std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                kernels::attention_mask mask = {}) const {
    static_assert(std::is_same_v<G, accum_t<T>> || (is_half_v<G> && is_half_v<T>),
                  "context-parallel attention: the gradient type G must be accum_t<T>, or "
                  "16-bit with 16-bit storage (as kernels::attention_backward)");
    check(ctx, B, S, nh, nkv, hd);
    if (kind == cp_kind::ring)
      detail::ring_attention_backward(ctx, checked(), dq, dk, dv, dout, q, k, v, out, lse, B, S, nh,
                                      nkv, hd, mask.doc_start);
    else
      detail::ulysses_attention_backward(ctx, checked(), dq, dk, dv, dout, q, k, v, out, lse, B, S,
                                         nh, nkv, hd, mask.doc_start);
  }

  /// The workspace and traffic of forward and backward with storage T and
  /// gradients G on this group (cp_attention_bytes).
  template <class T, class G = accum_t<T>>
  [[nodiscard]] cp_attention_bytes bytes(std::int64_t B, std::int64_t S, std::int64_t nh,
                                         std::int64_t nkv, std::int64_t hd,
                                         bool documents = false) const {
    using A = accum_t<T>;
    return {kind,
            size(),
            B,
            S,
            nh,
            nkv,
            hd,
            documents,
            static_cast<std::int64_t>(sizeof(T)),
            static_cast<std::int64_t>(sizeof(G)),
            static_cast<std::int64_t>(sizeof(A)),
            static_cast<std::int64_t>(sizeof(detail::cp_wire_t<Comm, T>)),
            static_cast<std::int64_t>(sizeof(detail::cp_wire_t<Comm, G>))};
  }

 private:
  Comm& checked() const {
    TESSERA_THROW_IF(group == nullptr, config_error,
                     "context_parallel_attention: no cp group (set `group` to the rank's cp "
                     "communicator)");
    return *group;
  }
};

/// Throws config_error, naming the values, unless sequences of S tokens
/// with nh query and nkv key/value heads (a tp rank's) can run under
/// context parallelism of `cp` ranks of `kind`: 2 cp dividing S
/// (cp_shard::of), and for Ulysses cp dividing nh and one of cp and nkv
/// dividing the other. What the trainer checks before any group exists;
/// context_parallel_attention::check adds the kernels' limits.
inline void check_context_parallel(cp_kind kind, int cp, std::int64_t S, std::int64_t nh,
                                   std::int64_t nkv) {
  (void)cp_shard::of(S, cp, 0);
  if (kind == cp_kind::ulysses) (void)detail::ulysses_heads::of(cp, nh, nkv);
}

// ---- as a model calls it ------------------------------------------------------------------

/// The context-parallel attention a model's blocks call, for its context
/// `Ctx`, storage `T` and gradient type `G`, with the group's communicator
/// hidden behind one virtual call per block and micro-batch, so that a
/// model's type does not depend on the cp group's (nn::llama's
/// set_context_parallel). Shapes, collectives, results and throws: those
/// of context_parallel_attention's check, forward and backward.
template <class Ctx, class T, class G>
class cp_attention_for {
 public:
  virtual ~cp_attention_for() = default;
  /// Ranks of the cp group and this rank's index.
  [[nodiscard]] virtual int size() const = 0;
  [[nodiscard]] virtual int rank() const = 0;
  /// How attention runs over the group.
  [[nodiscard]] virtual cp_kind kind() const = 0;
  /// This rank's tokens of sequences of S tokens (throws as cp_shard::of).
  [[nodiscard]] cp_shard shard(std::int64_t S) const { return cp_shard::of(S, size(), rank()); }
  virtual void check(const Ctx& ctx, std::int64_t B, std::int64_t S, std::int64_t nh,
                     std::int64_t nkv, std::int64_t hd) const = 0;
  virtual void forward(const Ctx& ctx, T* out, accum_t<T>* lse, const T* q, const T* k, const T* v,
                       std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv,
                       std::int64_t hd, kernels::attention_mask mask) const = 0;
  virtual void backward(const Ctx& ctx, G* dq, G* dk, G* dv, const G* dout, const T* q, const T* k,
                        const T* v, const T* out, const accum_t<T>* lse, std::int64_t B,
                        std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                        kernels::attention_mask mask) const = 0;
  /// Workspace and traffic of one forward and backward (cp_attention_bytes).
  [[nodiscard]] virtual cp_attention_bytes bytes(std::int64_t B, std::int64_t S, std::int64_t nh,
                                                 std::int64_t nkv, std::int64_t hd,
                                                 bool documents) const = 0;
};

/// cp_attention_for over `attention`'s group (not owned: it must outlive
/// this object and every call).
template <class Comm, class Ctx, class T, class G>
class cp_attention_over final : public cp_attention_for<Ctx, T, G> {
 public:
  explicit cp_attention_over(context_parallel_attention<Comm> attention) : a_(attention) {}
  [[nodiscard]] int size() const override { return a_.size(); }
  [[nodiscard]] int rank() const override { return a_.rank(); }
  [[nodiscard]] cp_kind kind() const override { return a_.kind; }
  void check(const Ctx& ctx, std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv,
             std::int64_t hd) const override {
    a_.check(ctx, B, S, nh, nkv, hd);
  }
  void forward(const Ctx& ctx, T* out, accum_t<T>* lse, const T* q, const T* k, const T* v,
               std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
               kernels::attention_mask mask) const override {
    a_.forward(ctx, out, lse, q, k, v, B, S, nh, nkv, hd, mask);
  }
  void backward(const Ctx& ctx, G* dq, G* dk, G* dv, const G* dout, const T* q, const T* k,
                const T* v, const T* out, const accum_t<T>* lse, std::int64_t B, std::int64_t S,
                std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                kernels::attention_mask mask) const override {
    a_.backward(ctx, dq, dk, dv, dout, q, k, v, out, lse, B, S, nh, nkv, hd, mask);
  }
  [[nodiscard]] cp_attention_bytes bytes(std::int64_t B, std::int64_t S, std::int64_t nh,
                                         std::int64_t nkv, std::int64_t hd,
                                         bool documents) const override {
    return a_.template bytes<T, G>(B, S, nh, nkv, hd, documents);
  }

 private:
  context_parallel_attention<Comm> a_;
};

}  // namespace tessera::nn
