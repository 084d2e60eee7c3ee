// The fake GPU's shared state (see fakegpu.h).
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "cc/fakegpu/fakegpu.h"

namespace jaxlake::fakegpu {
namespace {

constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr int kMaxDevices = 64;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

// A bad option is said once on stderr and its default kept: the fake stands
// where a driver would, and a driver does not end the program.
void BadOption(const char* name, const std::string& value,
               const char* expected) {
  std::fprintf(stderr,
               "jaxlake fake GPU: ignoring %s=%s (expected %s)\n", name,
               value.c_str(), expected);
}

bool ParseU64(const std::string& s, std::uint64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

Options ReadOptions() {
  Options o;
  const std::string model = Env("JAXLAKE_FAKEGPU_MODEL");
  if (model == "h200") o.model = "h200";
  else if (!model.empty() && model != "h100")
    BadOption("JAXLAKE_FAKEGPU_MODEL", model, "h100 or h200");
  // H100 SXM5 and H200 SXM: the same SM 9.0 chip, with 80 and 141 GiB.
  o.memory = o.model == "h200" ? 141 * kGiB : 80 * kGiB;
  o.name = o.model == "h200" ? "NVIDIA H200 (jaxlake fake)"
                             : "NVIDIA H100 80GB HBM3 (jaxlake fake)";
  if (o.model == "h200") o.memory_clock_khz = 3201000;
  std::uint64_t v = 0;
  const std::string count = Env("JAXLAKE_FAKEGPU_COUNT");
  if (!count.empty()) {
    if (ParseU64(count, &v) && v >= 1 && v <= kMaxDevices)
      o.count = static_cast<int>(v);
    else
      BadOption("JAXLAKE_FAKEGPU_COUNT", count, "1 to 64");
  }
  const std::string memory = Env("JAXLAKE_FAKEGPU_MEMORY");
  if (!memory.empty()) {
    if (ParseU64(memory, &v) && v >= (std::uint64_t{64} << 20))
      o.memory = static_cast<std::size_t>(v);
    else
      BadOption("JAXLAKE_FAKEGPU_MEMORY", memory, "bytes, at least 64 MiB");
  }
  const std::string cuda = Env("JAXLAKE_FAKEGPU_CUDA");
  if (cuda == "13") o.cuda_major = 13;
  else if (!cuda.empty() && cuda != "12")
    BadOption("JAXLAKE_FAKEGPU_CUDA", cuda, "12 or 13");
  const std::string fail = Env("JAXLAKE_FAKEGPU_FAIL");
  std::size_t start = 0;
  while (start < fail.size()) {
    std::size_t end = fail.find(',', start);
    if (end == std::string::npos) end = fail.size();
    const std::string item = fail.substr(start, end - start);
    start = end + 1;
    const std::size_t a = item.find(':');
    const std::size_t b = a == std::string::npos ? a : item.find(':', a + 1);
    std::uint64_t nth = 0, code = 2;  // CUDA_ERROR_OUT_OF_MEMORY
    if (a == std::string::npos || a == 0 ||
        !ParseU64(item.substr(a + 1, b == std::string::npos ? b : b - a - 1),
                  &nth) ||
        nth == 0 ||
        (b != std::string::npos && !ParseU64(item.substr(b + 1), &code))) {
      BadOption("JAXLAKE_FAKEGPU_FAIL", item, "NAME:N or NAME:N:CODE");
      continue;
    }
    o.faults[item.substr(0, a)] = Options::Fault{nth, static_cast<int>(code)};
  }
  const std::string version = Env("JAXLAKE_FAKEGPU_DRIVER_VERSION");
  if (!version.empty()) {
    if (ParseU64(version, &v) && v >= 1000 && v <= 99999)
      o.driver_version = static_cast<int>(v);
    else
      BadOption("JAXLAKE_FAKEGPU_DRIVER_VERSION", version,
                "a CUDA version number such as 12080");
  }
  const std::string no_vmm = Env("JAXLAKE_FAKEGPU_NO_VMM");
  for (std::size_t at = 0; at < no_vmm.size();) {
    std::size_t end = no_vmm.find(',', at);
    if (end == std::string::npos) end = no_vmm.size();
    const std::string item = no_vmm.substr(at, end - at);
    at = end + 1;
    if (ParseU64(item, &v) && v < static_cast<std::uint64_t>(o.count))
      o.no_vmm.push_back(static_cast<int>(v));
    else
      BadOption("JAXLAKE_FAKEGPU_NO_VMM", item, "a device ordinal");
  }
  const std::string log = Env("JAXLAKE_FAKEGPU_LOG");
  if (!log.empty()) o.log = log;
  o.stats = Env("JAXLAKE_FAKEGPU_STATS");
  const std::string loop = Env("JAXLAKE_FAKEGPU_LOOP_LIMIT");
  if (!loop.empty()) {
    if (ParseU64(loop, &v))
      o.loop_limit = v;
    else
      BadOption("JAXLAKE_FAKEGPU_LOOP_LIMIT", loop,
                "a number of reads (0: no limit)");
  }
  o.shared = Env("JAXLAKE_FAKEGPU_SHARED");
  return o;
}

struct Counters {
  std::mutex mu;
  std::map<std::string, std::uint64_t> calls;
  std::map<std::string, std::uint64_t> unsupported;
  std::uint64_t failed = 0;
  std::uint64_t capture_refusals = 0;
  // Bytes of the device's copies and memsets (Zero, Fill, Move): written,
  // and left to the OS as zero pages instead.
  std::atomic<std::uint64_t> memset_written{0};
  std::atomic<std::uint64_t> memset_dropped{0};
  std::atomic<std::uint64_t> copy_written{0};
  std::atomic<std::uint64_t> copy_dropped{0};
  std::uint64_t graph_nodes[14] = {};  // by CUgraphNodeType, under mu
  std::uint64_t graph_alloc_bytes = 0;
  // VMM address space reserved and live mappings, now and at their peak.
  std::int64_t vmm_reserved = 0, vmm_reserved_peak = 0;
  std::int64_t vmm_mappings = 0, vmm_mappings_peak = 0;
  // Page-locked host memory from cuMemHostAlloc: bytes and regions held,
  // now and at their peak.
  std::int64_t host_bytes = 0, host_bytes_peak = 0;
  std::int64_t host_regions = 0, host_regions_peak = 0;
  // Faults armed while the program runs (jaxlake_fakegpu_fail_call): by
  // entry point, the call numbers that fail and their codes.
  std::map<std::string, std::map<std::uint64_t, int>> armed;
};
Counters& C() {
  static Counters* const c = new Counters();  // lives as long as the process
  return *c;
}

void WriteStats() {
  const Options& o = Opts();
  if (o.stats.empty()) return;
  std::FILE* f = std::fopen(o.stats.c_str(), "w");
  if (f == nullptr) return;
  Counters& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  std::fprintf(f, "{\"model\": \"%s\", \"devices\": %d, \"memory\": %zu, "
               "\"faults_injected\": %llu, \"calls\": {",
               o.model.c_str(), o.count, o.memory,
               static_cast<unsigned long long>(c.failed));
  bool first = true;
  for (const auto& [name, n] : c.calls) {
    std::fprintf(f, "%s\"%s\": %llu", first ? "" : ", ", name.c_str(),
                 static_cast<unsigned long long>(n));
    first = false;
  }
  std::fprintf(f, "}, \"unsupported\": {");
  first = true;
  for (const auto& [name, n] : c.unsupported) {
    std::fprintf(f, "%s\"%s\": %llu", first ? "" : ", ", name.c_str(),
                 static_cast<unsigned long long>(n));
    first = false;
  }
  // Graph nodes made, by type (CUgraphNodeType's names, lower case).
  static const char* const kNodeTypes[14] = {
      "kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event",
      "event_record", "ext_semas_signal", "ext_semas_wait", "mem_alloc",
      "mem_free", "batch_mem_op", "conditional"};
  std::fprintf(f, "}, \"graph_nodes\": {");
  for (int t = 0; t < 14; ++t)
    std::fprintf(f, "%s\"%s\": %llu", t == 0 ? "" : ", ", kNodeTypes[t],
                 static_cast<unsigned long long>(c.graph_nodes[t]));
  std::fprintf(f, "}, \"graph_alloc_bytes\": %llu",
               static_cast<unsigned long long>(c.graph_alloc_bytes));
  std::fprintf(f, ", \"vmm\": {\"reserved\": %lld, \"reserved_peak\": %lld, "
               "\"mappings\": %lld, \"mappings_peak\": %lld}",
               static_cast<long long>(c.vmm_reserved),
               static_cast<long long>(c.vmm_reserved_peak),
               static_cast<long long>(c.vmm_mappings),
               static_cast<long long>(c.vmm_mappings_peak));
  std::fprintf(f, ", \"host\": {\"bytes\": %lld, \"bytes_peak\": %lld, "
               "\"regions\": %lld, \"regions_peak\": %lld}",
               static_cast<long long>(c.host_bytes),
               static_cast<long long>(c.host_bytes_peak),
               static_cast<long long>(c.host_regions),
               static_cast<long long>(c.host_regions_peak));
  std::fprintf(f, ", \"bytes\": {\"memset_written\": %llu, "
               "\"memset_dropped\": %llu, \"copy_written\": %llu, "
               "\"copy_dropped\": %llu}}\n",
               static_cast<unsigned long long>(c.memset_written.load()),
               static_cast<unsigned long long>(c.memset_dropped.load()),
               static_cast<unsigned long long>(c.copy_written.load()),
               static_cast<unsigned long long>(c.copy_dropped.load()));
  std::fclose(f);
}

struct Memory {
  std::mutex mu;
  std::map<std::uintptr_t, Range> ranges;  // by base
  std::size_t used[kMaxDevices] = {};
};
Memory& M() {
  static Memory* const m = new Memory();
  return *m;
}

thread_local int t_device = -1;

}  // namespace

void CountGraphNode(int type, std::size_t bytes) {
  if (type < 0 || type >= 14) return;
  Counters& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  ++c.graph_nodes[type];
  c.graph_alloc_bytes += bytes;
}

void CountVmm(std::int64_t reserved, std::int64_t mappings) {
  Counters& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  c.vmm_reserved += reserved;
  c.vmm_mappings += mappings;
  c.vmm_reserved_peak = std::max(c.vmm_reserved_peak, c.vmm_reserved);
  c.vmm_mappings_peak = std::max(c.vmm_mappings_peak, c.vmm_mappings);
}

void CountHostAlloc(std::int64_t bytes) {
  Counters& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  c.host_bytes += bytes;
  c.host_regions += bytes < 0 ? -1 : 1;
  c.host_bytes_peak = std::max(c.host_bytes_peak, c.host_bytes);
  c.host_regions_peak = std::max(c.host_regions_peak, c.host_regions);
}

const Options& Opts() {
  static const Options* const o = [] {
    auto* p = new Options(ReadOptions());
    if (!p->stats.empty()) std::atexit(WriteStats);
    return p;
  }();
  return *o;
}

bool HasVmm(int device) {
  const std::vector<int>& off = Opts().no_vmm;
  return std::find(off.begin(), off.end(), device) == off.end();
}

std::uint64_t Calls(const std::string& name) {
  Counters& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.calls.find(name);
  return it == c.calls.end() ? 0 : it->second;
}

void CountCaptureRefusal() {
  Counters& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  ++c.capture_refusals;
}

std::uint64_t CaptureRefusals() {
  Counters& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.capture_refusals;
}

bool Enter(const char* name, int* code) {
  Counters& c = C();
  std::uint64_t n = 0;
  int armed = 0;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    n = ++c.calls[name];
    if (!c.armed.empty()) {
      auto a = c.armed.find(name);
      if (a != c.armed.end()) {
        auto call = a->second.find(n);
        if (call != a->second.end()) {
          armed = call->second;
          a->second.erase(call);
          if (a->second.empty()) c.armed.erase(a);
        }
      }
    }
  }
  const Options& o = Opts();
  if (armed == 0) {
    if (o.faults.empty()) return false;
    auto it = o.faults.find(name);
    if (it == o.faults.end() || it->second.nth != n) return false;
    armed = it->second.code;
  }
  {
    std::lock_guard<std::mutex> lock(c.mu);
    ++c.failed;
  }
  std::fprintf(stderr,
               "jaxlake fake GPU: injected fault: call %llu of %s fails "
               "with error %d\n",
               static_cast<unsigned long long>(n), name, armed);
  *code = armed;
  return true;
}

int Unsupported(const char* library, const char* name, int code) {
  Counters& c = C();
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    first = c.unsupported[name]++ == 0;
  }
  if (!first) return code;
  const std::string& log = Opts().log;
  if (log == "0" || log == "off") return code;
  std::FILE* f = log == "stderr" ? stderr : std::fopen(log.c_str(), "a");
  if (f == nullptr) return code;
  std::fprintf(f,
               "jaxlake fake GPU: %s entry point %s is not supported by the "
               "fake; it returned error %d\n",
               library, name, code);
  if (f != stderr) std::fclose(f);
  return code;
}

