// gnuplot, driven through a pipe: `tilegrad plot` and `tilegrad bench memory --out` draw their
// PNGs with it (pngcairo terminal; Debian's gnuplot-nox has it).
#pragma once
#include <string>

namespace tg {

// Whether a gnuplot command is on PATH.
bool gnuplot_available();

// Feeds `script` to gnuplot; tg::Error naming `who`, the exit status and the package to install
// when gnuplot cannot start or fails.
void run_gnuplot(const std::string& who, const std::string& script);

}  // namespace tg
