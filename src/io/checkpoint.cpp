// HDF5 checkpoints: atomic save (temp file, fsync, rename), Fletcher32-verified load, and
// resolution of the `latest` pointer with fallback to the newest checkpoint that loads.
#include "src/io/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "src/util/crc32c.h"
#include "src/util/error.h"
#include "src/util/files.h"

namespace fs = std::filesystem;

namespace tg {
namespace {

constexpr const char* kFormat = "tilegrad-checkpoint";
constexpr int kVersion = 1;
// ~4 MB chunks: large enough that chunk indexing is negligible, small enough that a reader
// does not need the whole array twice in memory and a corrupt chunk is localized.
constexpr int64_t kChunkElems = int64_t{1} << 20;
constexpr const char* kU64Group = "state/u64/";
constexpr const char* kStrGroup = "state/strings/";

// libhdf5 is usually built without thread safety; serialize every use from this file.
std::recursive_mutex& h5_mutex() {
  static std::recursive_mutex m;
  return m;
}

// Called at every entry point: HDF5's default handler prints a stack trace to stderr for every
// failure, including ones we expect and report ourselves (probing a corrupt file).
void quiet_hdf5() {
  H5open();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

herr_t collect_error(unsigned, const H5E_error2_t* e, void* client) {
  auto* msgs = static_cast<std::vector<std::string>*>(client);
  if (e->desc && *e->desc) msgs->push_back(e->desc);
  return 0;
}

// The innermost HDF5 messages are the specific ones ("data error detected by Fletcher32
// checksum", "truncated file: eof = ..."); the outer ones just repeat "can't read data".
std::string hdf5_reason() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &msgs);
  if (msgs.empty()) return "no HDF5 error message";
  std::string out = msgs[0];
  if (msgs.size() > 1) out += "; " + msgs[1];
  return out;
}

[[noreturn]] void h5_fail(const char* call, const char* file, int line, const std::string& what) {
  std::string reason = hdf5_reason();
  throw Error(detail::concat(what, ": HDF5 call ", call, " failed at ", file, ":", line, " (", reason, ")"));
}

}  // namespace
}  // namespace tg

// Runs an HDF5 call; a negative result throws tg::Error naming the call, source file and line,
// the checkpoint context `what` (evaluated only on failure) and HDF5's own reason. The call text
// is stringized by the outer macros so HDF5's own macros (H5F_ACC_RDONLY, ...) stay unexpanded.
#define TG_H5_CALL(call, text, what)                                 \
  ([&]() {                                                           \
    auto r_ = (call);                                                \
    if (r_ < 0) ::tg::h5_fail(text, __FILE__, __LINE__, (what));     \
    return r_;                                                       \
  }())
#define TG_H5(call, what) TG_H5_CALL(call, #call, what)
// Like TG_H5 for calls returning an identifier; wraps it so it is closed on every path.
#define TG_H5_OWN(call, closer, what) ::tg::H5Handle(TG_H5_CALL(call, #call, what), closer)

namespace tg {
namespace {

// Owns one hid_t; closing in the destructor keeps error paths leak-free (an open dataset would
// otherwise keep the file open and make H5Fclose fail with H5F_CLOSE_SEMI).
class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  ~H5Handle() { reset(); }
  hid_t get() const { return id_; }
  // Explicit close whose result the caller checks (H5Fclose is where the final writes happen).
  herr_t close() {
    herr_t r = 0;
    if (id_ >= 0) r = closer_(id_);
    id_ = H5I_INVALID_HID;
    return r;
  }

