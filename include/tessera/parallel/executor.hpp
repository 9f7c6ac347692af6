#pragma once
/// \file parallel/executor.hpp
/// The executor: runs a schedule's list of actions (parallel/schedule.hpp,
/// parallel/pipeline_schedule.hpp) for one optimizer step over this rank's
/// model chunks, each with its data-parallel engine (parallel/zero.hpp) and
/// a record pool (nn/record_pool.hpp). One executor for every schedule and
/// backend: it only calls the models', the engines', the context's and the
/// pipeline group's entry points. Without a pipeline it holds one chunk and
/// no pipeline group (the no_pipeline schedule).
///
/// Per action (chunk c of this rank, micro-batch m):
///   forward m          engine.begin_micro_batch(m, the rank's next pass is its backward);
///                      record = pool.acquire(m);
///                      model.forward(input, record, grad_scale, d_losses + m):
///                      input = feed(m) on the first virtual stage, the received
///                      hidden states elsewhere (with feed(m)'s targets on the last)
///   backward m         model.backward(record, received output gradient); release
///   backward_input m   model.backward_input(...) (B; the record kept for W)
///   backward_weight m  model.backward_weight(record); release (W)
///   send_forward m     isend of the chunk's output to the next virtual stage's rank
///   recv_forward m     recv of the chunk's input from the previous one
///   send_backward m    isend of the input gradient to the previous virtual stage
///   recv_backward m    recv of the output gradient from the next one
///   reduce_gradients   every engine's finish_gradients(); every send completed;
///                      tied embeddings under a pipeline: the tied tensor's gradient
///                      summed over the embedding group (set_tied_group; the engines'
///                      sum_tied_gradient, on the first and the last stage)
///   clip               the norm squared over every chunk, summed over the mesh
///                      (layout::reduce over dp, tp, pp); clip_coefficient(ctx,
///                      d_clip, d_sum_squares, max_norm)
///   optimizer_step     every engine's step(lr, d_clip)
/// The step starts with each model's zero_grad() and engine.begin_step(its
/// number of backwards). Every scalar stays in the context's memory: the
/// executor reads nothing back. (Waits on collectives and receives block
/// the host: a device communicator's wait returns once the transfer is done.)
///
/// Messages (p2p on the pipeline group, whose rank is the stage): chunk c
/// of rank k is virtual stage v = c K + k; a message from virtual stage v
/// carries tag 2 v (activations) or 2 v + 1 (gradients; comm/tags.hpp's
/// pipeline_tags, so K V is at most comm::pipeline_max_virtual_stages),
/// and the messages
/// of one tag go in micro-batch order on both sides (every schedule runs a
/// chunk's forwards, and its backwards, in micro-batch order), so the
/// non-overtaking rule matches them. Sends are asynchronous: the buffer is
/// kept until the send completes (at reduce_gradients at the latest).
/// Two-byte element types travel as 32-bit words (the hidden size is even).
///
/// Over a group whose send waits for its receive (a communicator with
/// `group_p2p`, nccl_communicator: NCCL's rendezvous), each message group
/// of the list (schedule.hpp's message_groups: a run of adjacent message
/// actions) is issued as one group_p2p, and the rank waits for it; every
/// schedule of pipeline_schedule.hpp completes so (pipeline_sim.hpp's
/// rendezvous transport), where one send or receive at a time could not
/// (1F1B's neighbours each send before they receive).
///
/// `feed(m)` returns micro-batch m's inputs and targets (an nn::micro_batch
/// in the context's memory). It is called once per micro-batch on a rank
/// holding the first or the last virtual stage, at that chunk's forward of
/// m, in forward order, and its buffers need only live until the next call
/// (the model copies what its backward needs); other ranks never call it.
///
/// Tracing (set_tracing): each action's start and end on the host clock
/// (after the context's stream is synchronised on a GPU), for the timeline
/// (train/trace.hpp).
///
/// On an exception the records in flight and the messages held are
/// dropped (their memory freed), the engines abandon the step
/// (abandon_step(): their reductions waited for, their buffers freed) and
/// the exception propagates; the models' gradients are then those of a
/// partial step, and the next run() starts afresh.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/tags.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/nn/llama_record.hpp"
#include "tessera/nn/record_pool.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/parallel/schedule.hpp"

