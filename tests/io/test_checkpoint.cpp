// Tests for HDF5 checkpoints: round trip, latest pointer, pruning, corruption detection, fallback, kill -9.
#include "src/io/checkpoint.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <thread>

#include "src/util/error.h"

#ifndef TILEGRAD_SOURCE_DIR
#define TILEGRAD_SOURCE_DIR "/work/main"
#endif

namespace fs = std::filesystem;
using namespace tg;

namespace {

// A fresh directory per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("tg_ckpt_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Values depend on the step so a checkpoint's arrays can be checked for internal consistency.
float value_at(int64_t step, size_t i) { return static_cast<float>(step) + static_cast<float>(i % 1000) * 0.001f; }

CheckpointData make_data(int64_t step, int64_t big = 1000) {
  CheckpointData d;
  CheckpointArray w{"params/transformer.wte.weight", {big / 4, 4}, {}};
  for (int64_t i = 0; i < big; ++i) w.data.push_back(value_at(step, static_cast<size_t>(i)));
  d.arrays.push_back(w);
  CheckpointArray ln{"params/transformer.h.0.ln_1.weight", {8}, {}};
  for (int i = 0; i < 8; ++i) ln.data.push_back(1.0f + i);
  d.arrays.push_back(ln);
  d.arrays.push_back({"optim/m/transformer.wte.weight", {big / 4, 4}, std::vector<float>(big, -0.5f)});
  d.arrays.push_back({"misc/scalar", {}, {3.25f}});
  d.arrays.push_back({"misc/empty", {0, 5}, {}});
  d.ints = {{"step", step}, {"tokens_seen", step * 4096}, {"world_size", 2}, {"neg", -7}};
  d.u64_arrays = {{"rng/rank0", {0xdeadbeefcafef00dULL, 1, 2, 3}}, {"loader_cursor", {static_cast<uint64_t>(step), 17}},
                  {"empty", {}}};
  std::string yaml;
  for (int i = 0; i < 300; ++i) yaml += "key_" + std::to_string(i) + ": value  # ünïcødé\n";
  d.strings = {{"config_yaml", yaml}, {"empty", ""}};
  return d;
}

void expect_equal(const CheckpointData& a, const CheckpointData& b) {
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.version, b.version);
  ASSERT_EQ(a.arrays.size(), b.arrays.size());
  for (size_t i = 0; i < a.arrays.size(); ++i) {
    EXPECT_EQ(a.arrays[i].name, b.arrays[i].name);
    EXPECT_EQ(a.arrays[i].shape, b.arrays[i].shape) << a.arrays[i].name;
    ASSERT_EQ(a.arrays[i].data.size(), b.arrays[i].data.size()) << a.arrays[i].name;
    if (!a.arrays[i].data.empty()) {  // bitwise, so NaN payloads and -0.0 count
      EXPECT_EQ(0, std::memcmp(a.arrays[i].data.data(), b.arrays[i].data.data(), a.arrays[i].data.size() * 4))
          << a.arrays[i].name;
    }
  }
  EXPECT_EQ(a.ints, b.ints);
  EXPECT_EQ(a.u64_arrays, b.u64_arrays);
  EXPECT_EQ(a.strings, b.strings);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

// Flips one byte in the middle of the first chunk of `dataset`'s stored data.
void flip_byte_in_dataset(const std::string& file, const std::string& dataset) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t ds = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  hid_t space = H5Dget_space(ds);
  hsize_t offset[8] = {0};
  unsigned mask = 0;
  haddr_t addr = 0;
  hsize_t size = 0;
  // Chunked datasets have no single H5Dget_offset; the chunk's address is what we need.
  ASSERT_GE(H5Dget_chunk_info(ds, space, 0, offset, &mask, &addr, &size), 0);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(f);
  ASSERT_GT(size, 100u);
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(addr + size / 2));
  char c = 0;
  io.read(&c, 1);
  c ^= 0x10;
  io.seekp(static_cast<std::streamoff>(addr + size / 2));
  io.write(&c, 1);
  ASSERT_TRUE(io.good());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Checkpoint, RoundTripIsBitwiseExact) {
  TempDir dir;
  CheckpointData d = make_data(42);
  d.arrays[0].data[3] = std::numeric_limits<float>::quiet_NaN();
  d.arrays[0].data[4] = -0.0f;
  d.arrays[0].data[5] = std::numeric_limits<float>::denorm_min();
  std::string path = save_checkpoint(dir.str(), 42, d, 0);
  EXPECT_EQ(path, (dir.path / "ckpt-42.h5").string());
  CheckpointData back = load_checkpoint(path);
  expect_equal(d, back);
}

