#pragma once
/// \file nn/param_layout.hpp
/// Where each parameter tensor lives in the flat parameter buffer
/// (DESIGN.md, principle 4). Gradients, master weights and optimizer state
/// use the same offsets, so one range of the flat buffer names the same
/// elements in all of them.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera::nn {

/// Elements [begin, end) of the flat parameter buffer, all of one parameter
/// tensor (or of its part inside a shard), whether weight decay applies, and
/// the tensor's shape as its elements lie (row-major; this rank's shard of
/// it under tensor parallelism): a matrix of rows x cols (dims 2), a vector
/// of 1 x cols (dims 1), or not known (dims 0). Optimizers whose state is
/// per tensor read the shape (optim::adafactor factors a matrix's second
/// moment into its row and column statistics); a range smaller than
/// rows x cols is a piece of its tensor.
struct param_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  bool decay = true;
  int dims = 0;
  std::int64_t rows = 0, cols = 0;
  /// A weight matrix of a transformer block (not the embedding, the LM head
  /// or a norm gain): what optim::muon orthogonalises.
  bool hidden = false;
  /// Under tensor parallelism, the whole tensor this rank's shard is of:
  /// `full_rows` x `full_cols`, split along `split` (-1 whole, 0 rows, 1
  /// columns), this rank holding distinct shard `shard` with `replicas`
  /// ranks holding the same one, this rank being `replica` of them
  /// (param_entry's). The whole shape equals rows x cols when split is -1.
  int split = -1, shard = 0, replicas = 1, replica = 0;
  std::int64_t full_rows = 0, full_cols = 0;
  /// The range's first element within its tensor (its tp shard), row-major:
  /// 0 for a whole tensor, where a ZeRO chunk cuts it for a piece (clip_ranges).
  std::int64_t first = 0;
  std::int64_t size() const { return end - begin; }
  /// Whether the range holds its whole tensor (false when the shape is not known).
  bool whole() const { return dims > 0 && size() == rows * cols; }
};

/// Intersects `ranges` with the shard [lo, hi) of the flat buffer (ZeRO
/// partitions by offset ranges, DESIGN.md principle 4). Empty pieces are
/// dropped; a piece keeps its tensor's shape and says where in it it starts (`first`).
inline std::vector<param_range> clip_ranges(const std::vector<param_range>& ranges, std::int64_t lo,
                                            std::int64_t hi) {
  std::vector<param_range> out;
  for (const auto& r : ranges) {
    std::int64_t b = std::max(r.begin, lo), e = std::min(r.end, hi);
    if (b >= e) continue;
    param_range piece = r;
    piece.begin = b;
    piece.end = e;
    piece.first = r.first + (b - r.begin);
    out.push_back(piece);
  }
  return out;
}

/// One parameter tensor inside the flat buffer.
struct param_entry {
  std::string name;         ///< e.g. "blocks.3.attn.wq"
  tessera::shape shp;       ///< its shape
  std::int64_t offset = 0;  ///< first element in the flat buffer
  std::int64_t numel = 0;   ///< elements
  bool decay = true;        ///< weight decay applies (false for norms and 1-D tensors)
  int block = -1;           ///< transformer block index, -1 outside the blocks
  /// Under tensor parallelism the tensor may be this rank's shard of a
  /// larger one: `full` is the whole tensor's shape, `shard_dim` the
  /// dimension it is split along (0 rows, 1 columns; -1 whole: replicated
  /// on every tp rank) and `shard_begin` the first row or column held.
  tessera::shape full;
  int shard_dim = -1;
  std::int64_t shard_begin = 0;
  /// How many ranks of the tp group hold this same shard (key/value heads
  /// replicated when tp > nkv: tp/nkv ranks share each head) and which of
  /// them this rank is, [0, replicas). The global gradient norm counts a
  /// shard on its replica 0 only. 1 and 0 for an unreplicated shard.
  int replicas = 1;
  int replica = 0;
  /// Tied weights: the global name of the tensor this entry is a copy of
  /// ("embedding" for the LM head of a model with tied embeddings on the
  /// last pipeline stage), "" for a tensor of its own. A copy holds the same
  /// values as that tensor (the same initial draw, the same summed gradient,
  /// the same update); checkpoints store that tensor once, under its name,
  /// and the global gradient norm counts it once (not the copy).
  std::string tied;
  /// The range of the flat buffer this tensor covers, with its decay flag
  /// and its (local) shape.
  [[nodiscard]] param_range range() const {
    param_range r{offset, offset + numel, decay};
    r.dims = shp.rank >= 2 ? 2 : 1;
    r.rows = shp.rank >= 2 ? numel / shp[shp.rank - 1] : 1;
    r.cols = shp.rank >= 2 ? shp[shp.rank - 1] : numel;
    r.hidden = shp.rank == 2 && block >= 0;
    r.split = shard_dim;
    r.replicas = replicas;
    r.replica = replica;
    r.shard = shard_dim >= 0 ? static_cast<int>(shard_begin / shp[shard_dim]) : 0;
    r.full_rows = full.rank >= 2 ? full.numel() / full[full.rank - 1] : 1;
    r.full_cols = full.rank >= 2 ? full[full.rank - 1] : full.numel();
    return r;
  }
  /// The element of the whole tensor (row-major over `full`) that local
  /// element j (row-major over `shp`) holds; full.numel() or more for a
  /// padding row. Precondition: 0 <= j < numel.
  [[nodiscard]] std::int64_t full_index(std::int64_t j) const {
    if (shard_dim == 0) return shard_begin * shp[1] + j;
    if (shard_dim == 1) return (j / shp[1]) * full[1] + shard_begin + j % shp[1];
    return j;
  }
};

