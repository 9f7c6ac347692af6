#pragma once
/// \file train/checkpoint_index.hpp
/// The index of a layout-free checkpoint: what each rank's data file holds,
/// named by the model's global tensors, so that a reader of any layout finds
/// the elements it needs without knowing the layout that wrote them
/// (docs/checkpoints.md describes the format for other tools).
///
/// A checkpoint is a folder: one data file per writing rank (raw
/// little-endian elements, piece after piece) and `metadata.json`, written
/// last. The metadata names
///   - every tensor by its global name ("blocks.3.attn.wq") with its global
///     shape, and for each role stored (param, master, exp_avg, exp_avg_sq,
///     momentum, ...) the element type;
///   - every file with its size in bytes and SHA-256 (a damaged file is named);
///   - every piece: its tensor and role, its file and byte offset, the box
///     of the global tensor it lies in (start and shape per dimension: the
///     rows or columns of a tensor-parallel shard, or the whole tensor) and
///     the elements [flat_begin, flat_end) of that box, row-major, that it
///     holds (a ZeRO shard cuts a box at any element);
///   - the run's state (`run`: step, data position, settings, the layout it
///     was written at), which this header does not interpret.
/// A box and a flat range within it is what Megatron-Core's ShardedTensor
/// records (its `flattened_range`); PyTorch DCP records boxes (chunks) only.
///
/// A reader asks for [flat_begin, flat_end) of a box of its own (its shard
/// under its layout) and gets the list of copies from the files
/// (plan_region): run by run along the last dimension, each intersected
/// with every piece of the tensor's role, adjacent copies merged. Elements
/// no piece holds are an error naming the tensor, the role and the first
/// such element.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/checked.hpp"
#include "tessera/core/error.hpp"

namespace tessera::train {

/// A box of a tensor: start[d] <= i[d] < start[d] + shape[d] in each
/// dimension d.
struct index_box {
  std::vector<std::int64_t> start, shape;
  /// Elements in the box (product of shape; 1 for a 0-dimensional box).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (const std::int64_t s : shape) n = checked_mul(n, s, "checkpoint box");
    return n;
  }
};

/// One stored piece: elements [flat_begin, flat_end) (row-major in `box`)
/// of role `role` of tensor `tensor`, at byte `offset` of file `file`
/// (an index into checkpoint_index::files), in the role's element type.
struct stored_piece {
  std::string tensor, role;
  index_box box;
  std::int64_t flat_begin = 0, flat_end = 0;
  int file = 0;
  std::uint64_t offset = 0;
};

/// A tensor of the model: its global shape and, per role stored, the
/// element type's name ("float32", "bf16", ...: tessera::dtype_name's).
struct stored_tensor {
  std::vector<std::int64_t> shape;
  std::map<std::string, std::string> roles;
};

/// A data file: its name in the folder, its size and SHA-256 (hex).
struct stored_file {
  std::string name;
  std::uint64_t bytes = 0;
  std::string sha256;
};

/// One copy a read makes: `n` elements from byte `src` of file `file` to
/// element `dst` of the reader's buffer.
struct region_copy {
  int file = 0;
  std::uint64_t src = 0;
  std::int64_t dst = 0, n = 0;
};

/// Whether `dtype` names an element type a checkpoint stores (the names of
/// tessera::dtype_name: float64, float32, bf16, fp16, int32).
inline bool known_dtype(const std::string& dtype) {
  return dtype == "float64" || dtype == "float32" || dtype == "bf16" || dtype == "fp16" ||
         dtype == "int32";
}
/// Bytes of one element of the type named `dtype`. Throws io_error naming
/// an unknown name.
inline std::size_t dtype_bytes_of(const std::string& dtype) {
  if (dtype == "float64") return 8;
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  throw io_error("checkpoint metadata: unknown element type '" + dtype +
                 "' (known: float64, float32, bf16, fp16, int32)");
}

/// The metadata of a checkpoint (file comment).
struct checkpoint_index {
  /// The version this code writes and reads.
  static constexpr int format_version = 1;

