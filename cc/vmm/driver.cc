// jaxlake: names of statuses and driver calls.
#include "cc/vmm/driver.h"

namespace jaxlake::vmm {

const char* StatusName(Status s) {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kInvalidValue:
      return "invalid_value";
    case Status::kOutOfMemory:
      return "out_of_memory";
    case Status::kNotMapped:
      return "not_mapped";
    case Status::kAlreadyMapped:
      return "already_mapped";
    case Status::kBusy:
      return "busy";
    case Status::kNotReady:
      return "not_ready";
    case Status::kNotSupported:
      return "not_supported";
    case Status::kDriverError:
      return "driver_error";
  }
  return "unknown_status";
}

const char* CallName(Call c) {
  switch (c) {
#define JAXLAKE_X(name) \
  case Call::name:      \
    return #name;
    JAXLAKE_DRIVER_CALLS(JAXLAKE_X)
#undef JAXLAKE_X
    case Call::kCount:
      break;
  }
  return "unknown_call";
}

}  // namespace jaxlake::vmm