TEST(Checkpoint, LatestPointerFollowsSaves) {
  TempDir dir;
  save_checkpoint(dir.str(), 1, make_data(1), 0);
  EXPECT_EQ(read_text(dir.path / "latest"), "ckpt-1.h5\n");
  save_checkpoint(dir.str(), 10, make_data(10), 0);
  EXPECT_EQ(read_text(dir.path / "latest"), "ckpt-10.h5\n");
  auto [path, data] = resolve_and_load(dir.str(), "latest");
  EXPECT_EQ(path, (dir.path / "ckpt-10.h5").string());
  EXPECT_EQ(data.ints.at("step"), 10);
  // Numeric, not lexicographic, order: ckpt-2 < ckpt-10.
  save_checkpoint(dir.str(), 2, make_data(2), 0);
  auto all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(fs::path(all.back()).filename(), "ckpt-10.h5");
  // An explicit path loads exactly that file, relative to the directory or not.
  EXPECT_EQ(resolve_and_load(dir.str(), "ckpt-1.h5").second.ints.at("step"), 1);
  EXPECT_EQ(resolve_and_load("", all[0]).second.ints.at("step"), 1);
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Checkpoint, KeepLastPrunesOldestButNeverNewestOrLatest) {
  TempDir dir;
  for (int s = 1; s <= 5; ++s) save_checkpoint(dir.str(), s * 100, make_data(s), 2);
  auto all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[0]).filename(), "ckpt-400.h5");
  EXPECT_EQ(fs::path(all[1]).filename(), "ckpt-500.h5");
  // keep_last = 1 keeps only the newest.
  save_checkpoint(dir.str(), 600, make_data(6), 1);
  all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(fs::path(all[0]).filename(), "ckpt-600.h5");
  // Saving an older step (a rewound run) makes `latest` point below the newest: both survive.
  save_checkpoint(dir.str(), 50, make_data(7), 1);
  all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[0]).filename(), "ckpt-50.h5");
  EXPECT_EQ(fs::path(all[1]).filename(), "ckpt-600.h5");
  EXPECT_EQ(read_text(dir.path / "latest"), "ckpt-50.h5\n");
  // keep_last <= 0 keeps everything.
  save_checkpoint(dir.str(), 700, make_data(8), 0);
  EXPECT_EQ(list_checkpoints(dir.str()).size(), 3u);
}

TEST(Checkpoint, FlippedByteInDataIsDetected) {
  TempDir dir;
  CheckpointData d = make_data(3, 100000);
  std::string path = save_checkpoint(dir.str(), 3, d, 0);
  flip_byte_in_dataset(path, "params/transformer.wte.weight");
  // The whole-file checksum rejects the file before HDF5 reads it.
  std::string err = error_of([&] { load_checkpoint(path); });
  std::cout << "  flipped byte: " << err << "\n";
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("whole-file checksum mismatch"), std::string::npos) << err;
  // Without the sidecar (a checkpoint from before checksums), HDF5's Fletcher32 names the dataset.
  fs::remove(path + ".sum");
  testing::internal::CaptureStderr();
  err = error_of([&] { load_checkpoint(path); });
  testing::internal::GetCapturedStderr();
  std::cout << "  without the sidecar: " << err << "\n";
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("params/transformer.wte.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
}

TEST(Checkpoint, TruncatedFileIsReported) {
  TempDir dir;
  std::string path = save_checkpoint(dir.str(), 3, make_data(3, 100000), 0);
  fs::resize_file(path, fs::file_size(path) / 2);
  std::string err = error_of([&] { load_checkpoint(path); });
  std::cout << "  truncated: " << err << "\n";
  EXPECT_NE(err.find(path), std::string::npos) << err;
  fs::resize_file(path, 0);
  err = error_of([&] { load_checkpoint(path); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  err = error_of([&] { load_checkpoint(dir.str() + "/nope.h5"); });
  std::cout << "  missing: " << err << "\n";
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
}

TEST(Checkpoint, WrongFormatOrVersionIsReported) {
  TempDir dir;
  CheckpointData d = make_data(1);
  d.format = "someone-elses-format";
  std::string path = save_checkpoint(dir.str(), 1, d, 0);
  std::string err = error_of([&] { load_checkpoint(path); });
  std::cout << "  format: " << err << "\n";
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("someone-elses-format"), std::string::npos) << err;
  EXPECT_NE(err.find("tilegrad-checkpoint"), std::string::npos) << err;

  d = make_data(2);
  d.version = 2;
  path = save_checkpoint(dir.str(), 2, d, 0);
  err = error_of([&] { load_checkpoint(path); });
  std::cout << "  version: " << err << "\n";
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("'version' is 2"), std::string::npos) << err;
}