  std::map<std::string, stored_tensor> tensors;
  std::vector<stored_file> files;
  std::vector<stored_piece> pieces;
  nlohmann::json run = nlohmann::json::object();

  /// As JSON (metadata.json).
  nlohmann::json to_json() const {
    nlohmann::json t = nlohmann::json::object();
    for (const auto& [name, st] : tensors) t[name] = {{"shape", st.shape}, {"roles", st.roles}};
    nlohmann::json f = nlohmann::json::array();
    for (const stored_file& x : files)
      f.push_back({{"name", x.name}, {"bytes", x.bytes}, {"sha256", x.sha256}});
    nlohmann::json p = nlohmann::json::array();
    for (const stored_piece& x : pieces)
      p.push_back({{"tensor", x.tensor},
                   {"role", x.role},
                   {"start", x.box.start},
                   {"shape", x.box.shape},
                   {"flat", {x.flat_begin, x.flat_end}},
                   {"file", x.file},
                   {"offset", x.offset}});
    return {{"format", "tessera-checkpoint"},
            {"version", format_version},
            {"tensors", t},
            {"files", f},
            {"pieces", p},
            {"run", run}};
  }

  /// Reads and checks metadata `j` (from `where`, for messages): every
  /// field present with its type; shapes non-negative; each piece's
  /// tensor, role and file known, its box inside the tensor, its flat range
  /// inside the box, and its bytes inside its file (sizes checked for
  /// overflow). Throws io_error naming `where` and the first problem.
  static checkpoint_index from_json(const nlohmann::json& j, const std::string& where) {
    auto fail = [&](const std::string& what) -> io_error {
      return io_error("checkpoint metadata '" + where + "': " + what);
    };
    try {
      if (!j.is_object() || j.value("format", std::string{}) != "tessera-checkpoint")
        throw fail("not a tessera checkpoint (\"format\": \"tessera-checkpoint\" missing)");
      const int v = j.at("version").get<int>();
      if (v != format_version)
        throw fail("format version " + std::to_string(v) + "; this build reads version " +
                   std::to_string(format_version));
      checkpoint_index x;
      for (const auto& [name, t] : j.at("tensors").items()) {
        stored_tensor st;
        st.shape = t.at("shape").get<std::vector<std::int64_t>>();
        st.roles = t.at("roles").get<std::map<std::string, std::string>>();
        for (const std::int64_t s : st.shape)
          if (s < 0) throw fail("tensor '" + name + "' has a negative dimension");
        for (const auto& [role, dt] : st.roles)
          if (!known_dtype(dt))
            throw fail("tensor '" + name + "' stores " + role + " as unknown element type '" + dt +
                       "' (known: float64, float32, bf16, fp16, int32)");
        x.tensors.emplace(name, std::move(st));
      }
      for (const auto& f : j.at("files")) {
        stored_file sf{f.at("name").get<std::string>(), f.at("bytes").get<std::uint64_t>(),
                       f.at("sha256").get<std::string>()};
        if (sf.name.empty() || sf.name.find('/') != std::string::npos || sf.name == "." ||
            sf.name == "..")
          throw fail("file name '" + sf.name + "' is not a plain name in the folder");
        x.files.push_back(std::move(sf));
      }
      for (const auto& p : j.at("pieces")) {
        stored_piece sp;
        sp.tensor = p.at("tensor").get<std::string>();
        sp.role = p.at("role").get<std::string>();
        sp.box.start = p.at("start").get<std::vector<std::int64_t>>();
        sp.box.shape = p.at("shape").get<std::vector<std::int64_t>>();
        const auto flat = p.at("flat").get<std::vector<std::int64_t>>();
        if (flat.size() != 2) throw fail("a piece's \"flat\" is not [begin, end]");
        sp.flat_begin = flat[0];
        sp.flat_end = flat[1];
        sp.file = p.at("file").get<int>();
        sp.offset = p.at("offset").get<std::uint64_t>();
        x.check_piece(sp, fail);
        x.pieces.push_back(std::move(sp));
      }
      x.run = j.at("run");
      return x;
    } catch (const nlohmann::json::exception& e) {
      throw fail(std::string("malformed: ") + e.what());
    }
  }