void AddRange(const Range& r) {
  Memory& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  m.ranges[r.base] = r;
}

void RemoveRange(std::uintptr_t base) {
  Memory& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  m.ranges.erase(base);
}

bool FindRange(std::uintptr_t p, Range* out) {
  Memory& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.ranges.upper_bound(p);
  if (it == m.ranges.begin()) return false;
  --it;
  if (p - it->second.base >= it->second.size) return false;
  *out = it->second;
  return true;
}

bool Charge(int device, std::size_t n) {
  if (SharedMode()) return SharedCharge(device, n);
  Memory& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  if (device < 0 || device >= Opts().count) return false;
  if (n > Opts().memory - m.used[device]) return false;
  m.used[device] += n;
  return true;
}

void Uncharge(int device, std::size_t n) {
  if (SharedMode()) return SharedUncharge(device, n);
  Memory& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  if (device < 0 || device >= Opts().count) return;
  m.used[device] -= n < m.used[device] ? n : m.used[device];
}

std::size_t Used(int device) {
  if (SharedMode()) return SharedUsed(device);
  Memory& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  return device >= 0 && device < Opts().count ? m.used[device] : 0;
}

void* MapAnonymous(std::size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void UnmapAnonymous(void* p, std::size_t size) {
  if (p != nullptr) ::munmap(p, size);
}

namespace {

void* Ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

std::size_t PageSize() {
  static const std::size_t page =
      static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// Whether [p, p+n) lies in one range whose pages the fake itself backs: the
// accessible mappings of a VMM reservation (memfd pages) or one of its
// anonymous maps. Memory the program registered is its own, and is only
// ever written; an unmapped or inaccessible piece of a reservation is left
// to fault as the device would.
bool OwnPages(std::uintptr_t p, std::size_t n, Range* r) {
  if (!FindRange(p, r) || n > r->size - (p - r->base)) return false;
  if (r->kind == Kind::kReserved) return Host().accessible(p, n);
  return r->anonymous;
}

// Writes n zero bytes at a; see Zero().
void ZeroCounted(std::uintptr_t a, std::size_t n,
                 std::atomic<std::uint64_t>* written,
                 std::atomic<std::uint64_t>* dropped) {
  const std::size_t page = PageSize();
  const std::uintptr_t lo = (a + page - 1) & ~std::uintptr_t{page - 1};
  const std::uintptr_t hi = (a + n) & ~std::uintptr_t{page - 1};
  Range r;
  if (lo < hi && OwnPages(a, n, &r)) {
    // MADV_REMOVE frees the memfd's pages (a hole in the file), so every
    // address it is mapped at reads zeros; MADV_DONTNEED gives a private
    // anonymous map fresh zero pages on the next touch.
    const int advice =
        r.kind == Kind::kReserved ? MADV_REMOVE : MADV_DONTNEED;
    if (::madvise(Ptr(lo), hi - lo, advice) == 0) {
      std::memset(Ptr(a), 0, lo - a);
      std::memset(Ptr(hi), 0, a + n - hi);
      *written += n - (hi - lo);
      *dropped += hi - lo;
      return;
    }
  }
  std::memset(Ptr(a), 0, n);
  *written += n;
}

}  // namespace

void Zero(void* dst, std::size_t n) {
  Counters& c = C();
  ZeroCounted(reinterpret_cast<std::uintptr_t>(dst), n, &c.memset_written,
              &c.memset_dropped);
}

template <typename T>
void Fill(void* dst, T value, std::size_t count) {
  if (value == 0) {
    Zero(dst, count * sizeof(T));
    return;
  }
  T* p = static_cast<T*>(dst);
  if (sizeof(T) == 1) {
    std::memset(p, static_cast<int>(value), count);
  } else {
    std::fill(p, p + count, value);
  }
  C().memset_written += count * sizeof(T);
}
template void Fill<std::uint8_t>(void*, std::uint8_t, std::size_t);
template void Fill<std::uint16_t>(void*, std::uint16_t, std::size_t);
template void Fill<std::uint32_t>(void*, std::uint32_t, std::size_t);

void Move(void* dst, const void* src, std::size_t n) {
  Counters& c = C();
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const std::size_t page = PageSize();
  const std::uintptr_t first = s & ~std::uintptr_t{page - 1};
  const std::size_t pages = n == 0 ? 0 : (s + n - first + page - 1) / page;
  // A page of the source that mincore() does not find resident holds no
  // data: never written, or dropped. That holds only without swap (a
  // swapped-out page is not resident either), and only for the fake's own
  // pages (a file's page may be on disk).
  Range r;
  struct sysinfo si {};
  std::vector<unsigned char> resident;
  const bool holes = pages != 0 && (d + n <= s || s + n <= d) &&
                     OwnPages(s, n, &r) && ::sysinfo(&si) == 0 &&
                     si.totalswap == 0;
  if (holes) resident.resize(pages);
  if (!holes || ::mincore(Ptr(first), pages * page, resident.data()) != 0) {
    std::memmove(dst, src, n);
    c.copy_written += n;
    return;
  }
  // Runs of data pages are copied; runs of holes are zeros at the
  // destination, which Zero's rule may drop.
  std::size_t done = 0;
  while (done < n) {
    std::size_t i = (s + done - first) / page;
    const bool hole = (resident[i] & 1) == 0;
    while (i + 1 < pages && ((resident[i + 1] & 1) == 0) == hole) ++i;
    const std::size_t end =
        std::min<std::size_t>(n, first + (i + 1) * page - s);
    if (hole) {
      ZeroCounted(d + done, end - done, &c.copy_written, &c.copy_dropped);
    } else {
      std::memmove(Ptr(d + done), Ptr(s + done), end - done);
      c.copy_written += end - done;
    }
    done = end;
  }
}

namespace {
// ReadLoopGuard's books, per reader: a device address and the host address
// it is read into (XLA's while loop reads its predicate into a host buffer
// of its own, so nested loops whose predicates share a device address are
// told apart). For each, the nonzero byte its last reads gave and how many
// times in a row; and the readers whose loop the guard has ended once
// (stuck flags). Never destroyed: stream threads may copy while the process
// exits.
struct LoopReads {
  using Reader = std::pair<std::uintptr_t, std::uintptr_t>;
  std::mutex mu;
  std::map<Reader, std::pair<unsigned char, std::uint64_t>> last;
  std::set<Reader> stuck;
  bool named = false;
};
LoopReads& L() {
  static LoopReads* const l = new LoopReads();
  return *l;
}
bool DeviceMemory(std::uintptr_t p) {
  Range r;
  return FindRange(p, &r) && r.kind != Kind::kHost;
}
}  // namespace

void ReadLoopGuard(void* dst, const void* src, std::size_t n) {
  const std::uint64_t limit = Opts().loop_limit;
  if (n != 1 || limit == 0) return;
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  if (!DeviceMemory(s) || DeviceMemory(d)) return;
  auto* out = static_cast<unsigned char*>(dst);
  const LoopReads::Reader reader{s, d};
  LoopReads& l = L();
  std::lock_guard<std::mutex> lock(l.mu);
  if (*out == 0) {
    l.last.erase(reader);
    return;
  }
  auto& [value, count] = l.last[reader];
  if (value != *out) {
    value = *out;
    count = 0;
  }
  // A flag the guard found stuck once ends its next loops at the second
  // read: loops nested in a loop would otherwise cost limit reads each.
  const std::uint64_t here =
      l.stuck.count(reader) != 0 ? std::min<std::uint64_t>(limit, 2) : limit;
  if (++count < here) return;
  l.last.erase(reader);
  l.stuck.insert(reader);
  *out = 0;
  if (!l.named) {
    l.named = true;
    std::fprintf(stderr,
                 "jaxlake fake GPU: a one-byte device-to-host read gave the "
                 "same nonzero value %llu times in a row (a loop on a flag "
                 "that kernels compute, and kernels do not run here): it "
                 "reads 0, and so does every such loop's flag once stuck "
                 "(JAXLAKE_FAKEGPU_LOOP_LIMIT)\n",
                 static_cast<unsigned long long>(limit));
  }
}

vmm::HostDriver& Host() {
  static vmm::HostDriver* const host = [] {
    vmm::SimOptions o = vmm::HostDefaults();
    o.granularity = std::size_t{2} << 20;
    o.device_bytes = Opts().memory * static_cast<std::size_t>(Opts().count);
    return new vmm::HostDriver(o);
  }();
  return *host;
}

// ---- streams ----------------------------------------------------------------

Stream::Stream(int device) : device_(device), thread_([this] { Run(); }) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Stream::Enqueue(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(std::move(work));
    ++enqueued_;
  }
  cv_.notify_all();
}

void Stream::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t target = enqueued_;
  cv_.wait(lock, [&] { return done_ >= target; });
}

