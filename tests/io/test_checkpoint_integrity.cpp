// Whole-file checksums (verify before HDF5 parses anything), fallback from corrupt metadata,
// and checkpoint writes on a full disk.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "src/io/checkpoint.h"
#include "src/util/crc32c.h"
#include "src/util/error.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

struct Dir {
  fs::path path;
  explicit Dir(const std::string& tag) {
    static int counter = 0;
    path = fs::temp_directory_path() / ("tg_integrity_" + tag + "_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

CheckpointData data_for(int64_t step, int64_t n = 4000) {
  CheckpointData d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(step) + float(i % 100) * 0.01f;
  d.arrays.push_back({"params/w", {n / 4, 4}, v});
  d.arrays.push_back({"params/b", {4}, {1, 2, 3, 4}});
  d.ints = {{"step", step}};
  d.u64_arrays = {{"loader_cursor", {1, uint64_t(step)}}};
  d.strings = {{"config_yaml", "model:\n  n_layer: 1\n"}};
  return d;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void flip_bit(const std::string& path, int64_t offset, int bit) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(offset);
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  io.seekp(offset);
  io.write(&c, 1);
  ASSERT_TRUE(io.good());
}

}  // namespace

TEST(Crc32c, KnownValuesAndIncremental) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c_update(0, s.data(), s.size()), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c_update(0, "", 0), 0u);
  std::string big(100003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char((i * 2654435761u) >> 13);
  const uint32_t whole = crc32c_update(0, big.data(), big.size());
  for (size_t cut : {size_t(1), size_t(7), size_t(4096), size_t(99999)})
    EXPECT_EQ(crc32c_update(crc32c_update(0, big.data(), cut), big.data() + cut, big.size() - cut), whole) << cut;
  big[50000] ^= 1;
  EXPECT_NE(crc32c_update(0, big.data(), big.size()), whole);
}

TEST(Checkpoint, SidecarRecordsTheFilesChecksumAndIsPrunedWithIt) {
  Dir dir("sidecar");
  const std::string p1 = save_checkpoint(dir.str(), 1, data_for(1), 2);
  const std::string bytes = read_all(p1);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc32c_update(0, bytes.data(), bytes.size()));
  EXPECT_EQ(read_all(p1 + ".sum"),
            "crc32c " + std::string(hex) + " " + std::to_string(bytes.size()) + " ckpt-1.h5\n");
  save_checkpoint(dir.str(), 2, data_for(2), 2);
  save_checkpoint(dir.str(), 3, data_for(3), 2);
  EXPECT_FALSE(fs::exists(p1));
  EXPECT_FALSE(fs::exists(p1 + ".sum"));
  EXPECT_TRUE(fs::exists(dir.path / "ckpt-3.h5.sum"));
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // A checksum left without its file (a save killed between its renames) is removed by the next save.
  std::ofstream(dir.path / "ckpt-9.h5.sum") << "crc32c 00000000 1 ckpt-9.h5\n";
  save_checkpoint(dir.str(), 4, data_for(4), 2);
  EXPECT_FALSE(fs::exists(dir.path / "ckpt-9.h5.sum"));
}