namespace tessera::parallel {

/// What one step's actions need besides the models and the engines, in the
/// context's memory where it is a pointer.
template <class Acc, class Master>
struct step_inputs {
  Acc grad_scale = 1;  ///< S / scored tokens of the whole step (every rank; S the loss scale, 1 unscaled)
  double* d_losses =
      nullptr;          ///< (micro-batches) loss sum of each micro-batch, written (last stage)
  double lr = 0;        ///< learning rate of the step
  double max_norm = 0;  ///< clip threshold (<= 0: off)
  double inv_loss_scale = 1;  ///< 1 / the loss scale folded into grad_scale (unscaled at the clip)
  double* d_sum_squares = nullptr;  ///< (1) the global gradient sum of squares, written
  Master* d_clip = nullptr;         ///< (1) the clip coefficient, written
  /// (micro-batches, B, T) int32 in the context's memory, or null: the
  /// document starts of this rank's micro-batches (packed documents), which
  /// every stage's forward gets as micro_batch::doc_start (a stage without
  /// the embedding needs them as much as the first); null: none.
  const std::int32_t* d_doc_start = nullptr;
};

namespace detail {
// A pipeline message: a comm_element as itself, a two-byte type as 32-bit
// words (its count must be even: the hidden size is).
template <class C, class T>
auto p2p_isend(C& g, const T* p, std::int64_t n, int peer, int tag) {
  if constexpr (requires { g.isend(p, std::size_t{0}, 0, 0); }) {
    return g.isend(p, static_cast<std::size_t>(n), peer, tag);
  } else {
    static_assert(sizeof(T) == 2, "pipeline messages: a comm_element or a two-byte type");
    TESSERA_THROW_IF(n % 2 != 0, config_error, "pipeline message of ", n,
                     " two-byte elements: the hidden size must be even");
    return g.isend(reinterpret_cast<const std::int32_t*>(p), static_cast<std::size_t>(n / 2), peer,
                   tag);
  }
}
// The same message as one operation of a group (comm::p2p_op).
template <class T>
comm::p2p_op p2p_group_op(comm::op_kind k, T* p, std::int64_t n, int peer, int tag) {
  if constexpr (comm::comm_element<std::remove_const_t<T>>) {
    return {k,
            const_cast<void*>(static_cast<const void*>(p)),
            static_cast<std::size_t>(n),
            comm::dtype_of<std::remove_const_t<T>>(),
            peer,
            tag};
  } else {
    static_assert(sizeof(T) == 2, "pipeline messages: a comm_element or a two-byte type");
    TESSERA_THROW_IF(n % 2 != 0, config_error, "pipeline message of ", n,
                     " two-byte elements: the hidden size must be even");
    return {k,
            const_cast<void*>(static_cast<const void*>(p)),
            static_cast<std::size_t>(n / 2),
            comm::dtype::i32,
            peer,
            tag};
  }
}
template <class C, class T>
void p2p_recv(C& g, T* p, std::int64_t n, int peer, int tag) {
  if constexpr (requires { g.recv(p, std::size_t{0}, 0, 0); }) {
    g.recv(p, static_cast<std::size_t>(n), peer, tag);
  } else {
    static_assert(sizeof(T) == 2, "pipeline messages: a comm_element or a two-byte type");
    TESSERA_THROW_IF(n % 2 != 0, config_error, "pipeline message of ", n,
                     " two-byte elements: the hidden size must be even");
    g.recv(reinterpret_cast<std::int32_t*>(p), static_cast<std::size_t>(n / 2), peer, tag);
  }
}
}  // namespace detail

/// Throws config_error, naming the numbers, when a pipeline of `stages` (K)
/// ranks with `virtual_stages` (V) chunks each needs message tags past its
/// range: virtual stage v sends with tags 2 v and 2 v + 1
/// (comm::pipeline_activation_tag, pipeline_gradient_tag), which must stay
/// in comm::pipeline_tags, so K V <= comm::pipeline_max_virtual_stages
/// (3650). K = 1 sends nothing and passes. The executor calls it at
/// construction.
inline void check_pipeline_tags(int stages, int virtual_stages) {
  TESSERA_THROW_IF(stages < 1 || virtual_stages < 1, config_error, "executor: K=", stages,
                   " stages and V=", virtual_stages, " virtual stages per rank must be >= 1");
  if (stages == 1) return;
  const std::int64_t kv = std::int64_t{stages} * virtual_stages;
  TESSERA_THROW_IF(kv > comm::pipeline_max_virtual_stages, config_error, "executor: K=", stages,
                   " stages x V=", virtual_stages, " virtual stages per rank = ", kv,
                   " virtual stages, whose message tags (2v, 2v+1) would run to ", 2 * kv - 1,
                   ", past the pipeline's tag range [", comm::pipeline_tags.first, ", ",
                   comm::pipeline_tags.end, ") (comm/tags.hpp): at most ",
                   comm::pipeline_max_virtual_stages, " virtual stages");
}

/// Where this rank sits in a pipeline: its stage k of K and its model
/// chunks per rank V (virtual stages), with the pipeline group (rank =
/// stage; not owned). One rank without a pipeline: K = V = 1, no group.
template <class C>
struct pipeline_place {
  C* group = nullptr;      ///< the pp group (nullptr when K = 1)
  int stage = 0;           ///< k in [0, K)
  int stages = 1;          ///< K
  int virtual_stages = 1;  ///< V
};

/// Runs action lists over this rank's model chunks (`Model`, `Engine`;
/// both not owned).
template <class Model, class Engine>
class executor {
 public:
  using record = typename Model::record;
  using P = typename Model::precision_type;
  using Param = typename P::param_type;
  using ActGrad = typename P::act_grad_type;
  using Backend = typename Model::backend_type;
  using comm_type = std::remove_cvref_t<decltype(std::declval<Engine&>().communicator())>;
  using inputs = step_inputs<typename P::accum_type, typename P::master_type>;
  /// This rank's groups (parallel/layout.hpp).
  using layout_type = layout<comm_type, typename Model::layers_type>;
  /// True when the pipeline group's sends wait for their receives and it
  /// issues groups of them (group_p2p): the file comment's grouped path.
  static constexpr bool grouped = requires(comm_type & g, std::span<const comm::p2p_op> ops) {
    g.group_p2p(ops);
  };