bool Stream::Idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ == enqueued_;
}

void Stream::Hold() {
  std::uint64_t hold = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold = ++holds_;
  }
  // Work of its own, in order: what comes after it waits with it.
  Enqueue([this, hold] {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || released_ >= hold; });
  });
}

bool Stream::Held() {
  std::lock_guard<std::mutex> lock(mu_);
  return released_ < holds_;
}

void Stream::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = holds_;
  }
  cv_.notify_all();
}

void Stream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
    if (work_.empty()) return;  // stopping, and everything ran
    std::function<void()> work = std::move(work_.front());
    work_.pop_front();
    lock.unlock();
    SetCurrentDevice(device_);
    work();
    lock.lock();
    ++done_;
    cv_.notify_all();
  }
}

namespace {

struct Handles {
  std::mutex mu;
  std::unordered_map<std::uintptr_t, std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Stream>> defaults;  // one a device
  std::unordered_map<std::uintptr_t, std::shared_ptr<Event>> events;
  std::uintptr_t next = 0x5000000;
};
Handles& H() {
  static Handles* const h = [] {
    auto* p = new Handles();
    for (int d = 0; d < Opts().count; ++d)
      p->defaults.push_back(std::make_unique<Stream>(d));
    return p;
  }();
  return *h;
}

}  // namespace

