// Files read by name, whole: configs, tokenizer vocabularies and texts, a run's metrics, a
// checkpoint's `latest` pointer and checksum. Only regular files are read: a named pipe (FIFO)
// blocks its reader until a writer comes, and a device such as /dev/zero never ends, so either
// would hang the command or exhaust memory; each is an error that says what the path is instead.
#pragma once
#include <cstdint>
#include <limits>
#include <string>

namespace tg {

// "" when `path` (its symlinks followed) is a regular file; otherwise why not, as a phrase that
// follows the path: "does not exist", "is a directory", "is a named pipe (FIFO), not a file",
// "is a device, not a file", or "cannot be read (<the system's reason>)".
std::string regular_file_problem(const std::string& path);

// Whether anything is at `path` (its symlinks followed): a file, a folder, a pipe or a device.
bool path_exists(const std::string& path);

// The whole file. tg::Error "<context>: <why>" when it is not a regular file, cannot be read, or
// holds more than `max_bytes` (files that are small by design: a read stops there).
std::string read_regular_file(const std::string& path, const std::string& context,
                              uint64_t max_bytes = std::numeric_limits<uint64_t>::max());

// Writes `text` to `path` whole or not at all: into a temporary file beside it, renamed over
// `path` once complete. A failed write (a full disk) removes the temporary file and throws
// tg::Error "<context>: cannot write <path>: <reason>"; an earlier file at `path` is untouched.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& context);

}  // namespace tg