  /// One chunk of this rank: its model and its engine.
  struct chunk {
    Model* model = nullptr;
    Engine* engine = nullptr;
  };

  /// This rank's V = `virtual_stages` chunks on the layout `mesh` (copied;
  /// its groups not owned): chunk c is virtual stage c K + k of K =
  /// mesh.pp() stages, with `capacity[c]` records for chunk c (the most
  /// micro-batches in flight its lists hold: peak_in_flight). One rank
  /// without a pipeline: one chunk, a layout without a pp group. Throws
  /// config_error if the counts differ, a capacity is < 1, or K V virtual
  /// stages need tags past comm::pipeline_tags (check_pipeline_tags).
  executor(std::vector<chunk> chunks, const layout_type& mesh, int virtual_stages,
           std::vector<std::int64_t> capacity)
      : chunks_(std::move(chunks)),
        mesh_(mesh),
        place_{mesh.pp() > 1 ? mesh.pp_group() : nullptr, mesh.stage(), mesh.pp(), virtual_stages} {
    check_pipeline_tags(place_.stages, place_.virtual_stages);
    TESSERA_THROW_IF(chunks_.empty() || static_cast<int>(chunks_.size()) != place_.virtual_stages,
                     config_error, "executor: ", chunks_.size(), " model chunks for ",
                     place_.virtual_stages, " virtual stages");
    TESSERA_THROW_IF(capacity.size() != chunks_.size(), config_error, "executor: ", capacity.size(),
                     " pool capacities for ", chunks_.size(), " chunks");
    for (std::int64_t c : capacity) pools_.emplace_back(c);
  }

