// jaxlake shim: the process-wide state (see lakes.h).
#include "cc/shim/lakes.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "cc/shim/loader.h"

namespace jaxlake::shim {

const char* HookName(Hook h) {
  switch (h) {
#define JAXLAKE_SHIM_HOOK(name) \
  case Hook::name:              \
    return #name;
#include "cc/shim/hooked.inc"
#undef JAXLAKE_SHIM_HOOK
    case Hook::kCount:
      break;
  }
  return "unknown";
}

Lakes& Lakes::Get() {
  static Lakes* const lakes = new Lakes();  // never destroyed (see lakes.h)
  return *lakes;
}

Lakes::Lakes() {
  const RealDriver& real = Real();
  const std::string bad_option = ReadOptions(&options_);
  if (real.handle == nullptr) {
    inactive_reason_ = real.error;
  } else if (!bad_option.empty()) {
    inactive_reason_ = bad_option;
    std::fprintf(stderr,
                 "jaxlake shim: %s; every call goes to the CUDA driver\n",
                 bad_option.c_str());
  } else if (!options_.hooks) {
    inactive_reason_ = "JAXLAKE_SHIM_HOOKS=0: every call goes to the CUDA "
                       "driver";
  } else {
    active_.store(true, std::memory_order_release);
  }
  trace_.set_flush_every(options_.trace_flush);
  // The trace's tail reaches the file at exit (the state is never
  // destroyed, see lakes.h).
  // (A trace to a .gz name is compressed then: trace.h.)
  std::atexit([] { Lakes::Get().trace().Finish(); });
  // A forked child writes nothing into its parent's trace.
  ::pthread_atfork([] { Lakes::Get().trace().BeforeFork(); },
                   [] { Lakes::Get().trace().AfterForkInParent(); },
                   [] { Lakes::Get().trace().AfterForkInChild(); });
  if (options_.exit_report) {
    // Registered after the trace's handler, so it runs before it; not in
    // a forked child, whose figures are its parent's copied.
    static const pid_t owner = ::getpid();
    std::atexit([] {
      if (::getpid() != owner) return;
      const std::string report = Lakes::Get().ExitReport();
      if (report.empty()) return;
      std::fflush(stdout);
      std::fputs(report.c_str(), stderr);
      std::fflush(stderr);
    });
  }
  if (!options_.trace_file.empty()) {
    const int r = StartTrace(options_.trace_file, "shim");
    if (r != 0)
      std::fprintf(stderr, "jaxlake shim: cannot write the trace to %s: %s\n",
                   options_.trace_file.c_str(), std::strerror(-r));
  }
}

int Lakes::StartTrace(const std::string& path, const std::string& name) {
  outside_.ResetPeak();
  return trace_.Start(path, name, [this] { return DeviceCount(); },
                      [this] { return outside_.peak(); });
}

void OutsideLedger::Add(Key kind, std::uintptr_t key, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& live = kind == Key::kAddress ? addresses_ : handles_;
  auto [it, fresh] = live.emplace(key, bytes);
  if (!fresh) {  // a key the driver handed out again: the old one is gone
    current_ -= it->second;
    it->second = bytes;
  }
  current_ += bytes;
  ++allocations_;
  if (current_ > peak_) peak_ = current_;
}

bool OutsideLedger::Remove(Key kind, std::uintptr_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& live = kind == Key::kAddress ? addresses_ : handles_;
  auto it = live.find(key);
  if (it == live.end()) return false;
  current_ -= it->second;
  live.erase(it);
  return true;
}

std::uint64_t OutsideLedger::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

std::uint64_t OutsideLedger::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

std::uint64_t OutsideLedger::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

void OutsideLedger::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = current_;
}

void Lakes::Disable(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.store(false, std::memory_order_release);
  inactive_reason_ = why;
}

std::string Lakes::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = inactive_reason_;
  for (const std::string& f : failures_)
    out += (out.empty() ? "" : "; ") + f;
  return out;
}

int Lakes::DeviceCount() const {
  const RealApi& api = Real().api;
  int count = 0;
  if (api.DeviceGetCount == nullptr ||
      api.DeviceGetCount(&count) != cuda::CUDA_SUCCESS)
    return 0;
  return count;
}

int Lakes::DeviceOfPool(cuda::CUmemoryPool pool) {
  if (pool == nullptr) return -1;
  if (!pools_known_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pools_known_.load(std::memory_order_relaxed)) {
      // Needs an initialised driver: until then, nothing is known (and
      // nothing cached, so a later call tries again).
      const RealApi& api = Real().api;
      if (api.DeviceGet == nullptr || api.DeviceGetDefaultMemPool == nullptr)
        return -1;
      const int count = std::min(DeviceCount(), kMaxDevices);
      if (count <= 0) return -1;
      std::vector<cuda::CUmemoryPool> pools(static_cast<std::size_t>(count),
                                            nullptr);
      for (int d = 0; d < count; ++d) {
        cuda::CUdevice dev = 0;
        cuda::CUmemoryPool p = nullptr;
        if (api.DeviceGet(&dev, d) == cuda::CUDA_SUCCESS &&
            api.DeviceGetDefaultMemPool(&p, dev) == cuda::CUDA_SUCCESS)
          pools[static_cast<std::size_t>(d)] = p;
      }
      pools_ = std::move(pools);
      pools_known_.store(true, std::memory_order_release);
    }
  }
  for (std::size_t d = 0; d < pools_.size(); ++d)
    if (pools_[d] == pool) return static_cast<int>(d);
  return -1;
}

