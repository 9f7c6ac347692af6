#pragma once
/// \file train/checkpoint_consolidate.hpp
/// Tools over a layout-free checkpoint folder (train/checkpoint_index.hpp)
/// that need no trainer: a check that every tensor's pieces cover it
/// exactly once (check_piece_coverage), and consolidation into a folder of
/// one data file holding every tensor whole (consolidate_checkpoint), which
/// any layout loads as it loads the original (the loader ignores the layout
/// that wrote a checkpoint: layout_key in train/checkpoint_folder.hpp).

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_NOREPLACE (glibc 2.28, _GNU_SOURCE)
#include <sys/stat.h>  // mkdir
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/checked.hpp"
#include "tessera/core/error.hpp"
#include "tessera/train/checkpoint_index.hpp"
#include "tessera/train/checkpoint_io.hpp"

namespace tessera::train {

namespace detail {

// A new output folder `dst` (a trailing separator dropped) and the
// temporary folder beside it (".NAME.tmp-PID") that is written and then
// renamed to it. Throws config_error when `dst` exists.
inline std::pair<std::filesystem::path, std::filesystem::path> fresh_output(
    std::filesystem::path dst) {
  namespace fs = std::filesystem;
  if (!dst.has_filename() && dst.has_parent_path()) dst = dst.parent_path();
  std::error_code ec;
  TESSERA_THROW_IF(dst.empty() || fs::exists(dst, ec) || fs::is_symlink(dst, ec), config_error,
                   "output '", dst.string(), "' exists: give a new folder");
  const fs::path parent = dst.has_parent_path() ? dst.parent_path() : fs::path(".");
  return {dst, parent / ("." + dst.filename().string() + ".tmp-" + std::to_string(::getpid()))};
}

// rename_no_replace where the system has no RENAME_NOREPLACE: claims the
// name with mkdir (which fails if anything is there), then renames `from`
// onto that empty folder, which fails if another job wrote into it
// meanwhile. False when the name was taken; throws
// std::filesystem::filesystem_error for any other failure.
inline bool rename_claiming_name(const std::filesystem::path& from,
                                 const std::filesystem::path& to) {
  if (::mkdir(to.c_str(), 0755) != 0) {
    const int err = errno;
    if (err == EEXIST) return false;
    throw std::filesystem::filesystem_error("mkdir", to,
                                            std::error_code(err, std::generic_category()));
  }
  if (::rename(from.c_str(), to.c_str()) == 0) return true;
  const int err = errno;
  if (err == ENOTEMPTY || err == EEXIST) return false;  // written into: not ours to remove
  ::rmdir(to.c_str());
  throw std::filesystem::filesystem_error("rename", from, to,
                                          std::error_code(err, std::generic_category()));
}

// Renames `from` to `to` unless something is at `to` (a plain rename
// replaces an empty folder): false then, nothing moved. renameat2 with
// RENAME_NOREPLACE where the C library and the file system have it (glibc
// 2.28 and Linux's local file systems), else rename_claiming_name. Throws
// std::filesystem::filesystem_error for any other failure.
inline bool rename_no_replace(const std::filesystem::path& from, const std::filesystem::path& to) {
#if defined(RENAME_NOREPLACE)
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  const int err = errno;
  if (err == EEXIST) return false;
  // Not supported here (an old kernel, a network file system, a seccomp
  // profile that denies the call): the portable way.
  if (err != EINVAL && err != ENOSYS && err != EPERM && err != EOPNOTSUPP)
    throw std::filesystem::filesystem_error("rename", from, to,
                                            std::error_code(err, std::generic_category()));
#endif
  return rename_claiming_name(from, to);
}

// Writes the new folder `out` (fresh_output's pair): fill(tmp) writes its
// files into the temporary folder, which is renamed to the output at the
// end. A file-system failure becomes io_error "<doing> '<src>' into
// '<dst>' failed: ..."; an output that appeared meanwhile is config_error;
// nothing is left behind on any failure.
template <class Fill>
void write_new_folder(const std::pair<std::filesystem::path, std::filesystem::path>& out,
                      const std::string& doing, const std::filesystem::path& src,
                      const std::filesystem::path& dst, Fill&& fill) {
  namespace fs = std::filesystem;
  const auto& [folder, tmp] = out;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    fill(tmp);
    // Renamed only if nothing is at `folder` (renameat2 RENAME_NOREPLACE:
    // a plain rename would replace an empty folder made meanwhile).
    TESSERA_THROW_IF(!rename_no_replace(tmp, folder), config_error, "output '", folder.string(),
                     "' appeared while ", doing, ": give a new folder");
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw io_error(doing + " '" + src.string() + "' into '" + dst.string() + "' failed: " +
                   e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace detail

/// Checks that the pieces of every role of every tensor of `index` cover
/// the tensor's global elements exactly once: no element stored twice
/// (overlap), none stored nowhere (gap). Works on the global row-major
/// index of each element, piece by piece, run by run along the last
/// dimension (adjacent runs merged), so memory is one interval per stored
/// row at worst. Throws io_error naming the tensor, the role and the first
/// element that is stored twice or nowhere.
inline void check_piece_coverage(const checkpoint_index& index) {
  // Global row-major [begin, end) intervals, per (tensor, role).
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<std::int64_t, std::int64_t>>>
      runs;
  for (const auto& [name, t] : index.tensors)
    for (const auto& [role, dt] : t.roles) runs[{name, role}];
  for (const stored_piece& p : index.pieces) {
    auto& v = runs[{p.tensor, p.role}];
    const std::vector<std::int64_t>& shape = index.tensors.at(p.tensor).shape;
    const std::size_t D = shape.size();
    const std::int64_t C = D == 0 ? 1 : p.box.shape[D - 1];
    if (C == 0) continue;
    std::vector<std::int64_t> coord(D == 0 ? 0 : D - 1);  // a row's global coordinates
    for (std::int64_t e = p.flat_begin; e < p.flat_end;) {
      const std::int64_t r = e / C, c0 = e % C, len = std::min(p.flat_end - e, C - c0);
      // The global index of the box's element e: its coordinates, row-major in `shape`.
      std::int64_t g = 0, rem = r;
      for (std::size_t d = D == 0 ? 0 : D - 1; d-- > 0;) {
        coord[d] = p.box.start[d] + rem % p.box.shape[d];
        rem /= p.box.shape[d];
      }
      for (std::size_t d = 0; d + 1 < D; ++d) g = g * shape[d] + coord[d];
      g = D == 0 ? 0 : g * shape[D - 1] + p.box.start[D - 1] + c0;
      if (!v.empty() && v.back().second == g)
        v.back().second += len;
      else
        v.emplace_back(g, g + len);
      e += len;
    }
  }
  for (auto& [key, v] : runs) {
    const auto& [name, role] = key;
    const std::vector<std::int64_t>& shape = index.tensors.at(name).shape;
    const std::int64_t numel = index_box{std::vector<std::int64_t>(shape.size(), 0), shape}.numel();
    std::sort(v.begin(), v.end());
    std::int64_t reach = 0;
    for (const auto& [a, b] : v) {
      TESSERA_THROW_IF(a < reach, io_error, "checkpoint: element ", a, " of ", role, " of '", name,
                       "' is stored by two pieces (they overlap)");
      TESSERA_THROW_IF(a > reach, io_error, "checkpoint: no stored piece holds element ", reach,
                       " of ", role, " of '", name, "' (a gap in its pieces)");
      reach = b;
    }
    TESSERA_THROW_IF(reach < numel, io_error, "checkpoint: no stored piece holds element ", reach,
                     " of ", role, " of '", name, "' (a gap in its pieces)");
  }
}

/// Writes checkpoint folder `dst` holding the checkpoint folder `src`
/// (written at any layout) with every role of every tensor whole, in one
/// data file rank-00000.bin: one piece per (tensor, role), the whole box,
/// in the stored element types. The run state is `src`'s, except `layout`,
/// which records the one file ({"dp": 1, "tp": 1, "pp": 1, "world": 1,
/// "consolidated_from": src's layout}); every run setting a load checks is
/// unchanged, so trainer::load_checkpoint at any layout restores from
/// `dst` the same parameters, master weights, optimizer state and step,
/// bit for bit, as from `src`.
///
/// Reads with positioned reads, one block of at most `block` bytes (a
/// multiple of 8) at a time, never the whole checkpoint. With `verify`,
/// first hashes every file of `src` against its SHA-256 and checks the
/// pieces' coverage (check_piece_coverage). Writes into a temporary folder
/// beside `dst` (".NAME.tmp-PID") renamed to `dst` at the end, so a
/// failure leaves no `dst` and no temporary folder.
///
/// Throws config_error when `dst` exists or `block` is not a positive
/// multiple of 8; io_error as checkpoint_reader (no metadata.json, a file
/// missing, truncated or damaged), for elements no piece holds, and naming
/// the file that cannot be written.
inline void consolidate_checkpoint(const std::filesystem::path& src,
                                   const std::filesystem::path& dst, bool verify = true,
                                   std::size_t block = 64u << 20) {
  namespace fs = std::filesystem;
  TESSERA_THROW_IF(block == 0 || block % 8 != 0, config_error, "consolidate_checkpoint: block of ",
                   block, " bytes is not a positive multiple of 8");
  const auto fresh = detail::fresh_output(dst);  // refused when it exists
  checkpoint_reader rd(src);
  if (verify) {
    rd.verify();
    check_piece_coverage(rd.index());
  }
  const checkpoint_index& in = rd.index();
  rank_file file;
  for (const auto& [name, t] : in.tensors) {
    index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
    const std::int64_t n = box.numel();
    for (const auto& [role, dtype] : t.roles) {
      const std::size_t esize = dtype_bytes_of(dtype);
      file.add({name, role, box, 0, n, 0, 0},
               checked_mul_u64(static_cast<std::uint64_t>(n), esize, "a tensor's bytes"),
               // Init-captures: clang before 16 cannot capture a structured binding.
               [&rd, name = name, role = role, box, esize](std::size_t at, void* out, std::size_t bytes) {
                 const auto lo = static_cast<std::int64_t>(at / esize);
                 rd.read(name, role, box, lo, lo + static_cast<std::int64_t>(bytes / esize), out);
               });
    }
  }
  detail::write_new_folder(fresh, "consolidating", src, dst, [&](const fs::path& tmp) {
    checkpoint_index out;
    out.tensors = in.tensors;
    auto [f, pieces] = file.write(tmp, rank_data_name(0), 0, block);
    out.files.push_back(std::move(f));
    out.pieces = std::move(pieces);
    out.run = in.run;
    nlohmann::json from = in.run.contains("layout") ? in.run["layout"] : nlohmann::json::object();
    out.run["layout"] = {
        {"dp", 1}, {"tp", 1}, {"pp", 1}, {"world", 1}, {"consolidated_from", from}};
    write_checkpoint_metadata(tmp, out);
  });
}

}  // namespace tessera::train
