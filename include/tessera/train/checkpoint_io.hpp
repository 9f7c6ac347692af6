#pragma once
/// \file train/checkpoint_io.hpp
/// The files of a layout-free checkpoint (train/checkpoint_index.hpp): one
/// rank's data file, written whole under a temporary name with its SHA-256
/// computed on the way (rank_file), and a reader of a checkpoint folder that
/// reads only the pieces a region needs, with positioned reads (pread), and
/// never the whole checkpoint into one buffer (checkpoint_reader).

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/core/sha256.hpp"
#include "tessera/train/checkpoint_index.hpp"

namespace tessera::train {

/// The name of the metadata file in a checkpoint folder.
inline constexpr const char* checkpoint_metadata_name = "metadata.json";

/// One rank's data file: its pieces in the order added, each either host
/// bytes (alive until write()) or produced block by block by a function
/// (device memory staged through a host block). write() writes the file
/// atomically (write_file_atomically: a reader never sees half of it) and
/// returns its entry and the pieces with their file index and offsets.
class rank_file {
 public:
  /// Fills `n` bytes at `dst` with the piece's bytes [at, at + n).
  using producer = std::function<void(std::size_t at, void* dst, std::size_t n)>;

  /// Adds piece `p` (its file and offset are set by write()) whose `bytes`
  /// bytes are at host address `src`.
  void add(stored_piece p, const void* src, std::size_t bytes) {
    add(std::move(p), bytes, [src](std::size_t at, void* dst, std::size_t n) {
      std::memcpy(dst, static_cast<const char*>(src) + at, n);
    });
  }
  /// Adds piece `p` whose `bytes` bytes `fill` produces, a block at a time.
  void add(stored_piece p, std::size_t bytes, producer fill) {
    items_.push_back({std::move(p), bytes, std::move(fill)});
  }
  /// Host memory the pieces are copied into on their way to the disk
  /// (write()'s block, snapshot()'s copies): a GPU backend's page-locked
  /// memory (cuda::pinned_resource: device-to-host copies at full DMA
  /// speed), or nullptr, the default: new[] (pageable host memory). Not
  /// owned; must outlive the buffers and be thread-safe (an asynchronous
  /// save frees a snapshot's buffers on its writer thread).
  void stage_through(memory_resource* mr) { host_mr_ = mr; }

  /// Host buffers a snapshot copies into, kept between saves: the same
  /// pieces at the next save reuse them (no allocation, no page faults).
  /// They come from `mr` (snapshot sets the file's when unset), else from
  /// new[].
  struct staging {
    memory_resource* mr = nullptr;
    std::vector<std::pair<std::size_t, std::shared_ptr<char[]>>> buffers;  ///< (bytes, buffer)

    /// A buffer of `bytes` (at least 1) from `mr` or new[], not zero-filled.
    std::shared_ptr<char[]> allocate(std::size_t bytes) const {
      const std::size_t n = std::max<std::size_t>(bytes, 1);
      if (!mr) return std::shared_ptr<char[]>(new char[n]);
      return std::shared_ptr<char[]>(static_cast<char*>(mr->allocate(n, 64)),
                                     [r = mr, n](char* p) { r->deallocate(p, n); });
    }
  };

  /// A copy of every piece's bytes in host memory, owned by the result:
  /// the state as it is now, which a background thread can write while
  /// the sources change (an asynchronous save). With `reuse`, piece k is
  /// copied into its k-th buffer when that has its size (else a new one
  /// replaces it); the caller must not snapshot into it again while the
  /// result is being written. Throws std::bad_alloc (or the staging
  /// resource's error: out_of_memory, cuda_error) when the host cannot hold
  /// bytes() more, and what a piece's producer throws (a device copy's
  /// error).
  rank_file snapshot(staging* reuse = nullptr) const {
    rank_file s;
    staging none;
    staging& st = reuse ? *reuse : none;
    if (!st.mr) st.mr = host_mr_;
    st.buffers.resize(items_.size());
    for (std::size_t k = 0; k < items_.size(); ++k) {
      const item& i = items_[k];
      auto& [bytes, copy] = st.buffers[k];
      if (!copy || bytes != i.bytes) {
        copy.reset();  // the old buffer goes before the new one comes
        copy = st.allocate(i.bytes);
        bytes = i.bytes;
      }
      std::shared_ptr<char[]> buf = copy;
      if (i.bytes > 0) i.fill(0, buf.get(), i.bytes);
      s.add(i.piece, i.bytes, [buf](std::size_t at, void* dst, std::size_t n) {
        std::memcpy(dst, buf.get() + at, n);
      });
    }
    return s;
  }
  /// Bytes the file will hold.
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (const item& i : items_) n += i.bytes;
    return n;
  }