// The corrupted-metadata fixture: bits flipped in the superblock (the root group's address) and
// in an object header of a real checkpoint. HDF5 could crash parsing such a file; the whole-file
// checksum rejects it first, and `latest` falls back to the previous complete checkpoint.
TEST(Checkpoint, CorruptMetadataIsRejectedBeforeHdf5AndLatestFallsBack) {
  Dir dir("metadata");
  save_checkpoint(dir.str(), 1, data_for(1), 0);
  save_checkpoint(dir.str(), 2, data_for(2), 0);
  const std::string newest = save_checkpoint(dir.str(), 3, data_for(3), 0);
  const std::string bytes = read_all(newest);
  ASSERT_EQ(bytes.substr(1, 3), "HDF");
  flip_bit(newest, 40, 3);  // superblock v2/v3: the root group object header address is bytes 36..43
  const size_t ohdr = bytes.find("OHDR");
  ASSERT_NE(ohdr, std::string::npos);
  flip_bit(newest, int64_t(ohdr) + 12, 5);  // inside the first object header's messages

  const std::string err = error_of([&] { load_checkpoint(newest); });
  std::cout << "  " << err << "\n";
  EXPECT_NE(err.find("whole-file checksum mismatch"), std::string::npos) << err;
  EXPECT_NE(err.find("not opening it"), std::string::npos) << err;
  EXPECT_EQ(err.find("HDF5"), std::string::npos) << "HDF5 must not have parsed the file: " << err;

  testing::internal::CaptureStderr();
  auto [path, data] = resolve_and_load(dir.str(), "latest");
  const std::string log = testing::internal::GetCapturedStderr();
  std::cout << log;
  EXPECT_EQ(path, (dir.path / "ckpt-2.h5").string());
  EXPECT_EQ(data.ints.at("step"), 2);
  EXPECT_NE(log.find("whole-file checksum mismatch"), std::string::npos) << log;
  EXPECT_NE(log.find("falling back"), std::string::npos) << log;
}

TEST(Checkpoint, WholeFileChecksumCatchesEveryFlip) {
  Dir dir("everyflip");
  const std::string path = save_checkpoint(dir.str(), 5, data_for(5, 64), 0);
  const int64_t size = int64_t(fs::file_size(path));
  int64_t caught = 0;
  for (int64_t pos = 0; pos < size; pos += 7) {
    flip_bit(path, pos, int(pos % 8));
    if (error_of([&] { load_checkpoint(path); }).find("whole-file checksum mismatch") != std::string::npos) ++caught;
    flip_bit(path, pos, int(pos % 8));
  }
  EXPECT_EQ(caught, (size + 6) / 7);
  EXPECT_EQ(load_checkpoint(path).ints.at("step"), 5);
}

TEST(Checkpoint, TruncatedOrMalformedSidecarOrMissingOne) {
  Dir dir("sidecar_cases");
  const std::string path = save_checkpoint(dir.str(), 1, data_for(1), 0);
  const std::string sum = read_all(path + ".sum");
  fs::resize_file(path, fs::file_size(path) - 1);
  std::string err = error_of([&] { load_checkpoint(path); });
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  const std::string p2 = save_checkpoint(dir.str(), 2, data_for(2), 0);
  std::ofstream(p2 + ".sum") << "garbage\n";
  err = error_of([&] { load_checkpoint(p2); });
  EXPECT_NE(err.find("malformed"), std::string::npos) << err;

  // Older checkpoints without a sidecar load, and the log says they were not verified.
  fs::remove(p2 + ".sum");
  testing::internal::CaptureStderr();
  EXPECT_EQ(load_checkpoint(p2).ints.at("step"), 2);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("has no checksum file"), std::string::npos) << log;
}

// A full disk: a tmpfs of 200 KiB mounted for the test (needs root; skipped otherwise). The
// first checkpoint fits, the second does not: the save fails with a message, `latest` and the
// first checkpoint are intact, and no temporary file is left.
TEST(Checkpoint, FullDiskKeepsLatestAndLeavesNoTempFiles) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  Dir dir("fulldisk");
  if (::mount("tmpfs", dir.str().c_str(), "tmpfs", 0, "size=200k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{dir.str()};
  const std::string first = save_checkpoint(dir.str(), 1, data_for(1, 20000), 0);  // ~80 KB
  std::string err = error_of([&] { save_checkpoint(dir.str(), 2, data_for(2, 40000), 0); });  // ~160 KB
  std::cout << "  " << err << "\n";
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find("disk is full"), std::string::npos) << err;
  EXPECT_EQ(read_all(dir.path / "latest"), "ckpt-1.h5\n");
  for (const auto& e : fs::directory_iterator(dir.path)) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "latest" || n == "ckpt-1.h5" || n == "ckpt-1.h5.sum") << "left behind: " << n;
  }
  auto [path, data] = resolve_and_load(dir.str(), "latest");
  EXPECT_EQ(path, first);
  EXPECT_EQ(data.ints.at("step"), 1);
}
