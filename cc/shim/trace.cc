// jaxlake shim: writing the allocation trace (see trace.h).
#include "cc/shim/trace.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <utility>

#include "cc/shim/json.h"

namespace jaxlake::shim {
namespace {

bool EndsWithGz(const std::string& path) {
  const std::size_t n = path.size();
  return n >= 3 && path[n - 3] == '.' &&
         std::tolower(static_cast<unsigned char>(path[n - 2])) == 'g' &&
         std::tolower(static_cast<unsigned char>(path[n - 1])) == 'z';
}

// zlib's gz* functions, by their public prototypes, from libz.so.1.
struct Zlib {
  using Open = void* (*)(const char*, const char*);
  using Write = int (*)(void*, const void*, unsigned);
  using Close = int (*)(void*);
  Open open = nullptr;
  Write write = nullptr;
  Close close = nullptr;
};

// Loads zlib once; false (and why) when it is not there.
bool LoadZlib(Zlib* z, std::string* why) {
  static Zlib loaded;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = ::dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = ::dlerror();
      error = std::string("cannot load zlib: ") + (e ? e : "libz.so.1");
      return;
    }
    loaded.open = reinterpret_cast<Zlib::Open>(::dlsym(h, "gzopen"));
    loaded.write = reinterpret_cast<Zlib::Write>(::dlsym(h, "gzwrite"));
    loaded.close = reinterpret_cast<Zlib::Close>(::dlsym(h, "gzclose"));
    if (!loaded.open || !loaded.write || !loaded.close) {
      loaded = Zlib{};
      error = "libz.so.1 lacks gzopen/gzwrite/gzclose";
    }
  });
  *z = loaded;
  *why = error;
  return loaded.open != nullptr;
}

// Compresses the file `from` into `to` (gzip); "" or what went wrong.
std::string Compress(const std::string& from, const std::string& to) {
  Zlib z;
  std::string why;
  if (!LoadZlib(&z, &why)) return why;
  std::FILE* in = std::fopen(from.c_str(), "rb");
  if (in == nullptr) return "cannot read " + from + ": " + std::strerror(errno);
  void* out = z.open(to.c_str(), "wb");
  if (out == nullptr) {
    std::fclose(in);
    return "cannot write " + to;
  }
  std::string problem;
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) {
    if (z.write(out, buf, static_cast<unsigned>(n)) != static_cast<int>(n)) {
      problem = "writing " + to + " failed";
      break;
    }
  }
  if (problem.empty() && std::ferror(in)) problem = "reading " + from + " failed";
  std::fclose(in);
  if (z.close(out) != 0 && problem.empty()) problem = "closing " + to + " failed";
  return problem;
}

}  // namespace

TraceWriter::~TraceWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  StopLocked();
}

int TraceWriter::Start(const std::string& path, const std::string& name,
                       std::function<int()> devices,
                       std::function<std::uint64_t()> outside_peak) {
  std::lock_guard<std::mutex> lock(mu_);
  StopLocked();
  const bool gzip = EndsWithGz(path);
  errno = 0;
  if (gzip) {
    // The .gz itself is written at the stop: made (empty) now, so that a
    // path that cannot be written is an error here, as a plain one is.
    std::FILE* target = std::fopen(path.c_str(), "w");
    if (target == nullptr) return errno != 0 ? -errno : -1;
    std::fclose(target);
  }
  std::FILE* f = std::fopen(gzip ? (path + ".part").c_str() : path.c_str(),
                            "w");
  if (f == nullptr) return errno != 0 ? -errno : -1;
  // A buffer large enough that the file is written only at the flushes
  // (every flush_every_ events, Flush, Stop): what a dead process leaves is
  // whole lines.
  std::setvbuf(f, nullptr, _IOFBF, std::size_t{1} << 20);
  file_ = f;
  path_ = path;
  gzip_path_ = gzip ? path : std::string();
  owner_pid_ = static_cast<long>(::getpid());
  name_ = name;
  devices_ = std::move(devices);
  outside_peak_ = std::move(outside_peak);
  outside_at_ = -1;
  header_written_ = false;
  start_ = std::chrono::steady_clock::now();
  last_t_ = 0;
  next_id_ = 0;
  events_ = 0;
  live_.clear();
  active_.store(true, std::memory_order_release);
  return 0;
}

// The width of the header's outside figure: null, or up to 20 digits.
constexpr int kFigureWidth = 20;