TEST(Checkpoint, InvalidInputIsRejectedBeforeWriting) {
  TempDir dir;
  CheckpointData d = make_data(1);
  d.arrays[0].data.pop_back();
  std::string err = error_of([&] { save_checkpoint(dir.str(), 1, d, 0); });
  EXPECT_NE(err.find("params/transformer.wte.weight"), std::string::npos) << err;
  d = make_data(1);
  d.arrays.push_back({"params/transformer.wte.weight/x", {1}, {1.0f}});
  EXPECT_NE(error_of([&] { save_checkpoint(dir.str(), 1, d, 0); }).find("both a dataset and a group"),
            std::string::npos);
  d = make_data(1);
  d.arrays.push_back({"state/x", {1}, {1.0f}});
  EXPECT_NE(error_of([&] { save_checkpoint(dir.str(), 1, d, 0); }).find("reserved"), std::string::npos);
  EXPECT_TRUE(list_checkpoints(dir.str()).empty());
  EXPECT_FALSE(fs::exists(dir.path / "latest"));
}

TEST(Checkpoint, ResolveLatestSkipsTempFilesAndFallsBackFromCorruption) {
  TempDir dir;
  save_checkpoint(dir.str(), 1, make_data(1, 100000), 0);
  save_checkpoint(dir.str(), 2, make_data(2, 100000), 0);
  std::string newest = save_checkpoint(dir.str(), 3, make_data(3, 100000), 0);
  // A leftover from a save that was killed: higher step, garbage content.
  std::ofstream(dir.path / ".ckpt-4.h5.tmp") << "half a checkpoint";
  flip_byte_in_dataset(newest, "optim/m/transformer.wte.weight");

  testing::internal::CaptureStderr();
  auto [path, data] = resolve_and_load(dir.str(), "latest");
  std::string log = testing::internal::GetCapturedStderr();
  std::cout << "  stderr:\n" << log;
  EXPECT_EQ(path, (dir.path / "ckpt-2.h5").string());
  EXPECT_EQ(data.ints.at("step"), 2);
  EXPECT_NE(log.find("falling back"), std::string::npos) << log;
  EXPECT_NE(log.find("ckpt-3.h5"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming from " + path), std::string::npos) << log;
  EXPECT_EQ(log.find(".tmp"), std::string::npos) << log;

  // Without a latest pointer: the newest complete file that loads, again skipping the corrupt one.
  fs::remove(dir.path / "latest");
  testing::internal::CaptureStderr();
  path = resolve_and_load(dir.str(), "latest").first;
  log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(path, (dir.path / "ckpt-2.h5").string());
  EXPECT_NE(log.find("missing"), std::string::npos) << log;

  // An explicit path does not fall back.
  EXPECT_NE(error_of([&] { resolve_and_load(dir.str(), newest); }).find("checksum"), std::string::npos);

  // Nothing loadable: the error says where it looked and what to give instead.
  TempDir empty;
  testing::internal::CaptureStderr();
  std::string err = error_of([&] { resolve_and_load(empty.str(), "latest"); });
  testing::internal::GetCapturedStderr();
  std::cout << "  nothing: " << err << "\n";
  EXPECT_NE(err.find(empty.str()), std::string::npos) << err;
  EXPECT_NE(err.find("give the directory of a run that has saved one"), std::string::npos) << err;
  err = error_of([&] { resolve_and_load(empty.str() + "/missing_dir", "latest"); });
  std::cout << "  missing: " << err << "\n";
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
  EXPECT_NE(err.find("give a run directory"), std::string::npos) << err;
}

// `latest` and a checksum sidecar are tiny by design: a device or a named pipe in their place
// (one never ends, the other blocks its reader) is never read whole; `latest` then falls back to
// the newest checkpoint that loads, and a sidecar that is not a file refuses its checkpoint.
// A file without a sidecar that is not HDF5 at all is named as such.
TEST(Checkpoint, LatestOrSidecarThatIsNotAFileIsNeverReadWhole) {
  TempDir dir;
  save_checkpoint(dir.str(), 1, make_data(1, 1000), 0);
  const std::string newest = save_checkpoint(dir.str(), 2, make_data(2, 1000), 0);
  for (const std::string kind : {"device", "fifo"}) {
    fs::remove(dir.path / "latest");
    if (kind == "device") fs::create_symlink("/dev/zero", dir.path / "latest");
    else ASSERT_EQ(mkfifo((dir.path / "latest").c_str(), 0600), 0);
    testing::internal::CaptureStderr();
    auto [path, data] = resolve_and_load(dir.str(), "latest");
    const std::string log = testing::internal::GetCapturedStderr();
    EXPECT_EQ(path, newest) << kind;
    EXPECT_NE(log.find(kind == "device" ? "is a device" : "named pipe"), std::string::npos) << log;
    EXPECT_NE(log.find("falling back"), std::string::npos) << log;
  }
  fs::remove(newest + ".sum");
  fs::create_symlink("/dev/zero", newest + ".sum");
  EXPECT_NE(error_of([&] { resolve_and_load(dir.str(), newest); }).find("is a device"), std::string::npos);
  const fs::path text = dir.path / "notes.txt";
  std::ofstream(text) << "not a checkpoint\n";
  EXPECT_NE(error_of([&] { resolve_and_load("", text.string()); }).find("not an HDF5 file"), std::string::npos);
}

bool bitwise_equal(const CheckpointData& a, const CheckpointData& b) {
  if (a.format != b.format || a.version != b.version || a.ints != b.ints || a.u64_arrays != b.u64_arrays ||
      a.strings != b.strings || a.arrays.size() != b.arrays.size())
    return false;
  for (size_t i = 0; i < a.arrays.size(); ++i) {
    const auto &x = a.arrays[i], &y = b.arrays[i];
    if (x.name != y.name || x.shape != y.shape || x.data.size() != y.data.size() ||
        (!x.data.empty() && std::memcmp(x.data.data(), y.data.data(), x.data.size() * 4) != 0))
      return false;
  }
  return true;
}

// A single flipped byte anywhere in the file (data, chunk index, object headers, superblock)
// must give an error or, when it lands in dead space (metadata HDF5 freed and did not reuse,
// e.g. a group's object header before it grew), identical data; never silently different data
// and never leaked HDF5 handles. Runs in a child process: libhdf5 itself leaks a little memory
// on some corrupt-metadata error paths, which must not pollute this process (or LeakSanitizer).
TEST(Checkpoint, FlippedByteAnywhereNeverGivesWrongData) {
  TempDir dir;
  CheckpointData d;
  d.arrays.push_back({"params/a", {300}, std::vector<float>(300, 1.5f)});
  d.arrays.push_back({"params/scalar", {}, {2.0f}});
  d.ints["step"] = 5;
  d.u64_arrays["rng"] = {1, 2, 3};
  d.strings["config_yaml"] = "a: 1\n";
  std::string path = save_checkpoint(dir.str(), 5, d, 0);
  const int64_t size = static_cast<int64_t>(fs::file_size(path));
  // HDF5's own checks are what this exercises (the whole-file checksum would catch every flip
  // before them: Checkpoint.WholeFileChecksumCatchesEveryFlip); files without a sidecar are
  // still loaded, so they must hold on their own.
  fs::remove(path + ".sum");

  struct Result {
    int64_t errors = 0, wrong = 0, first_wrong = -1, leaked_at = -1;
  } result;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    // One "no checksum file" line per load: not wanted thousands of times in the test log.
    int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, 2);
    Result r;
    for (int64_t pos = 0; pos < size && r.leaked_at < 0; ++pos) {
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      char c = 0;
      io.seekg(pos);
      io.read(&c, 1);
      io.seekp(pos);
      io.put(static_cast<char>(c ^ 0x04));
      io.flush();
      try {
        if (!bitwise_equal(d, load_checkpoint(path))) {
          ++r.wrong;
          if (r.first_wrong < 0) r.first_wrong = pos;
        }
      } catch (const Error&) {
        ++r.errors;
      }
      if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) r.leaked_at = pos;
      io.seekp(pos);
      io.put(c);
    }
    ssize_t n = ::write(fds[1], &r, sizeof r);
    ::_exit(n == static_cast<ssize_t>(sizeof r) ? 0 : 1);
  }
  ::close(fds[1]);
  ssize_t n = ::read(fds[0], &result, sizeof result);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "fuzz child failed, status " << status;
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof result));
  std::cout << "  " << result.errors << " of " << size << " single-byte flips detected, the rest hit dead space\n";
  EXPECT_EQ(result.wrong, 0) << "first undetected change at byte " << result.first_wrong;
  EXPECT_EQ(result.leaked_at, -1) << "HDF5 handles left open after flipping byte " << result.leaked_at;
  EXPECT_GT(result.errors, size / 2);
  expect_equal(d, load_checkpoint(path));
}