Stream* StreamOf(void* handle, int current_device) {
  const auto v = reinterpret_cast<std::uintptr_t>(handle);
  Handles& h = H();
  std::lock_guard<std::mutex> lock(h.mu);
  if (v <= 2) {  // null, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
    const int d = current_device < 0 ? 0 : current_device;
    return d < static_cast<int>(h.defaults.size()) ? h.defaults[d].get()
                                                   : nullptr;
  }
  auto it = h.streams.find(v);
  return it == h.streams.end() ? nullptr : it->second.get();
}

void* NewStream(int device, unsigned flags, int priority) {
  auto s = std::make_unique<Stream>(device);
  s->flags = flags;
  s->priority = priority;
  Handles& h = H();
  std::lock_guard<std::mutex> lock(h.mu);
  const std::uintptr_t v = h.next;
  h.next += 0x10;
  h.streams[v] = std::move(s);
  return reinterpret_cast<void*>(v);
}

bool DestroyStream(void* handle) {
  std::unique_ptr<Stream> s;
  {
    Handles& h = H();
    std::lock_guard<std::mutex> lock(h.mu);
    auto it = h.streams.find(reinterpret_cast<std::uintptr_t>(handle));
    if (it == h.streams.end()) return false;
    s = std::move(it->second);
    h.streams.erase(it);
  }
  s->Synchronize();  // as the driver does: pending work completes
  return true;       // the thread is joined as `s` goes
}

