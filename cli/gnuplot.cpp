// gnuplot through popen (see gnuplot.h).
#include "cli/gnuplot.h"

#include <cstdio>
#include <cstdlib>

#include "src/util/error.h"

namespace tg {

bool gnuplot_available() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

void run_gnuplot(const std::string& who, const std::string& script) {
  FILE* gp = popen("gnuplot 2>&1", "w");
  TG_CHECK(gp, who, ": cannot start gnuplot");
  std::fputs(script.c_str(), gp);
  const int rc = pclose(gp);
  TG_CHECK(rc == 0, who, ": gnuplot failed (exit ", rc, "); install it with `apt-get install gnuplot-nox` (pngcairo terminal)");
}

}  // namespace tg