 private:
  void reset() {
    if (id_ >= 0) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*closer_)(hid_t) = nullptr;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// ---------------------------------------------------------------------------------------------
// Writing

// Names become HDF5 link paths; reject what HDF5 would misinterpret or what would collide with
// the reserved "state/" group, so the user gets a message about the name rather than an HDF5 one.
void check_object_name(const std::string& name, const std::string& kind) {
  TG_CHECK(!name.empty(), "checkpoint: ", kind, " with an empty name");
  TG_CHECK(name.front() != '/' && name.back() != '/' && name.find("//") == std::string::npos,
           "checkpoint: ", kind, " name '", name, "' must not start or end with '/' or contain '//'");
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    TG_CHECK(name.substr(start, end - start) != ".", "checkpoint: ", kind, " name '", name,
             "' has a '.' path component");
    start = end + 1;
  }
}

void validate(int64_t step, const CheckpointData& d) {
  TG_CHECK(step >= 0, "save_checkpoint: step must be >= 0, got ", step);
  std::set<std::string> paths;
  auto add_path = [&](const std::string& p) {
    TG_CHECK(paths.insert(p).second, "save_checkpoint: two entries are both stored at '", p, "'");
  };
  for (const auto& a : d.arrays) {
    check_object_name(a.name, "array");
    TG_CHECK(a.name != "state" && a.name.rfind("state/", 0) != 0, "save_checkpoint: array name '", a.name,
             "' is inside the reserved group 'state/'; pick another prefix (e.g. 'params/' or 'optim/')");
    for (int64_t dim : a.shape)
      TG_CHECK(dim >= 0, "save_checkpoint: array '", a.name, "' has a negative dimension in shape ",
               shape_str(a.shape));
    TG_CHECK(numel_of(a.shape) == static_cast<int64_t>(a.data.size()), "save_checkpoint: array '", a.name,
             "' has shape ", shape_str(a.shape), " (", numel_of(a.shape), " elements) but ", a.data.size(),
             " values");
    add_path(a.name);
  }
  for (const auto& [k, v] : d.u64_arrays) {
    check_object_name(k, "u64 array");
    add_path(kU64Group + k);
  }
  for (const auto& [k, v] : d.strings) {
    check_object_name(k, "string");
    add_path(kStrGroup + k);
  }
  for (const auto& [k, v] : d.ints)
    TG_CHECK(!k.empty() && k.find('/') == std::string::npos, "save_checkpoint: int key '", k,
             "' must be non-empty and contain no '/'");
  // A path that is also a group prefix of another ("a" and "a/b") cannot exist in HDF5.
  for (const auto& p : paths) {
    auto it = paths.lower_bound(p + "/");
    TG_CHECK(it == paths.end() || it->rfind(p + "/", 0) != 0, "save_checkpoint: '", p,
             "' is both a dataset and a group (also have '", (it == paths.end() ? "" : *it), "')");
  }
}

void write_string_attr(hid_t obj, const char* name, const std::string& value, const std::string& ctx) {
  H5Handle type = TG_H5_OWN(H5Tcopy(H5T_C_S1), H5Tclose, ctx);
  TG_H5(H5Tset_size(type.get(), std::max<size_t>(1, value.size())), ctx);
  TG_H5(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), ctx);
  TG_H5(H5Tset_cset(type.get(), H5T_CSET_UTF8), ctx);
  H5Handle space = TG_H5_OWN(H5Screate(H5S_SCALAR), H5Sclose, ctx);
  std::string what = ctx + ": attribute '" + name + "'";
  H5Handle attr = TG_H5_OWN(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, what);
  std::string buf = value.empty() ? std::string(1, '\0') : value;
  TG_H5(H5Awrite(attr.get(), type.get(), buf.data()), what);
}

void write_int_attr(hid_t obj, const std::string& name, int64_t value, const std::string& ctx) {
  std::string what = ctx + ": attribute '" + name + "'";
  H5Handle space = TG_H5_OWN(H5Screate(H5S_SCALAR), H5Sclose, what);
  H5Handle attr = TG_H5_OWN(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                        H5Aclose, what);
  TG_H5(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), what);
}

// Non-empty arrays are chunked along dim 0 with Fletcher32 so every byte of data is covered by
// a checksum. Scalars and empty arrays cannot be chunked; they go in the (checksummed, with the
// v1.8+ object header format) object header as compact datasets.
void write_dataset(hid_t file, hid_t lcpl, const std::string& name, hid_t file_type, hid_t mem_type,
                   const std::vector<int64_t>& shape, const void* buf, const std::string& ctx, int64_t index) {
  std::string what = ctx + ": dataset '" + name + "'";
  int64_t numel = numel_of(shape);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Handle space = shape.empty()
                       ? TG_H5_OWN(H5Screate(H5S_SCALAR), H5Sclose, what)
                       : TG_H5_OWN(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose, what);
  H5Handle dcpl = TG_H5_OWN(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, what);
  if (shape.empty() || numel == 0) {
    TG_H5(H5Pset_layout(dcpl.get(), H5D_COMPACT), what);
  } else {
    std::vector<hsize_t> chunk = dims;
    int64_t row = numel / shape[0];
    chunk[0] = static_cast<hsize_t>(std::clamp<int64_t>(kChunkElems / row, 1, shape[0]));
    TG_H5(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), what);
    TG_H5(H5Pset_fletcher32(dcpl.get()), what);
  }
  H5Handle ds = TG_H5_OWN(H5Dcreate2(file, name.c_str(), file_type, space.get(), lcpl, dcpl.get(), H5P_DEFAULT),
                      H5Dclose, what);
  if (numel > 0) TG_H5(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), what);
  // Lets load return arrays in the order they were given (HDF5 iterates by name).
  if (index >= 0) write_int_attr(ds.get(), "index", index, what);
}

void write_string_dataset(hid_t file, hid_t lcpl, const std::string& name, const std::string& value,
                          const std::string& ctx) {
  std::string what = ctx + ": dataset '" + name + "'";
  // One fixed-length UTF-8 string in a 1-element chunked dataset: chunking is what allows the
  // Fletcher32 filter (a scalar dataspace cannot be chunked); h5py reads ds[0] as bytes.
  H5Handle type = TG_H5_OWN(H5Tcopy(H5T_C_S1), H5Tclose, what);
  TG_H5(H5Tset_size(type.get(), std::max<size_t>(1, value.size())), what);
  TG_H5(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), what);
  TG_H5(H5Tset_cset(type.get(), H5T_CSET_UTF8), what);
  hsize_t one = 1;
  H5Handle space = TG_H5_OWN(H5Screate_simple(1, &one, nullptr), H5Sclose, what);
  H5Handle dcpl = TG_H5_OWN(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, what);
  TG_H5(H5Pset_chunk(dcpl.get(), 1, &one), what);
  TG_H5(H5Pset_fletcher32(dcpl.get()), what);
  H5Handle ds = TG_H5_OWN(H5Dcreate2(file, name.c_str(), type.get(), space.get(), lcpl, dcpl.get(), H5P_DEFAULT),
                      H5Dclose, what);
  std::string buf = value.empty() ? std::string(1, '\0') : value;
  TG_H5(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), what);
}