  /// Runs one step's `actions` (file comment). Throws config_error if the
  /// list holds more micro-batches of a chunk in flight than its pool, or
  /// names a chunk this rank does not hold; what the models, the engines,
  /// the pipeline group (comm_error on a timeout, naming the peer) and the
  /// feed throw.
  template <class Feed>
  void run(const std::vector<action>& actions, Feed&& feed, const inputs& in) {
    std::vector<std::int64_t> backwards(chunks_.size(), 0);
    for (const action& a : actions) {
      TESSERA_THROW_IF(a.chunk < 0 || a.chunk >= static_cast<int>(chunks_.size()), config_error,
                       "schedule: ", to_string(a.kind), " of chunk ", a.chunk, " on a rank of ",
                       chunks_.size(), " chunks");
      backwards[static_cast<std::size_t>(a.chunk)] +=
          a.kind == action_kind::backward || a.kind == action_kind::backward_weight;
    }
    check_message_order(actions);
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const std::int64_t peak = peak_in_flight(actions, static_cast<int>(c));
      TESSERA_THROW_IF(peak > pools_[c].capacity(), config_error, "schedule holds ", peak,
                       " micro-batches of chunk ", c, " in flight, the executor's record pool ",
                       pools_[c].capacity());
    }
    timeline_.clear();
    try {
      for (std::size_t c = 0; c < chunks_.size(); ++c) {
        chunks_[c].model->zero_grad();
        chunks_[c].engine->begin_step(backwards[c] > 0 ? backwards[c] : 1);
      }
      const std::vector<bool> backward_next = backward_next_of(actions);
      for (std::size_t i = 0; i < actions.size();) {
        const double t0 = tracing_ ? now() : 0;
        std::size_t end = i + 1;
        if constexpr (grouped) {
          if (is_message(actions[i].kind)) {  // its message group (message_groups)
            while (end < actions.size() && is_message(actions[end].kind)) ++end;
            run_group(actions.data() + i, actions.data() + end);
          } else {
            run_one(actions[i], backward_next[i], feed, in);
          }
        } else {
          run_one(actions[i], backward_next[i], feed, in);
        }
        if (tracing_) {
          // The host first waits (with the timeout) for what the kernels wait for.
          for (auto& ch : chunks_) ch.engine->settle_ordered();
          context().synchronize();
          const double t1 = now();
          const auto bytes = static_cast<std::int64_t>(context().resource().stats().allocated);
          for (std::size_t j = i; j < end; ++j) timeline_.push_back({actions[j], t0, t1, bytes});
        }
        i = end;
      }
      wait_sends();
    } catch (...) {
      for (auto& p : pools_) p.clear();
      for (auto& ch : chunks_) ch.engine->abandon_step();
      drop_messages();
      throw;
    }
  }

  /// Chunk c's record pool.
  nn::record_pool<record>& pool(int c = 0) { return pools_[static_cast<std::size_t>(c)]; }
  /// Records each action's start and end from the next run() on (off: none).
  void set_tracing(bool on) { tracing_ = on; }
  /// The actions of the last run() with their times (empty unless tracing).
  const std::vector<timed_action>& timeline() const { return timeline_; }
  /// Seconds on the clock timeline() uses.
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  const pipeline_place<comm_type>& place() const { return place_; }

 private:
  using key = std::pair<int, std::int64_t>;  // (chunk, micro-batch)
  using request = decltype(std::declval<comm_type&>().isend(static_cast<const float*>(nullptr),
                                                            std::size_t{0}, 0, 0));
  // A send in flight and the buffer it reads.
  // The buffers are declared before the request, so a request destroyed
  // before completion (it waits) goes before the memory it reads.
  struct pending_send {
    tensor<Param, Backend> act;
    tensor<ActGrad, Backend> grad;
    request req;
  };

  const typename Model::context_type& context() const { return chunks_.front().model->context(); }
  // The messages of one tag are matched in order (file comment): each
  // chunk's forwards, and its backwards (or B), must run in micro-batch
  // order. Throws config_error naming the chunk and the micro-batches.
  void check_message_order(const std::vector<action>& actions) const {
    if (place_.stages == 1) return;
    std::vector<std::int64_t> fwd(chunks_.size(), -1), bwd(chunks_.size(), -1);
    for (const action& a : actions) {
      const bool f = a.kind == action_kind::forward;
      const bool b = a.kind == action_kind::backward || a.kind == action_kind::backward_input;
      if (!f && !b) continue;
      std::int64_t& last = (f ? fwd : bwd)[static_cast<std::size_t>(a.chunk)];
      TESSERA_THROW_IF(a.micro_batch <= last, config_error, "schedule: chunk ", a.chunk, "'s ",
                       to_string(a.kind), " of micro-batch ", a.micro_batch, " after micro-batch ",
                       last,
                       ": a pipeline runs each chunk's forwards and backwards in "
                       "micro-batch order (its messages are matched in order)");
      last = a.micro_batch;
    }
  }
  int virtual_stage(int c) const { return c * place_.stages + place_.stage; }
  int last_virtual_stage() const { return place_.stages * place_.virtual_stages - 1; }
  // The rank of virtual stage v (v in [0, K V)).
  int rank_of(int v) const { return v % place_.stages; }

