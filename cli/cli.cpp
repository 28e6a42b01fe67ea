// Option parsing and help generation for the tilegrad subcommands.
#include "cli/cli.h"

#include <sstream>

#include "src/util/error.h"

namespace tg::cli {

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values.find(name);
  return it == values.end() || it->second.empty() ? fallback : it->second.back();
}

const std::vector<std::string>& Args::all(const std::string& name) const {
  static const std::vector<std::string> none;
  auto it = values.find(name);
  return it == values.end() ? none : it->second;
}

long long Args::get_int(const std::string& name, long long fallback) const {
  if (!has(name)) return fallback;
  std::string v = get(name, "");
  try {
    size_t used = 0;
    long long r = std::stoll(v, &used);
    if (used == v.size()) return r;
  } catch (...) {
  }
  TG_CHECK(false, "--", name, ": expected an integer, got '", v, "'");
  return 0;
}

double Args::get_double(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  std::string v = get(name, "");
  try {
    size_t used = 0;
    double r = std::stod(v, &used);
    if (used == v.size()) return r;
  } catch (...) {
  }
  TG_CHECK(false, "--", name, ": expected a number, got '", v, "'");
  return 0;
}

std::string help_text(const std::string& program, const Command& c) {
  std::ostringstream os;
  os << "usage: " << program << " " << c.name;
  for (const Positional& p : c.positional) os << (p.optional ? " [" + p.name + "]" : " " + p.name);
  for (const Option& o : c.options) {
    os << " [" << o.name;
    if (!o.metavar.empty()) os << " " << o.metavar << (o.repeated ? "…" : "");
    os << "]";
  }
  os << "\n\n" << c.summary << "\n";
  if (!c.positional.empty()) {
    os << "\narguments:\n";
    for (const Positional& p : c.positional) os << "  " << p.name << "\n      " << p.help << "\n";
  }
  os << "\noptions:\n";
  for (const Option& o : c.options) {
    os << "  " << o.name;
    if (!o.metavar.empty()) os << " " << o.metavar << (o.repeated ? "…" : "");
    os << "\n      " << o.help;
    if (!o.default_value.empty()) os << " (default: " << o.default_value << ")";
    os << "\n";
  }
  os << "  --help\n      show this help\n";
  if (c.epilog) os << "\n" << c.epilog();
  return os.str();
}

Args parse(const std::string& program, const Command& c, const std::vector<std::string>& argv) {
  Args a;
  auto valid = [&] {
    std::string s;
    for (const Option& o : c.options) s += (s.empty() ? "" : ", ") + o.name;
    return s.empty() ? std::string("none") : s;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      a.positional.push_back(arg);
      continue;
    }
    std::string name = arg, inline_value;
    bool has_inline = false;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
      has_inline = true;
    }
    const Option* opt = nullptr;
    for (const Option& o : c.options)
      if (o.name == name) opt = &o;
    TG_CHECK(opt, program, " ", c.name, ": unknown option '", name, "'; valid options: ", valid(),
             " (see ", program, " ", c.name, " --help)");
    std::vector<std::string>& vals = a.values[name.substr(2)];
    if (opt->metavar.empty()) {
      TG_CHECK(!has_inline, program, " ", c.name, ": option ", name, " takes no value");
      vals.push_back("1");
      continue;
    }
    if (has_inline) {
      vals.push_back(inline_value);
    } else {
      TG_CHECK(i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0, program, " ", c.name, ": option ", name,
               " needs a value (", opt->metavar, ")");
      vals.push_back(argv[++i]);
    }
    // A repeated option keeps taking values until the next option.
    while (opt->repeated && i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) vals.push_back(argv[++i]);
  }
  size_t required = 0;
  for (const Positional& p : c.positional) required += p.optional ? 0 : 1;
  TG_CHECK(a.positional.size() >= required && a.positional.size() <= c.positional.size(), program, " ", c.name,
           ": expected ", required == c.positional.size() ? std::to_string(required)
                                                           : std::to_string(required) + " to " + std::to_string(c.positional.size()),
           " argument(s)", [&] {
             std::string s;
             for (const Positional& p : c.positional) s += " " + p.name;
             return s.empty() ? std::string() : " (" + s.substr(1) + ")";
           }(),
           ", got ", a.positional.size(), "; see ", program, " ", c.name, " --help");
  return a;
}

}  // namespace tg::cli
