// gnuplot, driven through a pipe: `tilegrad plot` and `tilegrad bench memory --out` draw their
// PNGs with it (pngcairo terminal; Debian's gnuplot-nox has it).
#pragma once
#include <string>

namespace tg {

// Whether a gnuplot command is on PATH.
bool gnuplot_available();

// `s` as the inside of a single-quoted gnuplot string: a quote is doubled, so a path or title
// is always data, never script. A line break (which no gnuplot string can hold) is an error.
std::string gnuplot_quote(const std::string& who, const std::string& s);

// Draws `script` on `terminal` (e.g. "pngcairo size 900,540") into the file `output`; the script
// sets neither. The output
// file is opened first, so an unwritable path is an error naming it and the reason, not a PNG
// sent to the terminal; a failing gnuplot's error is tg::Error naming `who` and gnuplot's last
// message, and only a missing gnuplot names the package to install.
void run_gnuplot(const std::string& who, const std::string& terminal, const std::string& output,
                 const std::string& script);

}  // namespace tg