// The core driver's buffer, taken over when HDF5 closes the file instead of being freed: the
// bytes are then final (HDF5 finishes the superblock at close), and no copy is made. The last
// file closed is the one built: a file of the same name that the driver opened first (it reads an
// existing file in, backing store or not) is closed before it, and its buffer is not the image.
struct CapturedImage {
  void* buf = nullptr;       // the buffer of the last file HDF5 closed
  size_t buf_capacity = 0;   // that buffer's size
  size_t capacity = 0;       // the size of the driver's latest allocation
  ~CapturedImage() { std::free(buf); }
};

// HDF5 reads back regions of the image it has not written yet (and merges partial metadata
// writes with them), as from a new file: the memory must start zeroed, like a file's holes.
// (malloc may hand back a previous buffer's bytes, which once made HDF5 write an image whose
// metadata checksums did not match.)
void* image_malloc(size_t size, H5FD_file_image_op_t, void* udata) {
  void* p = std::calloc(1, size);
  if (p && udata) static_cast<CapturedImage*>(udata)->capacity = size;
  return p;
}
void* image_memcpy(void* dst, const void* src, size_t size, H5FD_file_image_op_t, void*) {
  return std::memcpy(dst, src, size);
}
void* image_realloc(void* ptr, size_t size, H5FD_file_image_op_t, void* udata) {
  auto* cap = static_cast<CapturedImage*>(udata);
  const size_t old = ptr && cap ? cap->capacity : 0;
  void* p = std::realloc(ptr, size);
  if (p && size > old) std::memset(static_cast<char*>(p) + old, 0, size - old);  // the grown part, zeroed
  if (p && cap) cap->capacity = size;
  return p;
}
herr_t image_free(void* ptr, H5FD_file_image_op_t op, void* udata) {
  auto* cap = static_cast<CapturedImage*>(udata);
  if (op == H5FD_FILE_IMAGE_OP_FILE_CLOSE && cap) {
    std::free(cap->buf);
    cap->buf = ptr;
    cap->buf_capacity = cap->capacity;
    return 0;
  }
  std::free(ptr);
  return 0;
}
void* udata_copy(void* udata) { return udata; }
herr_t udata_free(void*) { return 0; }

// Builds the whole file in memory (HDF5's core driver, no backing store) and returns its bytes.
// HDF5 itself then never writes to disk: a full disk or an I/O error surfaces in write_bytes as
// one checked write(2), and no half-written file is ever left open inside the library (whose
// clean-up at exit would touch it again).
struct FileImage {
  CapturedImage owner;
  size_t size = 0;
  const unsigned char* data() const { return static_cast<const unsigned char*>(owner.buf); }
};

void build_image(const std::string& path, int64_t step, const CheckpointData& d, FileImage& image) {
  std::string ctx = "checkpoint " + path;
  CapturedImage& captured = image.owner;
  {
    H5Handle fapl = TG_H5_OWN(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, ctx);
    // The 1.10 format checksums all metadata: superblock, object headers (so attributes and
    // compact datasets) and the chunk index. The 1.8 format still indexes chunks with v1 B-trees,
    // which have no checksum: a flipped bit there made HDF5 return fill values (zeros) silently.
    // Readers need HDF5 >= 1.10 (any current h5py).
    TG_H5(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), ctx);
    // SEMI: H5Fclose fails (instead of silently deferring the final write) if anything is still open.
    TG_H5(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_SEMI), ctx);
    TG_H5(H5Pset_fapl_core(fapl.get(), size_t{16} << 20, 0), ctx);
    H5FD_file_image_callbacks_t cb = {image_malloc, image_memcpy, image_realloc, image_free,
                                      udata_copy,   udata_free,   &captured};
    TG_H5(H5Pset_file_image_callbacks(fapl.get(), &cb), ctx);
    H5Handle file = TG_H5_OWN(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose, ctx);
    {
      write_string_attr(file.get(), "format", d.format, ctx);
      write_int_attr(file.get(), "version", d.version, ctx);
      write_int_attr(file.get(), "step", step, ctx);

      H5Handle lcpl = TG_H5_OWN(H5Pcreate(H5P_LINK_CREATE), H5Pclose, ctx);
      TG_H5(H5Pset_create_intermediate_group(lcpl.get(), 1), ctx);
      H5Handle state = TG_H5_OWN(H5Gcreate2(file.get(), "state", lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                                 ctx + ": group 'state'");
      for (const auto& [k, v] : d.ints) write_int_attr(state.get(), k, v, ctx + ": group 'state'");

      for (size_t i = 0; i < d.arrays.size(); ++i) {
        const auto& a = d.arrays[i];
        write_dataset(file.get(), lcpl.get(), a.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, a.shape, a.data.data(), ctx,
                      static_cast<int64_t>(i));
      }
      for (const auto& [k, v] : d.u64_arrays)
        write_dataset(file.get(), lcpl.get(), kU64Group + k, H5T_STD_U64LE, H5T_NATIVE_UINT64,
                      {static_cast<int64_t>(v.size())}, v.data(), ctx, -1);
      for (const auto& [k, v] : d.strings) write_string_dataset(file.get(), lcpl.get(), kStrGroup + k, v, ctx);
    }
    TG_H5(file.close(), ctx);
  }
  // The file's length is the end-of-file address in the (version 3) superblock: bytes 28..35
  // after the signature, version, size fields, flags, base and extension addresses.
  const auto* b = static_cast<const unsigned char*>(captured.buf);
  TG_CHECK(b, ctx, ": HDF5 returned no file image");
  uint64_t eof = 0;
  for (int i = 7; i >= 0; --i) eof = (eof << 8) | b[28 + i];
  TG_CHECK(std::memcmp(b, "\x89HDF\r\n\x1a\n", 8) == 0 && b[8] == 3 && eof >= 48 && eof <= captured.buf_capacity, ctx,
           ": unexpected superblock in HDF5's file image");
  image.size = static_cast<size_t>(eof);
}