int Lakes::CurrentDevice() const {
  const RealApi& api = Real().api;
  cuda::CUdevice current = 0;
  if (api.CtxGetDevice == nullptr || api.DeviceGet == nullptr ||
      api.CtxGetDevice(&current) != cuda::CUDA_SUCCESS)
    return -1;
  // A CUdevice is the driver's handle; the ordinal is the one that names it.
  const int count = std::min(DeviceCount(), kMaxDevices);
  for (int d = 0; d < count; ++d) {
    cuda::CUdevice dev = 0;
    if (api.DeviceGet(&dev, d) == cuda::CUDA_SUCCESS && dev == current)
      return d;
  }
  return -1;
}

Lake* Lakes::Existing(int device) const {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  DeviceLake* dl = lakes_[static_cast<std::size_t>(device)].load(
      std::memory_order_acquire);
  return dl != nullptr ? dl->lake.get() : nullptr;
}

Lake* Lakes::LakeFor(int device) {
  if (!active_ || device < 0 || device >= kMaxDevices) return nullptr;
  if (Lake* lake = Existing(device)) return lake;
  std::lock_guard<std::mutex> lock(mu_);
  const auto slot = static_cast<std::size_t>(device);
  if (DeviceLake* dl = lakes_[slot].load(std::memory_order_relaxed))
    return dl->lake.get();
  if (failed_[slot]) return nullptr;
  std::string why;
  if (library_ == nullptr) library_ = vmm::CudaLibrary::Open(Real().path, &why);
  std::unique_ptr<vmm::CudaDriver> driver;
  if (library_ != nullptr) {
    vmm::CudaDriverOptions driver_options;
    driver_options.peer_access = options_.peer_access;
    driver = vmm::CudaDriver::Create(library_, device, &why, driver_options);
  }
  LakeOptions lake_options = options_.lake;
  // JAXLAKE_CAPACITY_FRACTION, else JAXLAKE_CAPACITY, else XLA's memory
  // fraction, else the whole device (0.75 preallocating): options.h.
  const double fraction = CapacityFraction(options_);
  if (driver != nullptr && fraction > 0.0) {
    // A share of this device's memory, in whole granules.
    const std::size_t gran = driver->granularity();
    const auto share = static_cast<std::size_t>(
        static_cast<double>(driver->total_memory()) * fraction);
    lake_options.capacity = std::max(gran, share / gran * gran);
  }
  if (driver != nullptr) {
    const std::string bad = ValidateOptions(lake_options, *driver);
    if (!bad.empty()) why = "invalid lake options: " + bad;
  }
  if (driver == nullptr || !why.empty()) {
    failed_[slot] = true;
    const std::string msg = "device " + std::to_string(device) + ": " + why;
    failures_.push_back(msg);
    std::fprintf(stderr,
                 "jaxlake shim: no lake for %s; its allocations go to the "
                 "CUDA driver\n",
                 msg.c_str());
    return nullptr;
  }
  auto dl = std::make_unique<DeviceLake>();
  dl->driver = std::move(driver);
  dl->lake = std::make_unique<Lake>(*dl->driver, lake_options);
  Lake* lake = dl->lake.get();
  lakes_[slot].store(dl.release(), std::memory_order_release);  // never freed
  return lake;
}

std::vector<int> Lakes::Devices() const {
  std::vector<int> out;
  for (int d = 0; d < kMaxDevices; ++d)
    if (Existing(d) != nullptr) out.push_back(d);
  return out;
}

int Lakes::AddressOwner(std::uintptr_t ptr) const {
  for (int d = 0; d < kMaxDevices; ++d) {
    const DeviceLake* dl =
        lakes_[static_cast<std::size_t>(d)].load(std::memory_order_acquire);
    if (dl != nullptr && dl->driver->owns_address(ptr)) return d;
  }
  return -1;
}

void Lakes::Served(int device, std::uintptr_t address, std::size_t bytes) {
  if (device < 0 || device >= kMaxDevices) return;
  Live& l = live_[static_cast<std::size_t>(device)];
  std::lock_guard<std::mutex> lock(l.mu);
  l.allocations[address] = bytes;
}

void Lakes::Freed(int device, std::uintptr_t address) {
  if (device < 0 || device >= kMaxDevices) return;
  Live& l = live_[static_cast<std::size_t>(device)];
  std::lock_guard<std::mutex> lock(l.mu);
  l.allocations.erase(address);
}

bool Lakes::FindLive(std::uintptr_t ptr, std::uintptr_t* base,
                     std::size_t* bytes) const {
  const int device = AddressOwner(ptr);
  if (device < 0) return false;
  const Live& l = live_[static_cast<std::size_t>(device)];
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.allocations.upper_bound(ptr);
  if (it == l.allocations.begin()) return false;
  --it;
  if (ptr - it->first >= it->second) return false;
  *base = it->first;
  *bytes = it->second;
  return true;
}

