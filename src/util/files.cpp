// Regular files only (see files.h).
#include "src/util/files.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/util/error.h"

namespace tg {

std::string regular_file_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "does not exist" : std::string("cannot be read (") + std::strerror(errno) + ")";
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (S_ISFIFO(st.st_mode)) return "is a named pipe (FIFO), not a file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device, not a file";
  if (S_ISSOCK(st.st_mode)) return "is a socket, not a file";
  return "is not a regular file";
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_regular_file(const std::string& path, const std::string& context, uint64_t max_bytes) {
  const std::string problem = regular_file_problem(path);
  if (!problem.empty()) throw Error(context + ": " + path + " " + problem);
  // O_NONBLOCK: should the path have become a FIFO since the check, the open does not wait.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(context + ": cannot open " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) break;
  }
  ::close(fd);
  if (err != 0) throw Error(context + ": reading " + path + " failed: " + std::strerror(err));
  if (out.size() > max_bytes)
    throw Error(context + ": " + path + " is larger than " + std::to_string(max_bytes) + " bytes, which such a file never is");
  return out;
}

void write_file_atomically(const std::string& path, const std::string& text, const std::string& context) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string tmp = dir + "." + path.substr(slash == std::string::npos ? 0 : slash + 1) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(context + ": cannot write " + path + ": " + std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += size_t(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw Error(context + ": cannot write " + path + ": " + std::strerror(err) +
                (err == ENOSPC || err == EDQUOT ? " (the disk is full)" : ""));
  }
}

}  // namespace tg