  /// Element bytes of `role` of `tensor`. Throws io_error if either is unknown.
  std::size_t element_bytes(const std::string& tensor, const std::string& role) const {
    const auto t = tensors.find(tensor);
    TESSERA_THROW_IF(t == tensors.end(), io_error, "checkpoint: no tensor '", tensor, "'");
    const auto r = t->second.roles.find(role);
    TESSERA_THROW_IF(r == t->second.roles.end(), io_error, "checkpoint: tensor '", tensor,
                     "' has no ", role, " stored");
    return dtype_bytes_of(r->second);
  }

  /// The copies that fill elements [flat_begin, flat_end) of `box` of
  /// `role` of `tensor` (row-major in `box`; destination element 0 is
  /// flat_begin) from the pieces, adjacent copies merged. Throws
  /// config_error for a box outside the tensor or a flat range outside the
  /// box, io_error naming the tensor, the role and the first element (its
  /// global index) that no piece holds.
  std::vector<region_copy> plan_region(const std::string& tensor, const std::string& role,
                                       const index_box& box, std::int64_t flat_begin,
                                       std::int64_t flat_end) const {
    const std::size_t esize = element_bytes(tensor, role);
    const std::vector<std::int64_t>& shape = tensors.at(tensor).shape;
    TESSERA_THROW_IF(!inside(box, shape), config_error, "checkpoint read of '", tensor,
                     "': the box is not inside the tensor's shape");
    TESSERA_THROW_IF(flat_begin < 0 || flat_end < flat_begin || flat_end > box.numel(),
                     config_error, "checkpoint read of '", tensor, "': elements [", flat_begin,
                     ", ", flat_end, ") are not within the box's ", box.numel());
    std::vector<const stored_piece*> mine;
    for (const stored_piece& p : pieces)
      if (p.tensor == tensor && p.role == role) mine.push_back(&p);
    std::vector<region_copy> out;
    if (flat_begin == flat_end) return out;
    const std::size_t D = shape.size();
    const std::int64_t C = D == 0 ? 1 : box.shape[D - 1];
    std::vector<std::int64_t> row(D);  // global coordinates of the current run's row
    std::vector<std::pair<std::int64_t, std::int64_t>> covered;
    for (std::int64_t e = flat_begin; e < flat_end;) {
      const std::int64_t r = e / C, c0 = e % C;
      const std::int64_t len = std::min(flat_end - e, C - c0);
      unravel(box, r, row);
      const std::int64_t g0 = (D == 0 ? 0 : box.start[D - 1]) + c0, g1 = g0 + len;
      covered.clear();
      for (const stored_piece* p : mine) {
        std::int64_t prow = 0;  // the row's index within the piece's box
        if (!row_of(*p, row, prow)) continue;
        const std::int64_t pc0 = D == 0 ? 0 : p->box.start[D - 1];
        const std::int64_t pC = D == 0 ? 1 : p->box.shape[D - 1];
        const std::int64_t a = std::max(g0, pc0), b = std::min(g1, pc0 + pC);
        if (a >= b) continue;
        const std::int64_t q0 = std::max(prow * pC + (a - pc0), p->flat_begin);
        const std::int64_t q1 = std::min(prow * pC + (b - pc0), p->flat_end);
        if (q0 >= q1) continue;
        const std::int64_t ga = pc0 + (q0 - prow * pC);  // global column of q0
        const std::int64_t dst = r * C + (ga - (D == 0 ? 0 : box.start[D - 1])) - flat_begin;
        add(out,
            {p->file, p->offset + static_cast<std::uint64_t>(q0 - p->flat_begin) * esize, dst,
             q1 - q0},
            esize);
        covered.emplace_back(ga, ga + (q1 - q0));
      }
      std::sort(covered.begin(), covered.end());
      std::int64_t reach = g0;
      for (const auto& [a, b] : covered)
        if (a <= reach) reach = std::max(reach, b);
      if (reach < g1) {
        std::int64_t flat = 0;  // the missing element's global row-major index
        for (std::size_t d = 0; d + 1 < D; ++d) flat = flat * shape[d] + row[d];
        flat = D == 0 ? 0 : flat * shape[D - 1] + reach;
        throw io_error(tessera::detail::str(
            "checkpoint: no stored piece holds element ", flat, " of ", role, " of '", tensor,
            "' (the checkpoint was written by a layout that kept it elsewhere, or is incomplete)"));
      }
      e += len;
    }
    return out;
  }