// A save killed before its rename leaves its temporary behind; a resumed run that reaches the same
// step saves it again. The new save must not take anything from the old temporary, whole or cut
// short (the in-memory file is built under the temporary's name, where an HDF5 driver could read
// an existing file in).
TEST(Checkpoint, SaveIgnoresAStaleTemporaryOfTheSameStep) {
  for (const bool whole : {true, false}) {
    TempDir dir;
    const int64_t big = 1 << 18;
    const std::string old_path = save_checkpoint(dir.str(), 5, make_data(1005, big), 0);
    const fs::path stale = dir.path / ".ckpt-5.h5.tmp";
    fs::rename(old_path, stale);
    fs::remove(old_path + ".sum");
    if (!whole) fs::resize_file(stale, fs::file_size(stale) * 2 / 3);
    const std::string path = save_checkpoint(dir.str(), 5, make_data(5, big), 0);
    EXPECT_FALSE(fs::exists(stale)) << (whole ? "whole" : "cut") << " temporary left behind";
    expect_equal(make_data(5, big), load_checkpoint(path));
  }
}

// SIGKILL a child that saves in a loop at random moments; `latest` must always resolve to a
// complete checkpoint without any fallback (a crash is not allowed to leave a dangling pointer).
TEST(Checkpoint, SurvivesKillDuringSave) {
  TempDir dir;
  const int64_t big = 1 << 20;  // 4 MB per array, 8 MB per checkpoint
  save_checkpoint(dir.str(), 0, make_data(0, 4), 2);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> delay_ms(5, 250);
  int kills_with_tmp = 0;
  int64_t last_step = 0;
  for (int iter = 0; iter < 10; ++iter) {
    auto all = list_checkpoints(dir.str());
    int64_t start = std::stoll(fs::path(all.back()).stem().string().substr(5)) + 1;
    std::fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        for (int64_t s = start; s < start + 1000; ++s) save_checkpoint(dir.str(), s, make_data(s, big), 2);
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    // The kill lands at a random moment after the child's first save of this round, so every
    // round tests a crash during a save even on a machine loaded enough to slow saves down.
    for (int waited = 0; waited < 60000 && list_checkpoints(dir.str()).size() > 0 &&
                         std::stoll(fs::path(list_checkpoints(dir.str()).back()).stem().string().substr(5)) < start;
         waited += 5)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited on its own with status " << status;
    for (const auto& e : fs::directory_iterator(dir.path))
      if (e.path().extension() == ".tmp") ++kills_with_tmp;

    testing::internal::CaptureStderr();
    auto [path, data] = resolve_and_load(dir.str(), "latest");
    std::string log = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(log.empty()) << log;
    int64_t step = data.ints.at("step");
    EXPECT_EQ(fs::path(path).filename(), "ckpt-" + std::to_string(step) + ".h5");
    EXPECT_GE(step, last_step);
    last_step = step;
    const auto& w = data.arrays.at(0).data;
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_EQ(w[i], value_at(step, i)) << path << " element " << i;
  }
  std::cout << "  kills that left a temp file: " << kills_with_tmp << " of 10, last step " << last_step << "\n";
  EXPECT_GT(last_step, 0);
}