std::vector<Stream*> StreamsOf(int device) {
  std::vector<Stream*> out;
  Handles& h = H();
  std::lock_guard<std::mutex> lock(h.mu);
  if (device >= 0 && device < static_cast<int>(h.defaults.size()))
    out.push_back(h.defaults[device].get());
  for (auto& [v, s] : h.streams)
    if (s->device() == device) out.push_back(s.get());
  return out;
}

std::shared_ptr<Event> EventOf(void* handle) {
  Handles& h = H();
  std::lock_guard<std::mutex> lock(h.mu);
  auto it = h.events.find(reinterpret_cast<std::uintptr_t>(handle));
  return it == h.events.end() ? nullptr : it->second;
}

void* NewEvent(unsigned flags) {
  auto e = std::make_shared<Event>();
  e->flags = flags;
  Handles& h = H();
  std::lock_guard<std::mutex> lock(h.mu);
  const std::uintptr_t v = h.next;
  h.next += 0x10;
  h.events[v] = std::move(e);
  return reinterpret_cast<void*>(v);
}

bool DestroyEvent(void* handle) {
  Handles& h = H();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.events.erase(reinterpret_cast<std::uintptr_t>(handle)) == 1;
}

std::size_t LiveEvents() {
  Handles& h = H();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.events.size();
}

