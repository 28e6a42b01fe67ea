// gnuplot through popen (see gnuplot.h).
#include "cli/gnuplot.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "src/util/error.h"

namespace tg {

bool gnuplot_available() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

std::string gnuplot_quote(const std::string& who, const std::string& s) {
  TG_CHECK(s.find_first_of("\r\n") == std::string::npos, who, ": '", s,
           "' holds a line break, which a gnuplot script cannot quote; use another path or name");
  std::string out;
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out;
}

void run_gnuplot(const std::string& who, const std::string& terminal, const std::string& output,
                 const std::string& script) {
  TG_CHECK(!output.empty(), who, ": the output path is empty");
  const std::string quoted_output = gnuplot_quote(who, output);
  TG_CHECK(gnuplot_available(), who, ": gnuplot is not installed; install it with `apt-get install gnuplot-nox`");
  {
    std::ofstream probe(output, std::ios::binary | std::ios::trunc);
    TG_CHECK(probe.good(), who, ": cannot write ", output, ": ", std::strerror(errno));
  }
  // gnuplot's messages go to a file of their own, so its last one can name what failed.
  char log_path[] = "/tmp/tilegrad_gnuplot_XXXXXX";
  const int log_fd = mkstemp(log_path);
  TG_CHECK(log_fd >= 0, who, ": cannot create a temporary file for gnuplot's messages: ", std::strerror(errno));
  close(log_fd);
  struct RemoveLog {
    const char* path;
    ~RemoveLog() { std::remove(path); }
  } remove_log{log_path};
  FILE* gp = popen(("gnuplot > /dev/null 2> " + std::string(log_path)).c_str(), "w");
  TG_CHECK(gp, who, ": cannot start gnuplot: ", std::strerror(errno));
  std::fputs(("set terminal " + terminal + "\nset output '" + quoted_output + "'\n" + script +
              "\nset output\n").c_str(), gp);
  const int rc = pclose(gp);
  std::string last, line;
  std::ifstream log(log_path);
  while (std::getline(log, line))
    if (line.find_first_not_of(" \t^") != std::string::npos) last = line;
  std::error_code ec;
  const bool written = std::filesystem::file_size(output, ec) > 0 && !ec;
  if (rc != 0 || !written) std::filesystem::remove(output, ec);  // no empty or partial PNG left behind
  TG_CHECK(rc == 0 && written, who, ": gnuplot failed (exit ", rc, ")", last.empty() ? std::string() : ": " + last,
           "; no plot written to ", output);
}

}  // namespace tg