 private:
  static bool inside(const index_box& b, const std::vector<std::int64_t>& shape) {
    if (b.start.size() != shape.size() || b.shape.size() != shape.size()) return false;
    for (std::size_t d = 0; d < shape.size(); ++d)
      if (b.start[d] < 0 || b.shape[d] < 0 || b.start[d] > shape[d] - b.shape[d]) return false;
    return true;
  }
  // Global coordinates (all but the last dimension) of row r of box b.
  static void unravel(const index_box& b, std::int64_t r, std::vector<std::int64_t>& row) {
    const std::size_t D = b.shape.size();
    if (D == 0) return;
    for (std::size_t d = D - 1; d-- > 0;) {
      row[d] = b.start[d] + r % b.shape[d];
      r /= b.shape[d];
    }
  }
  // Whether piece p's box holds global row `row`, and its index there.
  static bool row_of(const stored_piece& p, const std::vector<std::int64_t>& row,
                     std::int64_t& prow) {
    const std::size_t D = row.size();
    prow = 0;
    for (std::size_t d = 0; d + 1 < D; ++d) {
      const std::int64_t i = row[d] - p.box.start[d];
      if (i < 0 || i >= p.box.shape[d]) return false;
      prow = prow * p.box.shape[d] + i;
    }
    return true;
  }
  // Appends c, merged into the last copy when both continue it.
  static void add(std::vector<region_copy>& out, const region_copy& c, std::size_t esize) {
    if (!out.empty()) {
      region_copy& l = out.back();
      if (l.file == c.file && l.dst + l.n == c.dst &&
          l.src + static_cast<std::uint64_t>(l.n) * esize == c.src) {
        l.n += c.n;
        return;
      }
    }
    out.push_back(c);
  }
  template <class Fail>
  void check_piece(const stored_piece& p, const Fail& fail) const {
    const auto t = tensors.find(p.tensor);
    if (t == tensors.end()) throw fail("a piece of unknown tensor '" + p.tensor + "'");
    const auto r = t->second.roles.find(p.role);
    if (r == t->second.roles.end())
      throw fail("a piece of role '" + p.role + "' that tensor '" + p.tensor + "' does not list");
    if (!inside(p.box, t->second.shape))
      throw fail("a piece of '" + p.tensor + "' whose box is not inside the tensor");
    std::int64_t n = 0;
    try {
      n = p.box.numel();
    } catch (const error&) {
      throw fail("a piece of '" + p.tensor + "' whose box overflows 64 bits");
    }
    if (p.flat_begin < 0 || p.flat_end < p.flat_begin || p.flat_end > n)
      throw fail("a piece of '" + p.tensor + "' whose flat range is not within its box");
    if (p.file < 0 || static_cast<std::size_t>(p.file) >= files.size())
      throw fail("a piece of '" + p.tensor + "' in file " + std::to_string(p.file) + " of " +
                 std::to_string(files.size()));
    std::uint64_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<std::uint64_t>(p.flat_end - p.flat_begin),
                               dtype_bytes_of(r->second), &bytes))
      throw fail("a piece of '" + p.tensor + "' whose bytes overflow 64 bits");
    const std::uint64_t size = files[static_cast<std::size_t>(p.file)].bytes;
    if (p.offset > size || bytes > size - p.offset)
      throw fail("a piece of '" + p.tensor + "' reaches past the end of file '" +
                 files[static_cast<std::size_t>(p.file)].name + "'");
  }
};

}  // namespace tessera::train