  // For each forward of `actions`: whether the rank's next pass (forward,
  // backward, B or W of any chunk) is the backward (or B) of the same chunk
  // and micro-batch, so that a ZeRO-3 engine may prefetch for it
  // (data_parallel::begin_micro_batch).
  static std::vector<bool> backward_next_of(const std::vector<action>& actions) {
    std::vector<bool> next(actions.size(), false);
    const auto is_pass = [](action_kind k) {
      return k == action_kind::forward || k == action_kind::backward ||
             k == action_kind::backward_input || k == action_kind::backward_weight;
    };
    for (std::size_t i = 0; i < actions.size(); ++i) {
      if (actions[i].kind != action_kind::forward) continue;
      std::size_t j = i + 1;
      while (j < actions.size() && !is_pass(actions[j].kind)) ++j;
      next[i] = j < actions.size() &&
                (actions[j].kind == action_kind::backward ||
                 actions[j].kind == action_kind::backward_input) &&
                actions[j].chunk == actions[i].chunk &&
                actions[j].micro_batch == actions[i].micro_batch;
    }
    return next;
  }

  template <class Feed>
  void run_one(const action& a, bool backward_next, Feed& feed, const inputs& in) {
    const std::size_t c = static_cast<std::size_t>(a.chunk);
    Model& model = *chunks_[c].model;
    const int v = virtual_stage(a.chunk);
    const key k{a.chunk, a.micro_batch};
    switch (a.kind) {
      case action_kind::forward: {
        chunks_[c].engine->begin_micro_batch(a.micro_batch, backward_next);
        nn::micro_batch<Param> mb{};
        if (v == 0 || v == last_virtual_stage()) mb = feed(a.micro_batch);
        if (v > 0) {
          auto it = inbox_.find(k);
          TESSERA_THROW_IF(it == inbox_.end(), config_error, "schedule: forward of micro-batch ",
                           a.micro_batch, " (chunk ", a.chunk,
                           ") before its input was received (recv_forward)");
          mb.hidden = it->second.data();
          mb.inputs = nullptr;
          mb.B = mb_B_;
          mb.T = mb_T_;
        }
        if (v < last_virtual_stage()) mb.targets = nullptr;
        mb.doc_start = in.d_doc_start ? in.d_doc_start + a.micro_batch * mb_B_ * mb_T_ : nullptr;
        record& r = pools_[c].acquire(a.micro_batch);
        model.forward(mb, r, in.grad_scale, in.d_losses + a.micro_batch);
        inbox_.erase(k);
        if (v < last_virtual_stage()) out_act_[k] = std::move(r.output);
        break;
      }
      case action_kind::backward:
      case action_kind::backward_input: {
        record& r = pools_[c].at(a.micro_batch);
        const ActGrad* dout = nullptr;
        auto it = grad_inbox_.find(k);
        if (v < last_virtual_stage()) {
          TESSERA_THROW_IF(it == grad_inbox_.end(), config_error, "schedule: ", to_string(a.kind),
                           " of micro-batch ", a.micro_batch, " (chunk ", a.chunk,
                           ") before its output gradient was received (recv_backward)");
          dout = it->second.data();
        }
        if (a.kind == action_kind::backward)
          model.backward(r, dout);
        else
          model.backward_input(r, dout);
        if (it != grad_inbox_.end()) grad_inbox_.erase(it);
        if (v > 0) out_grad_[k] = std::move(r.grad_input);
        if (a.kind == action_kind::backward) pools_[c].release(a.micro_batch);
        break;
      }
      case action_kind::backward_weight:
        model.backward_weight(pools_[c].at(a.micro_batch));
        pools_[c].release(a.micro_batch);
        break;
      case action_kind::send_forward:
      case action_kind::send_backward: {
        message msg = prepare(a);
        request q = a.kind == action_kind::send_forward
                        ? isend(msg.act.data(), msg.act.numel(), msg.peer, msg.tag)
                        : isend(msg.grad.data(), msg.grad.numel(), msg.peer, msg.tag);
        sends_.push_back({std::move(msg.act), std::move(msg.grad), std::move(q)});
        poll_sends();
        break;
      }
      case action_kind::recv_forward:
      case action_kind::recv_backward: {
        message msg = prepare(a);
        if (a.kind == action_kind::recv_forward)
          recv(msg.act.data(), msg.act.numel(), msg.peer, msg.tag);
        else
          recv(msg.grad.data(), msg.grad.numel(), msg.peer, msg.tag);
        deliver(a, std::move(msg));
        break;
      }
      case action_kind::reduce_gradients:
        for (auto& ch : chunks_) ch.engine->finish_gradients();
        wait_sends();
        if (tied_group_ != nullptr)
          for (auto& ch : chunks_) ch.engine->sum_tied_gradient(*tied_group_);
        break;
      case action_kind::clip: {
        for (std::size_t i = 0; i < chunks_.size(); ++i)
          chunks_[i].engine->local_grad_norm_squared(in.d_sum_squares, i > 0);
        mesh_.reduce(in.d_sum_squares, 1, axes::all());
        clip_coefficient(context(), in.d_clip, in.d_sum_squares, in.max_norm, in.inv_loss_scale);
        break;
      }
      case action_kind::optimizer_step:
        for (auto& ch : chunks_) ch.engine->step(in.lr, in.d_clip);
        break;
    }
  }

