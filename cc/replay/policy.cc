// jaxlake: the policy table.
#include "cc/replay/policy.h"

namespace jaxlake::replay {

std::vector<std::string> PolicyNames() {
  return {"jaxlake", "bfc", "torch", "torch-expandable", "gmlake",
          "xla-vmm",  "bfc-growth"};
}

std::unique_ptr<Policy> MakePolicy(const std::string& name,
                                   const PolicyOptions& options,
                                   std::string* error) {
  if (options.granularity == 0 ||
      (options.granularity & (options.granularity - 1)) != 0) {
    *error = "granularity " + std::to_string(options.granularity) +
             " is not a power of two";
    return nullptr;
  }
  if (options.capacity < options.granularity) {
    *error = "capacity " + std::to_string(options.capacity) +
             " is below one granule (" + std::to_string(options.granularity) +
             " bytes)";
    return nullptr;
  }
  if (name == "jaxlake") return MakeLakePolicy(options, error);
  if (name == "bfc") return MakeBfcPolicy(options);
  if (name == "torch") return MakeTorchPolicy(options);
  if (name == "torch-expandable") return MakeExpandablePolicy(options);
  if (name == "gmlake") return MakeGmlakePolicy(options);
  if (name == "xla-vmm") return MakeXlaVmmPolicy(options);
  if (name == "bfc-growth") return MakeBfcGrowthPolicy(options);
  std::string known;
  for (const std::string& n : PolicyNames())
    known += (known.empty() ? "" : ", ") + n;
  *error = "unknown policy '" + name + "': expected one of " + known;
  return nullptr;
}

}  // namespace jaxlake::replay