// Writes `size` bytes to a new file `path` (replacing it) and fsyncs it; every write, the fsync
// and the close are checked, so a full disk is reported here, naming the file.
void write_bytes(const std::string& path, const void* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TG_CHECK(fd >= 0, "checkpoint: cannot create ", path, ": ", std::strerror(errno));
  const auto* p = static_cast<const unsigned char*>(data);
  size_t done = 0;
  int err = 0;
  while (done < size) {
    ssize_t n = ::write(fd, p + done, std::min<size_t>(size - done, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  TG_CHECK(err == 0, "checkpoint: writing ", path, " failed after ", done, " of ", size, " bytes: ",
           std::strerror(err),
           err == ENOSPC || err == EDQUOT
               ? " (the disk is full: free space, or lower run.keep_last so fewer checkpoints are kept)"
               : "");
}

std::string sum_line(uint32_t crc, size_t size, const std::string& name) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return "crc32c " + std::string(buf) + " " + std::to_string(size) + " " + name + "\n";
}

// Reads `path` once, computing its CRC-32C, and compares it (and the size) with the sidecar
// `path.sum`, before HDF5 sees a byte: a corrupt file is rejected here, never parsed. Files
// without a sidecar (written before checksums existed) load with HDF5's own checks; one line
// on stderr says so.
void verify_whole_file(const std::string& path, const std::string& ctx) {
  const std::string sum_path = path + ".sum";
  std::error_code ec;
  if (!fs::exists(sum_path, ec)) {
    // Without a sidecar, at least the file must be HDF5 (tilegrad writes no user block, so the
    // signature is at offset 0): any other file is named as such, not as an old checkpoint.
    static const char kHdf5Signature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
    char head[8] = {};
    std::ifstream in(path, std::ios::binary);
    in.read(head, sizeof head);
    TG_CHECK(in.gcount() == 8 && std::equal(head, head + 8, kHdf5Signature), ctx,
             ": not an HDF5 file (no HDF5 signature at its start), so not a tilegrad checkpoint");
    std::cerr << "[checkpoint] " << path << " has no checksum file " << fs::path(sum_path).filename().string()
              << " (copied without it, or written by an older tilegrad): loading it without the whole-file check\n";
    return;
  }
  // A sidecar is one short line: a device or pipe there is read no further than that.
  std::istringstream sin(read_regular_file(sum_path, ctx + ": its checksum file", 4096));
  std::string kind, hex, size_text;
  sin >> kind >> hex >> size_text;
  uint32_t want = 0;
  uint64_t want_size = 0;
  bool ok = kind == "crc32c" && hex.size() == 8 && !size_text.empty() && size_text.size() <= 19 &&
            std::all_of(hex.begin(), hex.end(), [](unsigned char c) { return std::isxdigit(c); }) &&
            std::all_of(size_text.begin(), size_text.end(), [](unsigned char c) { return std::isdigit(c); });
  if (ok) {
    want = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
    want_size = std::stoull(size_text);
  }
  TG_CHECK(ok, ctx, ": its checksum file ", sum_path, " is malformed (expected 'crc32c <8 hex digits> <bytes> <name>'); "
           "not opening the checkpoint");
  const uint64_t have_size = fs::file_size(path, ec);
  TG_CHECK(!ec, ctx, ": cannot stat: ", ec.message());
  TG_CHECK(have_size == want_size, ctx, ": the file is ", have_size, " bytes but ", sum_path, " records ", want_size,
           " (truncated or overwritten); not opening it");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TG_CHECK(fd >= 0, ctx, ": cannot open: ", std::strerror(errno));
  std::vector<unsigned char> buf(size_t{4} << 20);
  uint32_t crc = 0;
  uint64_t total = 0;
  int err = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    crc = crc32c_update(crc, buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  TG_CHECK(err == 0, ctx, ": reading it failed: ", std::strerror(err));
  char have_hex[16], want_hex[16];
  std::snprintf(have_hex, sizeof have_hex, "%08x", crc);
  std::snprintf(want_hex, sizeof want_hex, "%08x", want);
  TG_CHECK(total == want_size && crc == want, ctx, ": whole-file checksum mismatch (CRC-32C of the file is ", have_hex,
           ", ", fs::path(sum_path).filename().string(), " records ", want_hex,
           "): the file is corrupt; not opening it");
}

void fsync_path(const std::string& path, bool is_dir) {
  int fd = ::open(path.c_str(), is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  TG_CHECK(fd >= 0, "checkpoint: cannot open ", path, " to fsync it: ", std::strerror(errno));
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
  TG_CHECK(r == 0, "checkpoint: fsync(", path, ") failed: ", std::strerror(err));
}

// rename() is atomic within a directory; the directory fsync makes the new name durable.
void durable_rename(const std::string& from, const std::string& to, const std::string& dir) {
  fsync_path(from, false);
  TG_CHECK(::rename(from.c_str(), to.c_str()) == 0, "checkpoint: rename ", from, " -> ", to,
           " failed: ", std::strerror(errno));
  fsync_path(dir, true);
}

// A pointer's (`latest`, `best`) lines: the file name it holds first, trimmed (`best` holds its
// val loss on a second line). nullopt when there is no pointer; one empty line when it cannot be
// read as one (a device, a pipe, a large file): it names nothing, and the newest checkpoint that
// loads is taken instead of `latest`.
std::optional<std::vector<std::string>> read_pointer(const std::string& dir, const char* pointer) {
  const std::string path = (fs::path(dir) / pointer).string();
  if (!path_exists(path)) return std::nullopt;
  std::string text;
  try {
    text = read_regular_file(path, "checkpoint", 4096);
  } catch (const Error& e) {
    std::cerr << "[checkpoint] " << e.what() << "\n";
    return std::vector<std::string>{""};
  }
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (lines.empty()) lines.push_back("");
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  std::string& name = lines[0];
  name.erase(name.begin(), std::find_if(name.begin(), name.end(), not_space));
  name.erase(std::find_if(name.rbegin(), name.rend(), not_space).base(), name.end());
  return lines;
}

std::optional<std::string> read_pointer_name(const std::string& dir, const char* pointer) {
  auto lines = read_pointer(dir, pointer);
  if (!lines) return std::nullopt;
  return lines->front();
}

// Replaces `dir/pointer` with `text` atomically and durably (a temporary, fsync, rename, fsync
// of the directory), so it always names a complete file.
void write_pointer(const std::string& dir, const char* pointer, const std::string& text) {
  std::string tmp_name = ".";  // ".latest.tmp", ".best.tmp"
  tmp_name.append(pointer).append(".tmp");
  const std::string tmp = (fs::path(dir) / tmp_name).string();
  try {
    write_bytes(tmp, text.data(), text.size());
    durable_rename(tmp, (fs::path(dir) / pointer).string(), dir);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

// Parses "ckpt-<digits>.h5"; temporaries (".ckpt-*.h5.tmp") never match.
std::optional<int64_t> parse_step(const std::string& name) {
  const std::string pre = "ckpt-", suf = ".h5";
  if (name.size() <= pre.size() + suf.size() || name.rfind(pre, 0) != 0 ||
      name.compare(name.size() - suf.size(), suf.size(), suf) != 0)
    return std::nullopt;
  std::string digits = name.substr(pre.size(), name.size() - pre.size() - suf.size());
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  return std::stoll(digits);
}

void prune(const std::string& dir, int keep_last) {
  std::error_code ec;
  // Temporaries left by a save that was killed; ours has already been renamed away.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(".ckpt-", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) {
      std::error_code rm_ec;
      fs::remove(e.path(), rm_ec);
    }
    // A checksum whose checkpoint is gone (a save killed between its two renames).
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".sum") == 0 && parse_step(n.substr(0, n.size() - 4)) &&
        !fs::exists(e.path().parent_path() / n.substr(0, n.size() - 4), ec)) {
      std::error_code rm_ec;
      fs::remove(e.path(), rm_ec);
    }
  }
  if (keep_last <= 0) return;
  std::vector<std::string> all = list_checkpoints(dir);
  const std::string latest = read_pointer_name(dir, "latest").value_or("");
  const std::string best = read_pointer_name(dir, "best").value_or("");
  if (all.size() <= static_cast<size_t>(keep_last)) return;
  size_t n_delete = all.size() - static_cast<size_t>(keep_last);
  for (size_t i = 0; i < n_delete && i + 1 < all.size(); ++i) {
    if (fs::path(all[i]).filename() == latest || fs::path(all[i]).filename() == best) continue;
    std::error_code rm_ec;
    fs::remove(all[i], rm_ec);
    if (!rm_ec) fs::remove(all[i] + ".sum", rm_ec);
    // The checkpoint itself is saved; failing to reclaim space is worth a warning, not a failure.
    if (rm_ec) std::cerr << "[checkpoint] warning: could not delete old checkpoint " << all[i] << ": "
                         << rm_ec.message() << "\n";
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

std::string read_string_attr(hid_t obj, const char* name, const std::string& ctx) {
  std::string what = ctx + ": attribute '" + name + "'";
  H5Handle attr = TG_H5_OWN(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, what);
  H5Handle type = TG_H5_OWN(H5Aget_type(attr.get()), H5Tclose, what);
  TG_CHECK(H5Tget_class(type.get()) == H5T_STRING, what, " is not a string");
  if (TG_H5(H5Tis_variable_str(type.get()), what) > 0) {  // e.g. written by h5py with a Python str
    H5Handle mem = TG_H5_OWN(H5Tcopy(H5T_C_S1), H5Tclose, what);
    TG_H5(H5Tset_size(mem.get(), H5T_VARIABLE), what);
    char* p = nullptr;
    TG_H5(H5Aread(attr.get(), mem.get(), &p), what);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t size = H5Tget_size(type.get());
  std::string buf(size, '\0');
  TG_H5(H5Aread(attr.get(), type.get(), buf.data()), what);
  buf.erase(std::find(buf.begin(), buf.end(), '\0'), buf.end());
  return buf;
}

int64_t read_int_attr(hid_t obj, const std::string& name, const std::string& ctx) {
  std::string what = ctx + ": attribute '" + name + "'";
  H5Handle attr = TG_H5_OWN(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, what);
  H5Handle type = TG_H5_OWN(H5Aget_type(attr.get()), H5Tclose, what);
  TG_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, what, " is not an integer");
  int64_t v = 0;
  TG_H5(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), what);
  return v;
}

// Depth-first list of dataset paths (relative to the root, no leading '/'), by name.
// Uses only version-stable calls (H5Gget_info, H5Lget_name_by_idx, H5Oopen), so it compiles
// against HDF5 1.10 and 1.12+ alike.
void collect_datasets(hid_t group, const std::string& prefix, const std::string& ctx, std::vector<std::string>& out) {
  std::string what = ctx + ": group '" + (prefix.empty() ? "/" : prefix) + "'";
  H5G_info_t info;
  TG_H5(H5Gget_info(group, &info), what);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t len = TG_H5(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT), what);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    TG_H5(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT), what);
    name.resize(static_cast<size_t>(len));
    std::string path = prefix.empty() ? name : prefix + "/" + name;
    H5Handle obj = TG_H5_OWN(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose, ctx + ": object '" + path + "'");
    H5I_type_t t = H5Iget_type(obj.get());
    if (t == H5I_GROUP) collect_datasets(obj.get(), path, ctx, out);
    else if (t == H5I_DATASET) out.push_back(path);
  }
}

