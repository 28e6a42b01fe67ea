// Whole-line appends with checked writes, and the metrics rewind used by a resume.
#include "src/io/append_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/util/error.h"
#include "src/util/files.h"

namespace tg {

void AppendFile::open(const std::string& path) {
  close();
  // A log is a file: a named pipe there would block this open until a reader came.
  if (path_exists(path)) {
    const std::string problem = regular_file_problem(path);
    TG_CHECK(problem.empty(), "cannot open ", path, " for writing: it ", problem);
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  TG_CHECK(fd_ >= 0, "cannot open ", path, " for writing: ", std::strerror(errno));
  path_ = path;
}

void AppendFile::write_line(const std::string& line) {
  TG_CHECK(fd_ >= 0, "writing to ", path_.empty() ? std::string("a log file") : path_, ": the file is not open");
  struct stat st {};
  const off_t before = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  const std::string buf = line + "\n";
  size_t done = 0;
  int err = 0;
  while (done < buf.size()) {
    ssize_t n = ::write(fd_, buf.data() + done, buf.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += size_t(n);
  }
  if (err == 0) return;
  // Leave the file as it was: whole lines only.
  if (done > 0 && before >= 0) {
    const int r = ::ftruncate(fd_, before);
    (void)r;  // the error below is the one to report
  }
  throw Error(detail::concat("writing ", path_, " failed: ", std::strerror(err),
                             err == ENOSPC || err == EDQUOT ? " (the disk is full)" : ""));
}

void AppendFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int64_t drop_records_after_step(const std::string& path, int64_t step) {
  if (!path_exists(path)) return 0;
  const std::string problem = regular_file_problem(path);
  TG_CHECK(problem.empty(), "cannot read ", path, ": it ", problem);
  std::ifstream in(path);
  if (!in) return 0;
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    // Each line parsed as the JSON object it is (any length, any content: a line that is not
    // one, or has no integer step, stays).
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
        record["step"].get<int64_t>() > step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  if (dropped == 0) return 0;
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TG_CHECK(fd >= 0, "cannot rewrite ", path, ": ", std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < kept.size()) {
    ssize_t n = ::write(fd, kept.data() + done, kept.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += size_t(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw Error(detail::concat("rewriting ", path, " after the resume failed: ", std::strerror(err)));
  }
  return dropped;
}

}  // namespace tg