void RecordEvent(const std::shared_ptr<Event>& e, Stream* s) {
  std::uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = ++e->recorded;
  }
  s->Enqueue([e, target] {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->completed < target) e->completed = target;
    e->time_ms = NowMs();
    e->cv.notify_all();
  });
}

void WaitEvent(Stream* s, const std::shared_ptr<Event>& e) {
  std::uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = e->recorded;
  }
  if (target == 0) return;
  s->Enqueue([e, target] {
    std::unique_lock<std::mutex> lock(e->mu);
    e->cv.wait(lock, [&] { return e->completed >= target; });
  });
}

double NowMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 +
         static_cast<double>(ts.tv_nsec) / 1e6;
}

int CurrentDevice() { return t_device; }
void SetCurrentDevice(int device) { t_device = device; }

}  // namespace jaxlake::fakegpu

// Fault injection while the program runs, for the tests (the schedule of
// JAXLAKE_FAKEGPU_FAIL, armed from inside the process): the `nth` call of
// entry point `name` from now on (1: the next one) fails with `code`
// (nonzero). Several faults may be armed at once. Returns 0, or -1 for a
// bad argument.
extern "C" __attribute__((visibility("default"))) int
jaxlake_fakegpu_fail_call(const char* name, unsigned long long nth,
                          int code) {
  if (name == nullptr || nth == 0 || code == 0) return -1;
  jaxlake::fakegpu::Counters& c = jaxlake::fakegpu::C();
  std::lock_guard<std::mutex> lock(c.mu);
  const std::uint64_t now = c.calls[name];
  c.armed[name][now + nth] = code;
  return 0;
}