// Opens a dataset and checks that its bytes are covered by a checksum: chunked + Fletcher32,
// or compact (inside the checksummed object header), or empty.
struct OpenDataset {
  H5Handle ds;
  std::vector<int64_t> shape;  // {} for a scalar
  int64_t numel = 1;
};

OpenDataset open_dataset(hid_t file, const std::string& name, const std::string& what) {
  OpenDataset r;
  r.ds = TG_H5_OWN(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, what);
  H5Handle space = TG_H5_OWN(H5Dget_space(r.ds.get()), H5Sclose, what);
  int rank = TG_H5(H5Sget_simple_extent_ndims(space.get()), what);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) TG_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), what);
  for (hsize_t d : dims) r.shape.push_back(static_cast<int64_t>(d));
  r.numel = numel_of(r.shape);
  H5Handle dcpl = TG_H5_OWN(H5Dget_create_plist(r.ds.get()), H5Pclose, what);
  H5D_layout_t layout = H5Pget_layout(dcpl.get());
  bool checksummed = layout == H5D_COMPACT || r.numel == 0;
  int nfilters = TG_H5(H5Pget_nfilters(dcpl.get()), what);
  for (int i = 0; i < nfilters && !checksummed; ++i) {
    unsigned flags = 0, fcfg = 0;
    size_t nelem = 0;
    H5Z_filter_t f = TG_H5(H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelem, nullptr, 0,
                                            nullptr, &fcfg), what);
    checksummed = f == H5Z_FILTER_FLETCHER32;
  }
  TG_CHECK(checksummed, what, " has no Fletcher32 checksum filter; tilegrad only loads verified data "
           "(write it chunked with fletcher32=True, see docs/checkpoint.md)");
  // An unallocated chunk reads back as fill values without any error, and a damaged v1 B-tree
  // chunk index (files written in the 1.8 format, e.g. by h5py's defaults) has no checksum and
  // can make a written chunk look unallocated: insist that every chunk exists.
  // (H5Dget_space_status is not usable here: HDF5 1.10 reports single-chunk datasets as
  // partially allocated.)
  if (r.numel > 0 && layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(dims.size());
    TG_H5(H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), what);
    hsize_t expected = 1, stored = 0;
    for (size_t i = 0; i < dims.size(); ++i) expected *= (dims[i] + chunk[i] - 1) / chunk[i];
    TG_H5(H5Dget_num_chunks(r.ds.get(), space.get(), &stored), what);
    TG_CHECK(stored == expected, what, " has ", stored, " of its ", expected,
             " chunks (corrupt chunk index or incompletely written file)");
  }
  return r;
}

