// A small table-driven command-line parser: the same table that parses a subcommand's options
// generates its --help, so the two never drift apart.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tg::cli {

struct Option {
  std::string name;          // "--tokens"
  std::string metavar;       // "N"; empty for a flag
  std::string help;
  std::string default_value;  // shown in --help; empty when none
  bool repeated = false;     // takes one or more values ("--text FILE…")
};

struct Positional {
  std::string name;  // "CONFIG"
  std::string help;
  bool optional = false;  // optional arguments come last
};

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;  // by option name, without the dashes
  bool has(const std::string& name) const { return values.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  const std::vector<std::string>& all(const std::string& name) const;
  long long get_int(const std::string& name, long long fallback) const;
  double get_double(const std::string& name, double fallback) const;
};

struct Command {
  std::string name;
  std::string summary;
  std::vector<Positional> positional;
  std::vector<Option> options;
  std::function<int(const Args&)> run;
  std::function<std::string()> epilog;  // extra help text after the options (may be empty)
};

std::string help_text(const std::string& program, const Command& c);
// Parses argv[first..]; throws tg::Error naming the offending argument and the valid options.
Args parse(const std::string& program, const Command& c, const std::vector<std::string>& argv);

}  // namespace tg::cli