// The file must be readable with plain h5py (no tilegrad code).
TEST(Checkpoint, ReadableWithH5py) {
  if (std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no h5py";
  TempDir dir;
  std::string path = save_checkpoint(dir.str(), 7, make_data(7), 0);
  fs::path script = dir.path / "check.py";
  std::ofstream(script) << R"(import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
assert f.attrs["format"] == b"tilegrad-checkpoint", f.attrs["format"]
assert f.attrs["version"] == 1 and f.attrs["step"] == 7
w = f["params/transformer.wte.weight"]
assert w.dtype == np.float32 and w.shape == (250, 4) and w.fletcher32
assert abs(float(w[0, 1]) - 7.001) < 1e-6
assert f["misc/scalar"][()] == np.float32(3.25) and f["misc/empty"].shape == (0, 5)
assert f["state"].attrs["tokens_seen"] == 7 * 4096
assert list(f["state/u64/rng/rank0"][:]) == [0xdeadbeefcafef00d, 1, 2, 3]
yaml = f["state/strings/config_yaml"][0].decode("utf-8")
assert yaml.startswith("key_0: value") and "ünïcødé" in yaml, yaml[:40]
print("ok")
)";
  std::string cmd = "/usr/bin/python3 " + script.string() + " " + path + " > " + (dir.path / "out.txt").string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << read_text(dir.path / "out.txt");
  EXPECT_EQ(read_text(dir.path / "out.txt"), "ok\n");
}
