// The fake GPU's control API (control.h): figures and stream holds for
// tests, over the driver's state (driver.h) and the shared state
// (fakegpu.h).
#include "cc/fakegpu/control.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;
using jaxlake::fakegpu::driver::D;
using jaxlake::fakegpu::driver::Driver;
using jaxlake::fakegpu::driver::ValidDevice;

#define CONTROL extern "C" __attribute__((visibility("default")))

CONTROL unsigned long long jaxlake_fakegpu_calls(const char* name) {
  return name != nullptr ? fg::Calls(name) : 0;
}

CONTROL unsigned long long jaxlake_fakegpu_capture_refusals() {
  return fg::CaptureRefusals();
}

CONTROL unsigned long long jaxlake_fakegpu_launches() {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.launches;
}

CONTROL void jaxlake_fakegpu_last_launch(unsigned long long out[11]) {
  if (out == nullptr) return;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  std::copy(d.last_launch, d.last_launch + 11, out);
}

CONTROL unsigned long long jaxlake_fakegpu_used(int device) {
  return fg::Used(device);
}

CONTROL unsigned long long jaxlake_fakegpu_created_bytes(int device) {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  unsigned long long n = 0;
  for (const auto& [handle, h] : d.handles)
    if (h.device == device) n += h.size;
  return n;
}

CONTROL unsigned long long jaxlake_fakegpu_pool_bytes(int device) {
  if (!ValidDevice(device)) return 0;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.pool_used[static_cast<std::size_t>(device)];
}

CONTROL int jaxlake_fakegpu_primary_refs(int device) {
  if (!ValidDevice(device)) return -1;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.primary_refs[static_cast<std::size_t>(device)];
}

CONTROL unsigned long long jaxlake_fakegpu_access(unsigned long long address) {
  jaxlake::cuda::CUdeviceptr base = 0;
  Driver::Mapping m{};
  return jaxlake::fakegpu::driver::FindMapping(address, &base, &m) ? m.access
                                                                  : 0;
}

CONTROL unsigned long long jaxlake_fakegpu_vmm(const char* figure) {
  if (figure == nullptr) return 0;
  const jaxlake::vmm::HostDriver& host = fg::Host();
  if (std::strcmp(figure, "reserved") == 0) return host.reserved_bytes();
  if (std::strcmp(figure, "mapped") == 0) return host.mapped_bytes();
  if (std::strcmp(figure, "physical") == 0) return host.physical_bytes();
  if (std::strcmp(figure, "handles") == 0) return host.live_handles();
  if (std::strcmp(figure, "events") == 0) return fg::LiveEvents();
  return 0;
}

CONTROL int jaxlake_fakegpu_accessible(unsigned long long address,
                                       unsigned long long size) {
  return fg::Host().accessible(address, size) ? 1 : 0;
}

CONTROL int jaxlake_fakegpu_hold_stream(void* stream) {
  fg::Stream* s = fg::StreamOf(stream, fg::CurrentDevice());
  if (s == nullptr) return -1;
  s->Hold();
  return 0;
}

CONTROL int jaxlake_fakegpu_release_stream(void* stream) {
  fg::Stream* s = fg::StreamOf(stream, fg::CurrentDevice());
  if (s == nullptr) return -1;
  s->Release();
  return 0;
}

CONTROL void jaxlake_fakegpu_synchronize(int device) {
  for (int d = 0; d < fg::Opts().count; ++d) {
    if (device >= 0 && d != device) continue;
    for (fg::Stream* s : fg::StreamsOf(d))
      if (!s->Held()) s->Synchronize();
  }
}
