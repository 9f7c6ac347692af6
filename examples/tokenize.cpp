// tokenize: turn UTF-8 text files into a tessera token file.
//
// Shows the data layer's front door: the byte-level tokenizer
// (tessera/data/tokenizer.hpp) and the atomic token-file writer
// (tessera/data/token_file.hpp). The inputs are concatenated in the order
// given, every byte becomes one token (vocabulary 256), and the tokens are
// written as uint16 to OUT.tok through a temporary file and a rename, so OUT
// either holds the whole result or is left as it was. The training and
// validation split is not stored: readers hold out the end of the file
// (default 10%, see tessera::data::split_tokens).
//
// Run (from the repository root, after `cmake --preset host && cmake --build build/host`):
//
//   build/host/examples/tokenize data/fortunes.txt -o data/fortunes.tok
//
// --append-eot appends the end-of-text byte (ASCII ETX, 0x03) after each
// input file, marking document boundaries without growing the vocabulary.
//
// Exit status: 0 on success; 2 on a bad argument or input (a missing,
// unreadable or empty input, an output directory that is not writable), with
// one line on stderr naming the value; nothing is left at OUT in that case.

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessera/core/error.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/data/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using tessera::data::byte_tokenizer;

// Appends the bytes of `path` to `out`. Throws config_error naming the path.
void append_file(const std::string& path, std::string& out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  TESSERA_THROW_IF(f == nullptr, tessera::config_error, "cannot read input '", path,
                   "': ", std::strerror(errno));
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int e = errno;
  std::fclose(f);
  TESSERA_THROW_IF(failed, tessera::config_error, "cannot read input '", path,
                   "': ", std::strerror(e));
}

int run(const std::vector<std::string>& inputs, const std::string& out_path, bool append_eot) {
  // Fail before work: the output directory must exist and be writable.
  fs::path dir = fs::path(out_path).parent_path();
  if (dir.empty()) dir = ".";
  TESSERA_THROW_IF(!fs::is_directory(dir), tessera::config_error, "output directory '",
                   dir.string(), "' of '", out_path, "' does not exist");
  TESSERA_THROW_IF(::access(dir.c_str(), W_OK | X_OK) != 0, tessera::config_error,
                   "output directory '", dir.string(), "' of '", out_path,
                   "' is not writable: ", std::strerror(errno));
  TESSERA_THROW_IF(out_path.empty(), tessera::config_error, "output path is empty; give -o corpus.tok");
  TESSERA_THROW_IF(fs::is_directory(out_path), tessera::config_error, "output '", out_path,
                   "' is a directory; give a file name such as corpus.tok");
  for (const auto& in : inputs) {
    std::error_code ec;
    TESSERA_THROW_IF(fs::exists(out_path) && fs::equivalent(in, out_path, ec), tessera::config_error,
                     "output '", out_path, "' is the input '", in, "'; it would be overwritten");
  }

  std::string text;
  std::size_t bytes_in = 0;
  std::vector<std::uint32_t> tokens;
  for (const auto& in : inputs) {
    TESSERA_THROW_IF(fs::is_directory(in), tessera::config_error, "input '", in,
                     "' is a directory, not a text file");
    text.clear();
    append_file(in, text);
    const std::size_t bad = tessera::data::first_invalid_utf8(text);
    TESSERA_THROW_IF(bad != std::string::npos, tessera::config_error, "input '", in,
                     "' is not UTF-8 text (invalid byte at offset ", bad, " of ", text.size(), ")");
    bytes_in += text.size();
    const auto t = byte_tokenizer::encode(text);
    tokens.insert(tokens.end(), t.begin(), t.end());
    if (append_eot) tokens.push_back(byte_tokenizer::eot);
  }
  TESSERA_THROW_IF(bytes_in == 0, tessera::config_error, "input is empty: 0 bytes in ",
                   inputs.size(), " file(s), starting with '", inputs.front(), "'");

  tessera::data::write_token_file(out_path, tokens, byte_tokenizer::vocab_size,
                                  tessera::data::token_dtype::u16);
  // Read it back through the validating reader before reporting success.
  const auto check = tessera::data::token_file::open(out_path);
  TESSERA_THROW_IF(check.size() != tokens.size(), tessera::io_error, "wrote ", tokens.size(),
                   " tokens to '", out_path, "' but read back ", check.size());
  std::cout << "tokenize: " << bytes_in << " bytes in (" << inputs.size() << " file"
            << (inputs.size() == 1 ? "" : "s") << ") -> " << tokens.size()
            << " tokens out (uint16, vocab " << byte_tokenizer::vocab_size
            << (append_eot ? ", end-of-text 0x03 after each file" : "") << ") -> " << out_path
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Byte-level tokenize UTF-8 text files into a tessera token file (uint16, vocab 256)"};
  std::vector<std::string> inputs;
  std::string out_path;
  bool append_eot = false;
  app.add_option("INPUT", inputs, "text files, concatenated in the order given")->required();
  app.add_option("-o,--output", out_path, "token file to write (e.g. data/fortunes.tok)")
      ->required();
  app.add_flag("--append-eot", append_eot,
               "append the end-of-text byte (0x03) after each input file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "tokenize: error: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    return run(inputs, out_path, append_eot);
  } catch (const tessera::error& e) {
    std::cerr << "tokenize: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tokenize: error: " << e.what() << "\n";
    return 2;
  }
}