CheckpointData load_impl(const std::string& path) {
  const std::string ctx = "checkpoint " + path;
  std::error_code ec;
  TG_CHECK(fs::exists(path, ec), ctx, ": file does not exist");
  TG_CHECK(fs::is_regular_file(path, ec), ctx, ": not a regular file");
  verify_whole_file(path, ctx);
  H5Handle file = TG_H5_OWN(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                        ctx + ": cannot open as HDF5 (truncated, corrupted, or not an HDF5 file)");

  CheckpointData d;
  TG_CHECK(TG_H5(H5Aexists(file.get(), "format"), ctx) > 0, ctx,
           ": missing root attribute 'format' (not a tilegrad checkpoint)");
  d.format = read_string_attr(file.get(), "format", ctx);
  TG_CHECK(d.format == kFormat, ctx, ": root attribute 'format' is '", d.format, "', expected '", kFormat,
           "' (not a tilegrad checkpoint)");
  TG_CHECK(TG_H5(H5Aexists(file.get(), "version"), ctx) > 0, ctx, ": missing root attribute 'version'");
  int64_t version = read_int_attr(file.get(), "version", ctx);
  TG_CHECK(version == kVersion, ctx, ": root attribute 'version' is ", version, ", but this build of tilegrad reads ",
           "version ", kVersion, " only (convert the checkpoint or use a matching tilegrad)");
  d.version = static_cast<int>(version);

  // ints: attributes of /state (checksummed as part of its object header).
  if (TG_H5(H5Lexists(file.get(), "state", H5P_DEFAULT), ctx) > 0) {
    const std::string what = ctx + ": group 'state'";
    H5Handle state = TG_H5_OWN(H5Gopen2(file.get(), "state", H5P_DEFAULT), H5Gclose, what);
    std::vector<std::string> names;
    hsize_t idx = 0;
    auto collect = [](hid_t, const char* n, const H5A_info_t*, void* op) -> herr_t {
      static_cast<std::vector<std::string>*>(op)->push_back(n);
      return 0;
    };
    TG_H5(H5Aiterate2(state.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names), what);
    for (const auto& n : names) d.ints[n] = read_int_attr(state.get(), n, what);
  }

  std::vector<std::string> datasets;
  collect_datasets(file.get(), "", ctx, datasets);
  std::vector<std::pair<int64_t, CheckpointArray>> arrays;  // (index, array) to restore save order
  for (const auto& name : datasets) {
    const std::string what = ctx + ": dataset '" + name + "'";
    OpenDataset od = open_dataset(file.get(), name, what);
    H5Handle type = TG_H5_OWN(H5Dget_type(od.ds.get()), H5Tclose, what);
    H5T_class_t cls = H5Tget_class(type.get());
    const std::string read_what = what + " failed checksum verification or could not be read";
    if (name.rfind(kU64Group, 0) == 0) {
      TG_CHECK(cls == H5T_INTEGER && od.shape.size() == 1, what, " should be a 1-D uint64 array");
      std::vector<uint64_t> v(static_cast<size_t>(od.numel));
      if (od.numel > 0)
        TG_H5(H5Dread(od.ds.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), read_what);
      d.u64_arrays[name.substr(std::strlen(kU64Group))] = std::move(v);
    } else if (name.rfind(kStrGroup, 0) == 0) {
      TG_CHECK(cls == H5T_STRING && od.numel == 1 && H5Tis_variable_str(type.get()) == 0, what,
               " should hold one fixed-length string");
      std::string buf(H5Tget_size(type.get()), '\0');
      TG_H5(H5Dread(od.ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), read_what);
      // NULLPAD: the stored size is the string's length except for the empty string (one NUL).
      while (!buf.empty() && buf.back() == '\0') buf.pop_back();
      d.strings[name.substr(std::strlen(kStrGroup))] = std::move(buf);
    } else {
      TG_CHECK(cls == H5T_FLOAT, what, " is not a float dataset");
      CheckpointArray a{name, od.shape, std::vector<float>(static_cast<size_t>(od.numel))};
      if (od.numel > 0)
        TG_H5(H5Dread(od.ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data.data()), read_what);
      int64_t index = std::numeric_limits<int64_t>::max();  // arrays from other writers go last, by name
      if (TG_H5(H5Aexists(od.ds.get(), "index"), what) > 0) index = read_int_attr(od.ds.get(), "index", what);
      arrays.emplace_back(index, std::move(a));
    }
  }
  std::stable_sort(arrays.begin(), arrays.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (auto& [i, a] : arrays) d.arrays.push_back(std::move(a));
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API

std::string save_checkpoint(const std::string& dir, int64_t step, const CheckpointData& data, int keep_last) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  quiet_hdf5();
  validate(step, data);
  std::error_code ec;
  fs::create_directories(dir, ec);
  TG_CHECK(!ec && fs::is_directory(dir), "save_checkpoint: cannot create checkpoint directory ", dir, ": ",
           ec ? ec.message() : "not a directory");
  const std::string name = "ckpt-" + std::to_string(step) + ".h5";
  const fs::path d(dir);
  const std::string final_path = (d / name).string(), tmp_path = (d / ("." + name + ".tmp")).string();
  const std::string sum_path = final_path + ".sum", sum_tmp = (d / ("." + name + ".sum.tmp")).string();
  bool sum_renamed = false;
  try {
    size_t size = 0;
    uint32_t crc = 0;
    {
      // A temporary of this step left by a save that was killed: the image is built under its
      // name, and nothing of it may be read in.
      fs::remove(tmp_path, ec);
      FileImage image;
      build_image(tmp_path, step, data, image);
      size = image.size;
      crc = crc32c_update(0, image.data(), size);
      write_bytes(tmp_path, image.data(), size);
    }
    // The sidecar goes first: a crash between the renames leaves at worst a checksum without
    // its file (ignored), never a new file without its checksum.
    const std::string line = sum_line(crc, size, name);
    write_bytes(sum_tmp, line.data(), line.size());
    durable_rename(sum_tmp, sum_path, dir);
    sum_renamed = true;
    durable_rename(tmp_path, final_path, dir);
    // The pointer is written after the checkpoint is durable, so it never names a partial file.
    write_pointer(dir, "latest", name + "\n");
  } catch (...) {
    // Never leave a half-written file behind; `latest` and the complete checkpoints are untouched.
    fs::remove(tmp_path, ec);
    fs::remove(sum_tmp, ec);
    if (sum_renamed && !fs::exists(final_path, ec)) fs::remove(sum_path, ec);
    throw;
  }
  prune(dir, keep_last);
  return final_path;
}

void mark_best(const std::string& dir, int64_t step, double val_loss, int keep_last) {
  const std::string name = "ckpt-" + std::to_string(step) + ".h5";
  const fs::path d(dir);
  TG_CHECK(fs::is_regular_file(d / name), "mark_best: ", (d / name).string(), " does not exist");
  char loss[64];
  std::snprintf(loss, sizeof loss, "%.17g", val_loss);
  write_pointer(dir, "best", name + "\nval_loss " + loss + "\n");
  prune(dir, keep_last);  // the previous best is an ordinary checkpoint now
}

std::optional<std::pair<std::string, double>> read_best(const std::string& dir) {
  auto lines = read_pointer(dir, "best");
  if (!lines || lines->size() < 2 || !parse_step(lines->front()) || !fs::is_regular_file(fs::path(dir) / lines->front()) ||
      (*lines)[1].rfind("val_loss ", 0) != 0)
    return std::nullopt;
  const char* number = (*lines)[1].c_str() + 9;
  char* end = nullptr;
  const double loss = std::strtod(number, &end);
  if (end == number || !std::isfinite(loss)) return std::nullopt;
  return std::make_pair((fs::path(dir) / lines->front()).string(), loss);
}

CheckpointData load_checkpoint(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  quiet_hdf5();
  return load_impl(path);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    auto step = parse_step(n);
    if (step && e.is_regular_file(ec)) found.emplace_back(*step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(std::move(p));
  return out;
}

std::pair<std::string, CheckpointData> resolve_and_load(const std::string& dir_or_path, const std::string& which) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  quiet_hdf5();
  std::error_code ec;
  // A pointer given as the path (RUN/latest, RUN/best): what it names.
  const fs::path as_path(dir_or_path);
  if ((as_path.filename() == "latest" || as_path.filename() == "best") && fs::is_regular_file(as_path, ec) &&
      which == "latest")
    return resolve_and_load(as_path.parent_path().empty() ? "." : as_path.parent_path().string(),
                            as_path.filename().string());
  if (which == "best") {
    // The best checkpoint exactly, or an error: another file would not be the best.
    auto best = read_best(dir_or_path);
    TG_CHECK(best, "no best checkpoint in ", dir_or_path, ": its `best` file is missing or names no checkpoint "
             "there (a run with run.keep_best: true writes it at each evaluation that lowers the val loss)");
    return {best->first, load_impl(best->first)};
  }
  if (which != "latest") {
    // An explicit request is honored exactly: falling back to another file would be a surprise.
    fs::path p(which);
    if (p.is_relative() && !fs::exists(p, ec) && !dir_or_path.empty() && fs::exists(fs::path(dir_or_path) / p, ec))
      p = fs::path(dir_or_path) / p;
    if (fs::is_directory(p, ec)) return resolve_and_load(p.string(), "latest");
    return {p.string(), load_impl(p.string())};
  }
  if (fs::is_regular_file(dir_or_path, ec)) return {dir_or_path, load_impl(dir_or_path)};
  TG_CHECK(fs::is_directory(dir_or_path, ec), "no checkpoint at ", dir_or_path,
           ": it does not exist; give a run directory (a training run's run.out_dir, holding its "
           "ckpt-<step>.h5 files) or one ckpt-<step>.h5 file");

  const std::string latest_file = (fs::path(dir_or_path) / "latest").string();
  std::string tried;
  auto latest = read_pointer_name(dir_or_path, "latest");
  if (!latest) {
    std::cerr << "[checkpoint] " << latest_file << " is missing; falling back to the newest complete checkpoint\n";
  } else if (latest->empty() || latest->find('/') != std::string::npos || !parse_step(*latest)) {
    std::cerr << "[checkpoint] " << latest_file << " does not name a checkpoint file ('" << *latest
              << "'); falling back to the newest complete checkpoint\n";
  } else {
    tried = (fs::path(dir_or_path) / *latest).string();
    try {
      return {tried, load_impl(tried)};
    } catch (const Error& e) {
      std::cerr << "[checkpoint] " << latest_file << " names " << *latest << ", which failed to load: " << e.what()
                << "; falling back to the newest complete checkpoint\n";
    }
  }
  std::vector<std::string> all = list_checkpoints(dir_or_path);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (*it == tried) continue;
    try {
      CheckpointData d = load_impl(*it);
      std::cerr << "[checkpoint] resuming from " << *it << " (fallback)\n";
      return {*it, std::move(d)};
    } catch (const Error& e) {
      std::cerr << "[checkpoint] skipping " << *it << ": " << e.what() << "\n";
    }
  }
  throw Error(detail::concat("no loadable checkpoint in ", dir_or_path, " (looked at ", latest_file, " and ",
                             all.size(), " file(s) named ckpt-<step>.h5", all.empty() ? "" : ", none of which loaded",
                             "); a training run writes them into its run.out_dir every run.ckpt_every steps and "
                             "when it ends: give the directory of a run that has saved one"));
}

}  // namespace tg
