// Files read and written by name (src/util/files.h): only regular files are read, and a write
// lands whole or not at all.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "src/util/error.h"
#include "src/util/files.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("tilegrad_files_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / name;
  fs::remove_all(p);
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tg::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Files, ReadsRegularFilesOnly) {
  const fs::path text = scratch("text.txt");
  std::ofstream(text) << "hello\n";
  EXPECT_EQ(tg::read_regular_file(text.string(), "test"), "hello\n");
  EXPECT_EQ(tg::regular_file_problem(text.string()), "");
  EXPECT_TRUE(tg::path_exists(text.string()));
  // Each kind of non-file says what it is, before any read: a device never ends, a pipe blocks.
  EXPECT_NE(error_of([&] { tg::read_regular_file(text.parent_path().string(), "test"); }).find("is a directory"),
            std::string::npos);
  EXPECT_NE(error_of([] { tg::read_regular_file("/dev/zero", "test"); }).find("test: /dev/zero is a device"),
            std::string::npos);
  const fs::path fifo = scratch("pipe");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { tg::read_regular_file(fifo.string(), "test"); }).find("named pipe"), std::string::npos);
  const fs::path missing = scratch("missing.txt");
  EXPECT_FALSE(tg::path_exists(missing.string()));
  EXPECT_NE(error_of([&] { tg::read_regular_file(missing.string(), "test"); }).find("does not exist"),
            std::string::npos);
  // A file that is small by design is read no further than its cap.
  EXPECT_NE(error_of([&] { tg::read_regular_file(text.string(), "test", 3); }).find("larger than 3 bytes"),
            std::string::npos);
}

TEST(Files, WritesWholeOrNotAtAll) {
  const fs::path p = scratch("out.json");
  tg::write_file_atomically(p.string(), "first", "test");
  tg::write_file_atomically(p.string(), "second, longer", "test");
  EXPECT_EQ(tg::read_regular_file(p.string(), "test"), "second, longer");
  EXPECT_FALSE(fs::exists(p.parent_path() / ".out.json.tmp"));
  const std::string err =
      error_of([&] { tg::write_file_atomically((p.parent_path() / "no/such/dir/x").string(), "x", "test"); });
  EXPECT_NE(err.find("test: cannot write "), std::string::npos) << err;
  EXPECT_NE(err.find("No such file or directory"), std::string::npos) << err;
}

}  // namespace