namespace {

// A size as jaxlake's Python side writes it (options.format_bytes, three
// significant digits): "0 B", "512 KiB", "1.50 GiB", "12.3 MiB".
std::string FormatBytes(std::uint64_t n) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double scale = 1.0;
  while (unit < 4 && static_cast<double>(n) >= scale * 1024.0) {
    scale *= 1024.0;
    ++unit;
  }
  if (unit == 0) return std::to_string(n) + " B";
  double value = static_cast<double>(n) / scale;
  int decimals = std::max(0, 2 - static_cast<int>(std::floor(std::log10(value))));
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  if (unit < 4 && std::strtod(text, nullptr) >= 1024.0) {  // 1023.99 MiB
    value = 1.0;
    decimals = 2;
    ++unit;
  }
  std::snprintf(text, sizeof text, "%.*f %s", decimals, value, kUnits[unit]);
  return text;
}

// The process's command line (arguments joined by spaces), cut to `limit`.
std::string CommandLine(std::size_t limit) {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  for (char& c : raw)
    if (c == '\n' || c == '\t') c = ' ';
  if (raw.size() > limit) raw = raw.substr(0, limit - 3) + "...";
  return raw;
}

}  // namespace

std::string Lakes::ExitReport() {
  struct Row {
    int device;
    std::uint64_t served, forwarded, captured;
    const Lake* lake;
  };
  std::vector<Row> rows;
  std::uint64_t on_devices = 0;
  for (int d = 0; d < kMaxDevices; ++d) {
    const DeviceCounter& c = device_counters_[static_cast<std::size_t>(d)];
    Row row{d, c.served.load(), c.forwarded.load(), c.captured.load(),
            Existing(d)};
    on_devices += row.forwarded;
    if (row.lake != nullptr || row.served + row.forwarded > 0)
      rows.push_back(row);
  }
  // Forwarded pool requests no device claims: other pools than the
  // devices' default ones (zero-byte and null-output requests aside).
  std::uint64_t all_forwarded = 0;
  for (Hook h : {Hook::cuMemAllocFromPoolAsync,
                 Hook::cuMemAllocFromPoolAsync_ptsz})
    all_forwarded += counter(h).forwarded.load();
  const std::uint64_t elsewhere =
      all_forwarded > on_devices ? all_forwarded - on_devices : 0;
  if (rows.empty() && elsewhere == 0) return {};

  std::string out = "jaxlake: lake report, pid " +
                    std::to_string(static_cast<long long>(::getpid())) + " (" +
                    CommandLine(60) + ")";
  if (!active()) out += ": lake inactive: " + reason();
  out += "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %6s  %8s  %9s  %8s  %11s  %13s  %6s  %8s\n",
                "device", "served", "forwarded", "captured", "peak in use",
                "peak reserved", "U", "stitches");
  out += line;
  for (const Row& r : rows) {
    std::string peak = "-", reserved = "-", u = "-", stitches = "-";
    if (r.lake != nullptr) {
      const Stats s = r.lake->stats();
      peak = FormatBytes(s.bytes_in_use.peak);
      reserved = FormatBytes(s.bytes_reserved.peak);
      char text[32];
      std::snprintf(text, sizeof text, "%.3f",
                    s.bytes_reserved.peak == 0
                        ? 1.0
                        : static_cast<double>(s.bytes_in_use.peak) /
                              static_cast<double>(s.bytes_reserved.peak));
      u = text;
      stitches = std::to_string(s.alloc_stitch + s.alloc_stitch_grow);
    }
    std::snprintf(line, sizeof line,
                  "  %6d  %8llu  %9llu  %8llu  %11s  %13s  %6s  %8s\n", r.device,
                  static_cast<unsigned long long>(r.served),
                  static_cast<unsigned long long>(r.forwarded),
                  static_cast<unsigned long long>(r.captured), peak.c_str(),
                  reserved.c_str(), u.c_str(), stitches.c_str());
    out += line;
  }
  if (elsewhere > 0)
    out += "  other pools: " + std::to_string(elsewhere) +
           " allocations forwarded to the CUDA driver\n";
  // Forwarded allocations that found the device full and made the lakes
  // give back their cached memory (hooks.cc).
  std::uint64_t pressure = 0, pressure_ok = 0, pressure_bytes = 0;
  for (int h = 0; h < kNumHooks; ++h) {
    const HookCounter& c = counters_[static_cast<std::size_t>(h)];
    pressure += c.pressure.load();
    pressure_ok += c.pressure_ok.load();
    pressure_bytes += c.pressure_bytes.load();
  }
  if (pressure > 0)
    out += "  memory pressure: " + std::to_string(pressure) +
           " forwarded allocations found the device full; the lakes gave "
           "back " + FormatBytes(pressure_bytes) + " of cached memory and " +
           std::to_string(pressure_ok) + " then succeeded\n";
  return out;
}

}  // namespace jaxlake::shim

