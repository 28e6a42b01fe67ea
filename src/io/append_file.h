// A log file that takes whole lines or nothing: each line is one checked write(2) in append
// mode, and a failed or short write (a full disk) is cut back off, so the file never ends
// mid-line, and the failure is reported at once (tg::Error naming the file and the reason).
#pragma once
#include <string>

namespace tg {

class AppendFile {
 public:
  AppendFile() = default;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile() { close(); }

  // Opens (creating) `path` for appending; tg::Error if it cannot.
  void open(const std::string& path);
  bool is_open() const { return fd_ >= 0; }
  // Appends `line` and a newline in one write; on failure truncates the file back to its size
  // before the call and throws tg::Error.
  void write_line(const std::string& line);
  void close();
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Rewrites the JSON-lines file `path` without the records whose "step" is greater than `step`
// (lines without a step stay), through a temporary file and a rename; returns how many records
// it dropped. A missing file is left missing (returns 0).
int64_t drop_records_after_step(const std::string& path, int64_t step);

}  // namespace tg
