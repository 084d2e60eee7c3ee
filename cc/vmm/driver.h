// jaxlake: the virtual-memory driver interface.
//
// Everything the lake knows about a device goes through this one small
// interface, modelled on the CUDA virtual memory management (VMM) API:
//
//   reserve / address_free   a virtual address range (no memory behind it)
//   create  / release        a physical handle of N granules
//   map     / unmap          [offset, offset+size) of a handle at an address
//   set_access               make a mapped range readable and writable
//   event_*                  events recorded on streams, queried or waited
//
// Preconditions, written once here and enforced by every backend (so a test
// on the CPU fails where the real driver would):
//   * sizes, offsets and reserved addresses are multiples of granularity();
//   * map() targets a reserved range that is not mapped yet, and a range of a
//     live handle;
//   * unmap() covers exactly whole mappings made by map() (no partial unmap);
//   * a mapping may not be touched before set_access() covered it;
//   * address_free() takes exactly a reservation with no mapping left in it;
//   * release() of a handle that is still mapped is allowed: its memory is
//     freed when the last mapping goes (as in CUDA).
// Every call returns a Status and never throws. Calls are counted by kind in
// the base class, so every backend reports the same figures.
#ifndef JAXLAKE_VMM_DRIVER_H_
#define JAXLAKE_VMM_DRIVER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace jaxlake::vmm {

enum class Status : int {
  kOk = 0,
  kInvalidValue,   // misaligned size/address, unknown handle, bad range
  kOutOfMemory,    // no physical memory (or address space) left
  kNotMapped,      // unmap/set_access of a range that is not (wholly) mapped
  kAlreadyMapped,  // map over an existing mapping
  kBusy,           // address_free of a range still mapped
  kNotReady,       // event_query: recorded work not complete yet
  kNotSupported,   // the device or driver lacks the feature
  kDriverError,    // any other failure reported by the underlying driver
};
const char* StatusName(Status s);

using Handle = std::uint64_t;  // physical allocation; 0 is never valid
using Stream = std::uint64_t;  // 0 is the default stream
using Event = std::uint64_t;   // 0 is never valid

// X-macro: every driver entry point, in one list (counters, names, faults).
#define JAXLAKE_DRIVER_CALLS(X) \
  X(reserve)                    \
  X(address_free)               \
  X(create)                     \
  X(release)                    \
  X(map)                        \
  X(unmap)                      \
  X(set_access)                 \
  X(event_create)               \
  X(event_destroy)              \
  X(event_record)               \
  X(event_query)                \
  X(event_synchronize)

// The backend's side of each entry point, in the same order: the
// interface declares them pure virtual (JAXLAKE_VMM_BACKEND_CALLS(virtual,
// = 0)) and each backend class its overrides (JAXLAKE_VMM_BACKEND_CALLS(,
// override)), which it defines.
#define JAXLAKE_VMM_BACKEND_CALLS(BEFORE, AFTER)                           \
  BEFORE Status do_reserve(std::size_t size, std::uintptr_t* va) AFTER;    \
  BEFORE Status do_address_free(std::uintptr_t va, std::size_t size) AFTER; \
  BEFORE Status do_create(std::size_t size, Handle* handle) AFTER;         \
  BEFORE Status do_release(Handle handle) AFTER;                           \
  BEFORE Status do_map(std::uintptr_t va, std::size_t size,                \
                       std::size_t offset, Handle handle) AFTER;           \
  BEFORE Status do_unmap(std::uintptr_t va, std::size_t size) AFTER;       \
  BEFORE Status do_set_access(std::uintptr_t va, std::size_t size) AFTER;  \
  BEFORE Status do_event_create(Event* event) AFTER;                       \
  BEFORE Status do_event_destroy(Event event) AFTER;                       \
  BEFORE Status do_event_record(Event event, Stream stream) AFTER;         \
  BEFORE Status do_event_query(Event event) AFTER;                         \
  BEFORE Status do_event_synchronize(Event event) AFTER;

enum class Call : int {
#define JAXLAKE_X(name) name,
  JAXLAKE_DRIVER_CALLS(JAXLAKE_X)
#undef JAXLAKE_X
      kCount
};
inline constexpr int kNumCalls = static_cast<int>(Call::kCount);
const char* CallName(Call c);

using CallCounts = std::array<std::uint64_t, kNumCalls>;

class Driver {
 public:
  virtual ~Driver() = default;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  virtual const char* name() const = 0;
  // Allocation granularity in bytes (a power of two, 2 MiB on current GPUs).
  virtual std::size_t granularity() const = 0;
  // Physical memory of the device in bytes (the most create() can hand out).
  virtual std::size_t total_memory() const = 0;

  // The counted entry points. Each forwards to the do_* hook of the backend.
  Status reserve(std::size_t size, std::uintptr_t* va) {
    return Count(Call::reserve, do_reserve(size, va));
  }
  Status address_free(std::uintptr_t va, std::size_t size) {
    return Count(Call::address_free, do_address_free(va, size));
  }
  Status create(std::size_t size, Handle* handle) {
    return Count(Call::create, do_create(size, handle));
  }
  Status release(Handle handle) {
    return Count(Call::release, do_release(handle));
  }
  Status map(std::uintptr_t va, std::size_t size, std::size_t offset,
             Handle handle) {
    return Count(Call::map, do_map(va, size, offset, handle));
  }
  Status unmap(std::uintptr_t va, std::size_t size) {
    return Count(Call::unmap, do_unmap(va, size));
  }
  Status set_access(std::uintptr_t va, std::size_t size) {
    return Count(Call::set_access, do_set_access(va, size));
  }
  Status event_create(Event* event) {
    return Count(Call::event_create, do_event_create(event));
  }
  Status event_destroy(Event event) {
    return Count(Call::event_destroy, do_event_destroy(event));
  }
  Status event_record(Event event, Stream stream) {
    return Count(Call::event_record, do_event_record(event, stream));
  }
  // kOk when the work recorded before the event is complete, else kNotReady.
  Status event_query(Event event) {
    return Count(Call::event_query, do_event_query(event));
  }
  // Blocks the calling thread until the event completes.
  Status event_synchronize(Event event) {
    return Count(Call::event_synchronize, do_event_synchronize(event));
  }

  // Calls made so far (successful or not), by kind.
  CallCounts calls() const {
    CallCounts out{};
    for (int i = 0; i < kNumCalls; ++i)
      out[i] = calls_[i].load(std::memory_order_relaxed);
    return out;
  }
  std::uint64_t calls(Call c) const {
    return calls_[static_cast<int>(c)].load(std::memory_order_relaxed);
  }

 protected:
  Driver() = default;

  JAXLAKE_VMM_BACKEND_CALLS(virtual, = 0)

 private:
  Status Count(Call c, Status s) {
    calls_[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  std::array<std::atomic<std::uint64_t>, kNumCalls> calls_{};
};

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_DRIVER_H_