  /// Writes `dir`/`name` (atomically, fsync'ed) through host blocks of
  /// `block` bytes, hashing as it goes; the pieces get file index `file`
  /// and their byte offsets. Throws io_error naming the file (a full disk,
  /// a read-only folder), the staging resource's error for its block, and
  /// what a piece's producer throws; leaves no partial file.
  std::pair<stored_file, std::vector<stored_piece>> write(const std::filesystem::path& dir,
                                                          const std::string& name, int file,
                                                          std::size_t block = 64u << 20) const {
    const std::filesystem::path path = dir / name;
    sha256_stream hash(path.string());
    std::vector<stored_piece> pieces;
    std::uint64_t at = 0;
    const std::size_t block_bytes =
        std::min<std::size_t>(block, std::max<std::uint64_t>(bytes(), 1));
    const std::shared_ptr<char[]> buf = staging{host_mr_, {}}.allocate(block_bytes);
    write_file_atomically(path, [&](std::ofstream& out) {
      for (const item& i : items_) {
        stored_piece p = i.piece;
        p.file = file;
        p.offset = at;
        for (std::size_t done = 0; done < i.bytes;) {
          const std::size_t n = std::min(block_bytes, i.bytes - done);
          i.fill(done, buf.get(), n);
          hash.update(buf.get(), n);
          out.write(buf.get(), static_cast<std::streamsize>(n));
          TESSERA_THROW_IF(!out, io_error, "writing checkpoint file '", path.string(),
                           "' failed: ", std::strerror(errno));
          done += n;
        }
        at += i.bytes;
        pieces.push_back(std::move(p));
      }
    });
    return {stored_file{name, at, hash.hex()}, std::move(pieces)};
  }

 private:
  struct item {
    stored_piece piece;
    std::size_t bytes;
    producer fill;
  };
  std::vector<item> items_;
  memory_resource* host_mr_ = nullptr;  // stage_through
};

/// A checkpoint folder opened for reading: its metadata parsed and checked
/// (checkpoint_index::from_json), every data file present with the size
/// the metadata records. Reads go to the files at the pieces' offsets
/// (pread), so a reader reads only what it asks for. Not copyable.
class checkpoint_reader {
 public:
  /// Opens folder `dir`. Throws io_error for a folder without
  /// metadata.json (a save that did not complete: never loaded), metadata
  /// that does not parse or add up, and a data file missing or of another
  /// size than recorded, naming the file.
  explicit checkpoint_reader(std::filesystem::path dir) : dir_(std::move(dir)) {
    const std::filesystem::path meta = dir_ / checkpoint_metadata_name;
    TESSERA_THROW_IF(!std::filesystem::exists(meta), io_error, "checkpoint '", dir_.string(),
                     "' has no ", checkpoint_metadata_name,
                     ": its save did not complete (the metadata is written last); resume from "
                     "an earlier checkpoint");
    index_ = checkpoint_index::from_json(read_json_file(meta, "checkpoint metadata"),
                                         meta.string());
    fds_.assign(index_.files.size(), -1);
    for (const stored_file& f : index_.files) {
      std::error_code ec;
      const std::uintmax_t size = std::filesystem::file_size(dir_ / f.name, ec);
      TESSERA_THROW_IF(ec, io_error, "checkpoint file '", (dir_ / f.name).string(),
                       "' is missing: ", ec.message());
      TESSERA_THROW_IF(size != f.bytes, io_error, "checkpoint file '", (dir_ / f.name).string(),
                       "' holds ", size, " bytes; the metadata records ", f.bytes,
                       " (truncated or replaced)");
    }
  }
  ~checkpoint_reader() {
    for (const int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  checkpoint_reader(const checkpoint_reader&) = delete;
  checkpoint_reader& operator=(const checkpoint_reader&) = delete;

  const checkpoint_index& index() const { return index_; }
  const std::filesystem::path& folder() const { return dir_; }

  /// Reads elements [lo, hi) of `box` of `role` of `tensor` (row-major in
  /// the box) into host memory `out`, in the role's stored element type
  /// (checkpoint_index::element_bytes each). Throws as plan_region, and
  /// io_error naming the file for a failed or short read.
  void read(const std::string& tensor, const std::string& role, const index_box& box,
            std::int64_t lo, std::int64_t hi, void* out) {
    const std::size_t esize = index_.element_bytes(tensor, role);
    for (const region_copy& c : index_.plan_region(tensor, role, box, lo, hi))
      pread_all(c.file, c.src, static_cast<char*>(out) + static_cast<std::size_t>(c.dst) * esize,
                static_cast<std::size_t>(c.n) * esize);
  }

  /// Hashes every data file and compares with the metadata's SHA-256.
  /// Throws io_error naming the first file that differs (damaged on disk).
  void verify() {
    std::vector<char> buf(8u << 20);
    for (std::size_t f = 0; f < index_.files.size(); ++f) {
      const stored_file& sf = index_.files[f];
      sha256_stream h((dir_ / sf.name).string());
      for (std::uint64_t at = 0; at < sf.bytes;) {
        const std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), sf.bytes - at));
        pread_all(static_cast<int>(f), at, buf.data(), n);
        h.update(buf.data(), n);
        at += n;
      }
      TESSERA_THROW_IF(h.hex() != sf.sha256, io_error, "checkpoint file '",
                       (dir_ / sf.name).string(),
                       "' does not match its SHA-256 in the metadata (damaged)");
    }
  }

 private:
  int fd_of(int file) {
    int& fd = fds_[static_cast<std::size_t>(file)];
    if (fd < 0) {
      const std::filesystem::path p = dir_ / index_.files[static_cast<std::size_t>(file)].name;
      fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      TESSERA_THROW_IF(fd < 0, io_error, "cannot open checkpoint file '", p.string(),
                       "': ", std::strerror(errno));
    }
    return fd;
  }
  void pread_all(int file, std::uint64_t at, char* dst, std::size_t n) {
    const int fd = fd_of(file);
    while (n > 0) {
      const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      TESSERA_THROW_IF(got <= 0, io_error, "reading checkpoint file '",
                       (dir_ / index_.files[static_cast<std::size_t>(file)].name).string(),
                       "' at byte ", at,
                       " failed: ", got == 0 ? "unexpected end of file" : std::strerror(errno));
      dst += got;
      at += static_cast<std::uint64_t>(got);
      n -= static_cast<std::size_t>(got);
    }
  }

  std::filesystem::path dir_;
  checkpoint_index index_;
  std::vector<int> fds_;
};

