// jaxlake: the host driver.
//
// Real stitching of host memory: a physical handle is a memfd, a reservation
// is a PROT_NONE anonymous mapping, map() is mmap(MAP_FIXED|MAP_SHARED) of the
// memfd and set_access() is mprotect(PROT_READ|PROT_WRITE). One handle mapped
// at two addresses shows the same bytes at both; touching a mapping before
// set_access() faults, as on the GPU. All rule checks, streams and events
// come from SimDriver.
#ifndef JAXLAKE_VMM_HOST_DRIVER_H_
#define JAXLAKE_VMM_HOST_DRIVER_H_

#include <memory>

#include "cc/vmm/sim_driver.h"

namespace jaxlake::vmm {

// Defaults: 2 MiB granularity, 4 GiB of "device" memory (only what is
// touched is ever committed).
SimOptions HostDefaults();

class HostDriver : public SimDriver {
 public:
  explicit HostDriver(const SimOptions& options = HostDefaults());
  ~HostDriver() override;
  const char* name() const override { return "host"; }

 protected:
  Status os_reserve(std::size_t size, std::uintptr_t* va) override;
  Status os_address_free(std::uintptr_t va, std::size_t size) override;
  Status os_create(std::size_t size, Handle handle) override;
  void os_release_memory(Handle handle) override;
  Status os_map(std::uintptr_t va, std::size_t size, std::size_t offset,
                Handle handle) override;
  Status os_unmap(std::uintptr_t va, std::size_t size) override;
  Status os_set_access(std::uintptr_t va, std::size_t size) override;

 private:
  void os_release_handle(Handle handle) override;  // closes the memfd

  struct Fds;
  std::unique_ptr<Fds> fds_;
};

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_HOST_DRIVER_H_
