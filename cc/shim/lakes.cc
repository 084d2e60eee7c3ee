// jaxlake shim: the process-wide state (see lakes.h).
#include "cc/shim/lakes.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cc/shim/loader.h"

namespace jaxlake::shim {

const char* HookName(Hook h) {
  switch (h) {
#define JAXLAKE_X(name) \
  case Hook::name:      \
    return #name;
    JAXLAKE_SHIM_HOOKS(JAXLAKE_X)
#undef JAXLAKE_X
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
  std::atexit([] { Lakes::Get().trace().Flush(); });
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
  // fraction (options.h).
  const double fraction = options_.capacity_fraction > 0.0
                              ? options_.capacity_fraction
                          : lake_options.capacity == 0 ? options_.xla_fraction
                                                       : 0.0;
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

}  // namespace jaxlake::shim