/// Writes `index` as `dir`/metadata.json, atomically: the last file of a
/// save, once every rank's data file is written. Throws io_error.
inline void write_checkpoint_metadata(const std::filesystem::path& dir,
                                      const checkpoint_index& index) {
  write_json_file(dir / checkpoint_metadata_name, index.to_json());
}

/// The names of rank r's data file and of its part of the metadata.
inline std::string rank_data_name(int r) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.bin", r);
  return b;
}
inline std::string rank_part_name(int r) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.json", r);
  return b;
}

/// Writes rank `rank`'s data file (rank_data_name) from `file` and its part
/// of the metadata (rank_part_name: an index of that one file, with the
/// tensors its pieces belong to), both atomically. Throws io_error.
inline void write_rank_part(const std::filesystem::path& dir, int rank, const rank_file& file,
                            const std::map<std::string, stored_tensor>& tensors) {
  checkpoint_index part;
  part.tensors = tensors;
  auto [f, pieces] = file.write(dir, rank_data_name(rank), 0);
  part.files.push_back(std::move(f));
  part.pieces = std::move(pieces);
  write_json_file(dir / rank_part_name(rank), part.to_json());
}

/// The metadata of the checkpoint in `dir` from the parts of ranks
/// [0, ranks) (write_rank_part), with the run state `run`: their files in
/// rank order, their pieces, their tensors (a tensor two ranks name with
/// other shapes or element types is an error). The parts are removed once
/// the metadata is written. Throws io_error naming a missing or damaged
/// part, or the tensor the parts disagree on.
inline checkpoint_index merge_rank_parts(const std::filesystem::path& dir, int ranks,
                                         const nlohmann::json& run) {
  checkpoint_index all;
  all.run = run;
  for (int r = 0; r < ranks; ++r) {
    const std::filesystem::path p = dir / rank_part_name(r);
    checkpoint_index part = checkpoint_index::from_json(
        read_json_file(p, "checkpoint part of rank " + std::to_string(r)), p.string());
    TESSERA_THROW_IF(part.files.size() != 1, io_error, "checkpoint part '", p.string(), "' lists ",
                     part.files.size(), " files, not its rank's one");
    for (auto& [name, t] : part.tensors) {
      auto [it, fresh] = all.tensors.emplace(name, t);
      if (fresh) continue;
      TESSERA_THROW_IF(it->second.shape != t.shape, io_error,
                       "checkpoint parts disagree on the "
                       "shape of tensor '",
                       name, "' (rank ", r, ")");
      for (const auto& [role, dt] : t.roles) {
        auto [rit, rfresh] = it->second.roles.emplace(role, dt);
        TESSERA_THROW_IF(!rfresh && rit->second != dt, io_error,
                         "checkpoint parts disagree on "
                         "the element type of ",
                         role, " of '", name, "' (rank ", r, ")");
      }
    }
    const int file = static_cast<int>(all.files.size());
    all.files.push_back(part.files[0]);
    for (stored_piece& piece : part.pieces) {
      piece.file = file;
      all.pieces.push_back(std::move(piece));
    }
  }
  write_checkpoint_metadata(dir, all);
  for (int r = 0; r < ranks; ++r) {
    std::error_code ec;
    std::filesystem::remove(dir / rank_part_name(r), ec);
  }
  return all;
}

}  // namespace tessera::train
