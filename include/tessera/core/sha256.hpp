#pragma once
/// \file core/sha256.hpp
/// SHA-256 of a stream of bytes through OpenSSL's EVP interface (libcrypto,
/// which tessera::host links): the fingerprints of token files and of
/// checkpoint files.

#include <openssl/evp.h>

#include <cstddef>
#include <memory>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera {

/// A SHA-256 being computed: update() with the bytes in order, then hex().
/// Every OpenSSL failure throws io_error naming `what` (the file hashed)
/// and the call. Not copyable.
class sha256_stream {
 public:
  explicit sha256_stream(std::string what) : what_(std::move(what)), ctx_(EVP_MD_CTX_new()) {
    ok(ctx_ ? 1 : 0, "EVP_MD_CTX_new");
    ok(EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr), "EVP_DigestInit_ex");
  }
  /// Hashes bytes [p, p + n).
  void update(const void* p, std::size_t n) {
    if (n) ok(EVP_DigestUpdate(ctx_.get(), p, n), "EVP_DigestUpdate");
  }
  /// The digest as 64 lowercase hex digits; the stream is finished.
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    ok(EVP_DigestFinal_ex(ctx_.get(), md, &len), "EVP_DigestFinal_ex");
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < len; ++i) {
      out += digits[md[i] >> 4];
      out += digits[md[i] & 15];
    }
    return out;
  }

 private:
  struct ctx_free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  void ok(int rc, const char* call) const {
    TESSERA_THROW_IF(rc != 1, io_error, "SHA-256 of '", what_, "': OpenSSL ", call, " failed");
  }
  std::string what_;
  std::unique_ptr<EVP_MD_CTX, ctx_free> ctx_;
};

}  // namespace tessera