void TraceWriter::HeaderLocked() {
  if (header_written_) return;
  header_written_ = true;
  const int devices = devices_ ? devices_() : 0;
  const long start = std::ftell(file_);
  const int n = std::fprintf(
      file_,
      "{\"format\": \"jaxlake-trace\", \"version\": 1, \"name\": %s, "
      "\"devices\": %d, \"source\": \"shim\", \"meta\": {",
      JsonString(name_).c_str(), devices > 0 ? devices : 1);
  if (!outside_peak_) {
    std::fputs("}}\n", file_);
    return;
  }
  const int m = std::fputs("\"outside_pool_bytes\": ", file_);
  if (start >= 0 && n > 0 && m >= 0)
    outside_at_ = start + n + static_cast<long>(std::strlen(
                                  "\"outside_pool_bytes\": "));
  std::fprintf(file_, "%-*s}}\n", kFigureWidth, "null");
}

void TraceWriter::FlushLocked() {
  HeaderLocked();
  std::fflush(file_);
  if (outside_at_ < 0 || !outside_peak_) return;
  char figure[kFigureWidth + 1];
  std::snprintf(figure, sizeof figure, "%-*llu", kFigureWidth,
                static_cast<unsigned long long>(outside_peak_()));
  // pwrite leaves the stream's own position (the end) alone.
  if (::pwrite(::fileno(file_), figure, kFigureWidth, outside_at_) !=
      kFigureWidth)
    outside_at_ = -1;  // not a seekable file: the header keeps null
}

long long TraceWriter::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  return StopLocked();
}

long long TraceWriter::StopLocked() {
  if (file_ == nullptr) return -1;
  FlushLocked();
  active_.store(false, std::memory_order_release);
  std::fclose(file_);
  file_ = nullptr;
  live_.clear();
  if (!gzip_path_.empty()) {
    const std::string part = gzip_path_ + ".part";
    const std::string problem = Compress(part, gzip_path_);
    if (problem.empty()) {
      ::unlink(part.c_str());
    } else {
      std::fprintf(stderr,
                   "jaxlake shim: the trace could not be compressed to %s "
                   "(%s); its text (JSON lines) is in %s\n",
                   gzip_path_.c_str(), problem.c_str(), part.c_str());
    }
    gzip_path_.clear();
  }
  return events_;
}

void TraceWriter::BeforeFork() {
  mu_.lock();
  // The buffer only: a header not written yet waits for the first event,
  // which can tell the device count.
  if (file_ != nullptr) std::fflush(file_);
}

void TraceWriter::AfterForkInParent() { mu_.unlock(); }

void TraceWriter::AfterForkInChild() {
  if (file_ != nullptr) {
    std::fclose(file_);  // its buffer is empty: BeforeFork flushed it
    file_ = nullptr;
  }
  active_.store(false, std::memory_order_release);
  gzip_path_.clear();
  live_.clear();
  mu_.unlock();
}

void TraceWriter::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr || owner_pid_ != static_cast<long>(::getpid())) return;
  if (!gzip_path_.empty()) {
    StopLocked();
  } else {
    FlushLocked();
  }
}

void TraceWriter::set_flush_every(std::size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  flush_every_ = n > 0 ? n : 1;
}

void TraceWriter::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  FlushLocked();
}

std::string TraceWriter::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return file_ != nullptr ? path_ : std::string();
}

// Non-decreasing even if the clock were not: events are written in order.
std::uint64_t TraceWriter::Now() const {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  const auto t = static_cast<std::uint64_t>(ns > 0 ? ns : 0);
  return t > last_t_ ? t : last_t_;
}

void TraceWriter::WriteLineLocked(const TraceLine& line) {
  line_.clear();
  AppendTraceLine(&line_, line);
  std::fwrite(line_.data(), 1, line_.size(), file_);
  if (++events_ % static_cast<long long>(flush_every_) == 0) FlushLocked();
}

void TraceWriter::Alloc(int device, std::uintptr_t ptr, std::size_t size,
                        std::uint64_t stream) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  HeaderLocked();
  last_t_ = Now();
  const std::uint64_t id = next_id_++;
  live_[ptr] = Live{id, size};
  WriteLineLocked(TraceLine{last_t_, id, static_cast<std::uint64_t>(device),
                            size, stream, true, false, nullptr});
}

void TraceWriter::Free(int device, std::uintptr_t ptr, std::uint64_t stream) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // allocated before the trace started
  last_t_ = Now();
  WriteLineLocked(TraceLine{last_t_, it->second.id,
                            static_cast<std::uint64_t>(device),
                            it->second.size, stream, false, true, nullptr});
  live_.erase(it);
}

}  // namespace jaxlake::shim