 public:
  /// Tied embeddings under a pipeline (pp > 1): `g` is this rank's group of
  /// the embedding group split (not owned; nullptr: none), over which the
  /// reduce_gradients action sums the tied tensor's gradient of the chunks
  /// sharing it (the first stage's embedding, the last stage's copy: the
  /// two ranks of one group; the other stages' chunks share none and send
  /// nothing). Set before run(), on every rank alike.
  void set_tied_group(comm_type* g) { tied_group_ = g; }

  /// The (B, T) of every micro-batch of the steps run() will run: the
  /// stages without the embedding receive (rows, H) hidden states of it.
  /// Needed before run() when K > 1.
  void set_micro_batch(std::int64_t B, std::int64_t T) {
    mb_B_ = B;
    mb_T_ = T;
  }

 private:
  // Elements of a stage boundary's hidden states (or their gradient):
  // the residual stream's rows of one micro-batch times H.
  std::int64_t boundary_elements(const Model& m) const {
    TESSERA_THROW_IF(mb_B_ < 1 || mb_T_ < 1, config_error,
                     "executor: a pipeline stage needs the micro-batch shape (set_micro_batch)");
    return m.stream_rows(mb_B_ * mb_T_) * m.config().dim;
  }

  // A message action's buffer (a send's taken from its outbox, a receive's
  // allocated), peer and tag (the file comment's rule), with its checks:
  // one definition for the one-at-a-time and the grouped paths.
  struct message {
    tensor<Param, Backend> act;     // send_forward, recv_forward
    tensor<ActGrad, Backend> grad;  // send_backward, recv_backward
    int peer = 0, tag = 0;
  };
  message prepare(const action& a) {
    const int v = virtual_stage(a.chunk);
    const key k{a.chunk, a.micro_batch};
    const Model& model = *chunks_[static_cast<std::size_t>(a.chunk)].model;
    message m;
    switch (a.kind) {
      case action_kind::send_forward: {
        auto it = out_act_.find(k);
        TESSERA_THROW_IF(it == out_act_.end() || v == last_virtual_stage(), config_error,
                         "schedule: send_forward of micro-batch ", a.micro_batch, " (chunk ",
                         a.chunk, ") without its forward output");
        m.act = std::move(it->second);
        out_act_.erase(it);
        m.peer = rank_of(v + 1), m.tag = comm::pipeline_activation_tag(v);
        break;
      }
      case action_kind::send_backward: {
        auto it = out_grad_.find(k);
        TESSERA_THROW_IF(it == out_grad_.end() || v == 0, config_error,
                         "schedule: send_backward of micro-batch ", a.micro_batch, " (chunk ",
                         a.chunk, ") without its input gradient");
        m.grad = std::move(it->second);
        out_grad_.erase(it);
        m.peer = rank_of(v - 1), m.tag = comm::pipeline_gradient_tag(v);
        break;
      }
      case action_kind::recv_forward:
        TESSERA_THROW_IF(v == 0, config_error, "schedule: recv_forward on the first virtual stage");
        m.act = kernels::make_tensor<Param>(context(), boundary_elements(model));
        m.peer = rank_of(v - 1), m.tag = comm::pipeline_activation_tag(v - 1);
        break;
      case action_kind::recv_backward:
        TESSERA_THROW_IF(v == last_virtual_stage(), config_error,
                         "schedule: recv_backward on the last virtual stage");
        m.grad = kernels::make_tensor<ActGrad>(context(), boundary_elements(model));
        m.peer = rank_of(v + 1), m.tag = comm::pipeline_gradient_tag(v + 1);
        break;
      default:
        throw config_error(
            ::tessera::detail::str("executor: ", to_string(a.kind), " is not a message"));
    }
    return m;
  }
  // A received message into its inbox.
  void deliver(const action& a, message&& m) {
    const key k{a.chunk, a.micro_batch};
    if (a.kind == action_kind::recv_forward)
      inbox_[k] = std::move(m.act);
    else
      grad_inbox_[k] = std::move(m.grad);
  }

