// Helpers of the replay tests (replay_test.cc, peers_test.cc): a policy by
// name, options with a capacity, an allocation that must succeed, and the
// count of one driver call.
#ifndef JAXLAKE_TESTS_CC_POLICY_UTIL_H_
#define JAXLAKE_TESTS_CC_POLICY_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cc/replay/policy.h"
#include "tests/cc/check.h"

namespace jaxlake::replay::testing {

inline std::unique_ptr<Policy> Make(const std::string& name,
                                    const PolicyOptions& o = {}) {
  std::string error;
  auto p = MakePolicy(name, o, &error);
  CHECK_EQ(error, std::string());
  return p;
}

inline PolicyOptions Cap(std::size_t capacity) {
  PolicyOptions o;
  o.capacity = capacity;
  return o;
}

inline std::uintptr_t Alloc(Policy& p, std::size_t n,
                            std::uint64_t stream = 0) {
  std::uintptr_t a = 0;
  CHECK(p.allocate(n, stream, &a));
  return a;
}

inline std::uint64_t Calls(const Policy& p, vmm::Call c) {
  return p.calls()[static_cast<int>(c)];
}

}  // namespace jaxlake::replay::testing

#endif  // JAXLAKE_TESTS_CC_POLICY_UTIL_H_
