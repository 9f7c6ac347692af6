// A preload library for tests/train/resume_kill.sh and run_folder.sh: with
// TESSERA_KILL_AFTER_STEP=N in the environment, the process sends itself
// SIGKILL right after the write that puts the N-th "step" line into a file
// named metrics.jsonl. The kill lands at the same point of every run
// whatever the machine's speed or load (a watcher polling the file from
// outside can be outrun by a fast machine: 24 small steps finish inside one
// poll), and SIGKILL is still a kill without warning: no handler, no flush,
// no unwinding.
// With TESSERA_KILL_SIGNAL=INT or TERM it sends that signal instead (to
// the writing thread, so it is handled before the write returns: the stop
// a run makes on it lands after the same step on every machine too).
// With TESSERA_HOLD_AFTER_STEP=N and TESSERA_HOLD_FILE=F instead, the
// writing thread waits after the N-th step line until file F exists: a
// test can act on a run that is certainly still going (start a second run
// into its folder, signal it) and then let it go on.
// With TESSERA_KILL_IN_SAVE=N it sends itself SIGKILL at its first write
// into checkpoint folder step-00000N (a rank killed in the middle of that
// save); with TESSERA_KILL_RANK=r as well, only world rank r of an MPI
// launch does.
//   LD_PRELOAD=libtessera_kill_after_step.so TESSERA_KILL_AFTER_STEP=14 train_llama ...
#include <dlfcn.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace {

std::atomic<long> step_lines{0};

long kill_after() {
  static const long n = [] {
    const char* s = std::getenv("TESSERA_KILL_AFTER_STEP");
    return s ? std::strtol(s, nullptr, 10) : 0L;
  }();
  return n;
}

int kill_signal() {
  static const int sig = [] {
    const char* s = std::getenv("TESSERA_KILL_SIGNAL");
    if (s && std::strcmp(s, "INT") == 0) return SIGINT;
    if (s && std::strcmp(s, "TERM") == 0) return SIGTERM;
    return SIGKILL;
  }();
  return sig;
}

// The path fd `fd` names ("" when unknown).
std::string fd_path(int fd) {
  char link[64], target[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<std::size_t>(n)) : std::string();
}

bool is_metrics_file(int fd) { return std::string_view(fd_path(fd)).ends_with("/metrics.jsonl"); }

// TESSERA_KILL_IN_SAVE: a write into step-00000N/ by the chosen rank.
void kill_in_save(int fd) {
  static const long step = [] {
    const char* s = std::getenv("TESSERA_KILL_IN_SAVE");
    return s ? std::strtol(s, nullptr, 10) : 0L;
  }();
  if (step <= 0) return;
  static const bool chosen = [] {
    const char* want = std::getenv("TESSERA_KILL_RANK");
    const char* mine = std::getenv("OMPI_COMM_WORLD_RANK");
    return want == nullptr || *want == 0 || (mine != nullptr && std::strcmp(want, mine) == 0);
  }();
  if (!chosen) return;
  char folder[40];
  std::snprintf(folder, sizeof folder, "/step-%06ld/", step);
  if (fd_path(fd).find(folder) != std::string::npos) raise(SIGKILL);
}

// The step records' key with its number: "step":<digit>.
long count_steps(std::string_view bytes) {
  constexpr std::string_view key = "\"step\":";
  long n = 0;
  for (std::size_t at = bytes.find(key); at != std::string_view::npos; at = bytes.find(key, at + 1))
    if (at + key.size() < bytes.size() && bytes[at + key.size()] >= '0' &&
        bytes[at + key.size()] <= '9')
      ++n;
  return n;
}

long env_long(const char* name) {
  const char* s = std::getenv(name);
  return s ? std::strtol(s, nullptr, 10) : 0L;
}

// After the real write: counts the step lines it carried, and kills the
// process (or holds it) once the N-th has reached the file.
void after_write(int fd, std::string_view bytes) {
  kill_in_save(fd);
  static const long hold_after = env_long("TESSERA_HOLD_AFTER_STEP");
  if ((kill_after() <= 0 && hold_after <= 0) || !is_metrics_file(fd)) return;
  const long lines = count_steps(bytes);
  const long before = lines > 0 ? step_lines.fetch_add(lines) : 0;
  auto reached = [&](long n) { return n > 0 && lines > 0 && before < n && before + lines >= n; };
  if (reached(kill_after())) raise(kill_signal());
  if (reached(hold_after))
    if (const char* f = std::getenv("TESSERA_HOLD_FILE"))
      while (access(f, F_OK) != 0) usleep(10000);
}

}  // namespace

extern "C" ssize_t write(int fd, const void* buf, size_t count) {
  using fn = ssize_t (*)(int, const void*, size_t);
  static const fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "write"));
  const ssize_t n = real(fd, buf, count);
  if (n > 0) after_write(fd, {static_cast<const char*>(buf), static_cast<std::size_t>(n)});
  return n;
}

extern "C" ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  using fn = ssize_t (*)(int, const struct iovec*, int);
  static const fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "writev"));
  const ssize_t n = real(fd, iov, iovcnt);
  ssize_t left = n;
  for (int i = 0; i < iovcnt && left > 0; ++i) {
    const auto len = static_cast<std::size_t>(left) < iov[i].iov_len
                         ? static_cast<std::size_t>(left)
                         : iov[i].iov_len;
    after_write(fd, {static_cast<const char*>(iov[i].iov_base), len});
    left -= static_cast<ssize_t>(len);
  }
  return n;
}
