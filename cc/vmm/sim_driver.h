// jaxlake: the simulated driver.
//
// Address bookkeeping only: no memory is touched, so a lake over it can
// replay traces of any device size (80 GiB and more) on a laptop. It enforces
// every rule of driver.h and models streams and events: an event recorded on
// a stream completes at once unless the stream is held (hold_stream), which
// lets a test keep work "in flight" and check that the lake waits for it.
// The host driver derives from it and adds real memory behind the hooks.
#ifndef JAXLAKE_VMM_SIM_DRIVER_H_
#define JAXLAKE_VMM_SIM_DRIVER_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "cc/vmm/driver.h"
#include "cc/vmm/latency.h"

namespace jaxlake::vmm {

struct SimOptions {
  std::size_t granularity = std::size_t{2} << 20;   // power of two
  std::size_t device_bytes = std::size_t{80} << 30;  // physical capacity
  // The time each call would take on a real driver (latency.h); charged,
  // never waited for.
  LatencyModel latency;
};

class SimDriver : public Driver {
 public:
  explicit SimDriver(const SimOptions& options = {});
  ~SimDriver() override;

  const char* name() const override { return "sim"; }
  std::size_t granularity() const override;
  std::size_t total_memory() const override;

  // Testing: while a stream is held, events recorded on it stay incomplete.
  // With until_waited, the hold also ends (as release_stream) when a thread
  // synchronizes with an event of the stream that the hold keeps
  // incomplete: the device finishes the work someone waits for, so a
  // single-threaded test cannot block forever.
  void hold_stream(Stream stream, bool until_waited = false);
  // True while the stream is held.
  bool stream_held(Stream stream) const;
  // How many holds of the stream have ended so far (release_stream, or a
  // wait with until_waited), and in *held whether it is held now, read at
  // one instant: work queued on a held stream is complete once the count
  // has grown.
  std::uint64_t stream_releases(Stream stream, bool* held) const;
  // Completes everything recorded on the stream so far and wakes waiters.
  void release_stream(Stream stream);

  // Introspection (for tests and checks).
  std::size_t physical_bytes() const;   // bytes of memory still alive
  std::size_t mapped_bytes() const;     // bytes currently mapped
  std::size_t reserved_bytes() const;   // bytes of reserved address space
  std::size_t live_handles() const;     // handles created and not released
  std::size_t live_events() const;      // events created and not destroyed
  // True when every byte of [va, va+size) is mapped with access set.
  bool accessible(std::uintptr_t va, std::size_t size) const;
  // The modelled driver time of the calls made so far, by kind (us).
  CallTimes driver_us() const;

 protected:
  JAXLAKE_VMM_BACKEND_CALLS(, override)

  // Hooks for a backend with real memory (the host driver). Each is called
  // with the driver's mutex held, after the rule checks passed; a failure is
  // returned to the caller and leaves the bookkeeping unchanged.
  virtual Status os_reserve(std::size_t size, std::uintptr_t* va);
  virtual Status os_address_free(std::uintptr_t va, std::size_t size);
  virtual Status os_create(std::size_t size, Handle handle);
  virtual void os_release_memory(Handle handle);  // last mapping gone
  virtual Status os_map(std::uintptr_t va, std::size_t size,
                        std::size_t offset, Handle handle);
  virtual Status os_unmap(std::uintptr_t va, std::size_t size);
  virtual Status os_set_access(std::uintptr_t va, std::size_t size);

 private:
  // Called by release() with the mutex held, whether or not the handle is
  // still mapped: a backend drops what it needs only to make new mappings
  // (the host driver closes the memfd). The memory itself lives on until
  // os_release_memory().
  virtual void os_release_handle(Handle handle);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_SIM_DRIVER_H_