/// Ordered list of parameters with offsets aligned to `align` elements.
class param_layout {
 public:
  /// Alignment of every tensor's first element, in elements (64 bytes of float32).
  static constexpr std::int64_t align = 16;

  /// Appends a tensor. 1-D tensors never decay (norm gains, biases).
  param_entry& add(std::string name, tessera::shape s, bool decay, int block) {
    return add_shard(std::move(name), s, decay, block, s, -1, 0);
  }
  /// Appends this rank's shard `s` of a tensor of shape `full`, split along
  /// `shard_dim` (0 rows, 1 columns) from row/column `shard_begin`.
  param_entry& add_shard(std::string name, tessera::shape s, bool decay, int block,
                         tessera::shape full, int shard_dim, std::int64_t shard_begin) {
    TESSERA_THROW_IF(shard_dim < -1 || shard_dim > 1, config_error, "parameter '", name,
                     "': shard_dim=", shard_dim, " must be -1 (whole), 0 (rows) or 1 (columns)");
    TESSERA_THROW_IF(shard_dim >= 0 && (s.rank != 2 || full.rank != 2), config_error, "parameter '",
                     name, "': only matrices are sharded (rank ", s.rank, ")");
    // A row shard may run past the whole tensor's rows: padding (a
    // vocabulary padded to a multiple of tp).
    TESSERA_THROW_IF(
        shard_dim >= 0 && (s[1 - shard_dim] != full[1 - shard_dim] || shard_begin < 0 ||
                           (shard_dim == 1 && shard_begin + s[shard_dim] > full[shard_dim])),
        config_error, "parameter '", name, "': a shard of ", s[0], " x ", s[1], " from ",
        shard_begin, " is not a slice of ", full[0], " x ", full[1]);
    TESSERA_THROW_IF(shard_dim < 0 && !(s == full), config_error, "parameter '", name,
                     "': a whole tensor's shape must equal its full shape");
    param_entry e;
    e.name = std::move(name);
    e.shp = s;
    e.full = full;
    e.shard_dim = shard_dim;
    e.shard_begin = shard_begin;
    e.offset = (total_ + align - 1) / align * align;
    e.numel = s.numel();
    e.decay = decay && s.rank >= 2;
    e.block = block;
    total_ = e.offset + e.numel;
    entries_.push_back(e);
    return entries_.back();
  }
  /// Marks the entry `name` as a copy of the tensor `of` (param_entry::tied):
  /// the same shape, shard and decay as `of`'s. Throws tessera::error if
  /// either is absent, config_error if they differ or `of` is itself a copy.
  void tied_copy(const std::string& name, const std::string& of) {
    const param_entry& o = at(of);
    param_entry* e = nullptr;
    for (auto& x : entries_)
      if (x.name == name) e = &x;
    TESSERA_THROW_IF(e == nullptr, error, "no parameter named '", name, "'");
    TESSERA_THROW_IF(!o.tied.empty() || !(e->shp == o.shp) || !(e->full == o.full) ||
                         e->shard_dim != o.shard_dim || e->shard_begin != o.shard_begin ||
                         e->decay != o.decay,
                     config_error, "parameter '", name, "' cannot be a copy of '", of,
                     "': another shape, shard or decay, or '", of, "' is itself a copy");
    e->tied = of;
  }
  /// The 1-based position of the tensor `name` in the layout: the stream a
  /// seeded initialisation draws it from (a tied copy draws its tensor's).
  /// Throws tessera::error if absent.
  std::uint64_t draw_index(const std::string& name) const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].name == name) return i + 1;
    throw error("no parameter named '" + name + "'");
  }
  /// Elements of the flat buffer (including alignment padding).
  std::int64_t total() const { return total_; }
  /// Real parameters (excluding padding).
  std::int64_t num_params() const {
    std::int64_t n = 0;
    for (const auto& e : entries_) n += e.numel;
    return n;
  }
  const std::vector<param_entry>& entries() const { return entries_; }
  /// Entry by name; throws tessera::error if absent.
  const param_entry& at(const std::string& name) const {
    for (const auto& e : entries_)
      if (e.name == name) return e;
    throw error("no parameter named '" + name + "'");
  }
  /// Decay-flagged ranges for the optimizer, in flat-buffer offsets.
  std::vector<param_range> ranges() const {
    std::vector<param_range> r;
    for (const auto& e : entries_) r.push_back(e.range());
    return r;
  }

 private:
  std::vector<param_entry> entries_;
  std::int64_t total_ = 0;
};

}  // namespace tessera::nn