  // One message group as one group_p2p (the grouped path): the sends'
  // buffers live until it completed, the received ones go to the inboxes.
  void run_group(const action* first, const action* last) {
    std::vector<message> msgs;
    std::vector<comm::p2p_op> ops;
    msgs.reserve(static_cast<std::size_t>(last - first));
    for (const action* a = first; a != last; ++a) {
      message& m = msgs.emplace_back(prepare(*a));
      const bool send =
          a->kind == action_kind::send_forward || a->kind == action_kind::send_backward;
      const comm::op_kind k = send ? comm::op_kind::send : comm::op_kind::recv;
      const bool act = a->kind == action_kind::send_forward || a->kind == action_kind::recv_forward;
      ops.push_back(act ? detail::p2p_group_op(k, m.act.data(), m.act.numel(), m.peer, m.tag)
                        : detail::p2p_group_op(k, m.grad.data(), m.grad.numel(), m.peer, m.tag));
    }
    try {
      place_.group->group_p2p(std::span<const comm::p2p_op>(ops));
    } catch (...) {
      // The transport may still read or write them (drop_messages).
      new std::vector<message>(std::move(msgs));
      throw;
    }
    for (std::size_t i = 0; i < msgs.size(); ++i)
      if (first[i].kind == action_kind::recv_forward || first[i].kind == action_kind::recv_backward)
        deliver(first[i], std::move(msgs[i]));
  }

  template <class T>
  request isend(const T* p, std::int64_t n, int peer, int tag) {
    return detail::p2p_isend(*place_.group, p, n, peer, tag);
  }
  template <class T>
  void recv(T* p, std::int64_t n, int peer, int tag) {
    detail::p2p_recv(*place_.group, p, n, peer, tag);
  }
  // Frees the buffers of sends that completed.
  void poll_sends() {
    std::erase_if(sends_, [](pending_send& s) { return s.req.test(); });
  }
  void wait_sends() {
    for (auto& s : sends_) s.req.wait();
    sends_.clear();
  }
  // After a failed step: sends waited for (their errors dropped), messages freed.
  // A send that failed (a timeout) may still be read by the transport:
  // its buffer is deliberately left allocated rather than freed under it.
  void drop_messages() noexcept {
    for (auto& s : sends_) {
      try {
        s.req.wait();
      } catch (...) {
        new pending_send(std::move(s));  // leaked on purpose (see above)
      }
    }
    sends_.clear();
    inbox_.clear();
    grad_inbox_.clear();
    out_act_.clear();
    out_grad_.clear();
  }

  std::vector<chunk> chunks_;
  layout_type mesh_;
  pipeline_place<comm_type> place_;
  std::vector<nn::record_pool<record>> pools_;
  std::map<key, tensor<Param, Backend>> inbox_, out_act_;  // received inputs, outputs to send
  std::map<key, tensor<ActGrad, Backend>> grad_inbox_, out_grad_;  // received, to send
  std::vector<pending_send> sends_;
  std::vector<timed_action> timeline_;
  std::int64_t mb_B_ = 0, mb_T_ = 0;
  bool tracing_ = false;
  comm_type* tied_group_ = nullptr;  // the embedding group (tied embeddings, pp > 1)
};

}  // namespace tessera::parallel
