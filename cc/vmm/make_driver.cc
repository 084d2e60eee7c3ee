// jaxlake: backends by name.
#include "cc/vmm/make_driver.h"

#include <unistd.h>

#include "cc/vmm/host_driver.h"

namespace jaxlake::vmm {
namespace {

std::size_t PageSize() {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<std::size_t>(page) : 4096;
}

// An empty string when the options are usable, else what is wrong.
std::string CheckOptions(const SimOptions& o) {
  const std::size_t page = PageSize();
  const std::size_t g = o.granularity;
  if (g == 0 || (g & (g - 1)) != 0 || g % page != 0) {
    return "granularity " + std::to_string(g) +
           " must be a power of two and a multiple of the page size (" +
           std::to_string(page) + ")";
  }
  if (o.device_bytes < g) {
    return "device_bytes " + std::to_string(o.device_bytes) +
           " must be at least one granule (" + std::to_string(g) + ")";
  }
  return {};
}

}  // namespace

std::vector<std::string> BackendNames() { return {"host", "sim"}; }

std::unique_ptr<Driver> MakeDriver(const std::string& backend,
                                   const SimOptions& options,
                                   std::string* error) {
  std::string why;
  std::unique_ptr<Driver> driver;
  if (backend != "host" && backend != "sim") {
    why = "unknown backend '" + backend + "': expected one of ";
    const std::vector<std::string> names = BackendNames();
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (i != 0) why += ", ";
      why += names[i];
    }
  } else {
    why = CheckOptions(options);
  }
  if (why.empty()) {
    if (backend == "host") {
      driver = std::make_unique<HostDriver>(options);
    } else {
      driver = std::make_unique<SimDriver>(options);
    }
  }
  if (error != nullptr) *error = why;
  return driver;
}

}  // namespace jaxlake::vmm
