// jaxlake: backends by name.
#ifndef JAXLAKE_VMM_MAKE_DRIVER_H_
#define JAXLAKE_VMM_MAKE_DRIVER_H_

#include <memory>
#include <string>
#include <vector>

#include "cc/vmm/sim_driver.h"

namespace jaxlake::vmm {

// The backend names this build knows ("host", "sim").
std::vector<std::string> BackendNames();

// A new driver for `backend`, or nullptr with *error saying what was wrong
// (an unknown name lists the valid ones; a granularity that is not a power
// of two multiple of the page size, or a device size below one granule, is
// named with its value).
std::unique_ptr<Driver> MakeDriver(const std::string& backend,
                                   const SimOptions& options,
                                   std::string* error);

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_MAKE_DRIVER_H_
