// Tests include/tessera/train/console.hpp: the progress line fits the
// terminal (a 60-column terminal once wrapped it), and the terminal's width
// falls back to $COLUMNS.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "tessera/train/console.hpp"

namespace test_train_console {

using namespace tessera;

TEST_CASE("the progress line fits the terminal's columns", "[train][console]") {
  train::step_metrics m;
  m.step = 120;
  m.loss = 2.41;
  m.val_loss = 2.47;
  m.lr = 3e-4;
  m.grad_norm = 0.512;
  m.tokens_per_s = 12345;
  m.mem_allocated = 12u << 20;
  m.mem_peak = 45u << 20;
  const std::string tail = train::format_step(m, 1000, 2.1);
  REQUIRE(tail.size() > 100);  // wider than the terminals below
  for (int columns : {20, 40, 60, 80, 200}) {
    const std::string line = train::fitted_progress(120, 1000, tail, columns);
    INFO(columns << ": " << line);
    CHECK(static_cast<int>(line.size()) <= std::max(columns - 1, 13));  // a bar of 10 at least
    CHECK(line.rfind("[", 0) == 0);
    // Cut with "..." only when it does not fit.
    const bool whole = line.size() >= tail.size() &&
                       line.compare(line.size() - tail.size(), tail.size(), tail) == 0;
    CHECK(whole == (static_cast<int>(tail.size()) + 40 < columns));
  }
  // 120 of 1000 steps is 12%: the bar's filled share.
  const std::string bar = train::fitted_progress(120, 1000, "", 200);
  CHECK(bar.substr(0, 32) == "[####..........................]");
}

TEST_CASE("the terminal's width falls back to $COLUMNS, then 80", "[train][console]") {
  // Under ctest standard output is no terminal: the ioctl fails.
  if (::isatty(STDOUT_FILENO)) {
    WARN("standard output is a terminal: its width wins over $COLUMNS; not checked");
    return;
  }
  ::setenv("COLUMNS", "61", 1);
  CHECK(train::terminal_columns() == 61);
  ::unsetenv("COLUMNS");
  CHECK(train::terminal_columns() == 80);
}

}  // namespace test_train_console
