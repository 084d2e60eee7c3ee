// Helpers of the replay tests (trace_test.cc, replay_test.cc,
// peers_test.cc, policy_conformance_test.cc): a trace from its text, a
// policy by name, options with a capacity, an allocation that must
// succeed, the count of one driver call and one policy counter.
#ifndef JAXLAKE_TESTS_CC_POLICY_UTIL_H_
#define JAXLAKE_TESTS_CC_POLICY_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cc/replay/policy.h"
#include "cc/replay/trace.h"
#include "tests/cc/check.h"

namespace jaxlake::replay::testing {

// A trace header of one device, with a nested "meta".
inline const std::string kTraceHeader =
    "{\"format\": \"jaxlake-trace\", \"version\": 1, \"name\": \"t\", "
    "\"devices\": 1, \"source\": \"test\", \"meta\": {\"a\": [1, {\"b\": "
    "null}]}}\n";

// The trace of `header` and the JSON lines `body`.
inline Trace Jsonl(const std::string& body, bool lenient = false,
                   const std::string& header = kTraceHeader) {
  const std::string text = header + body;
  return ParseTrace(text.data(), text.size(), false, lenient);
}

// The trace of an RMM memory-event CSV.
inline Trace Csv(const std::string& text, bool lenient = false) {
  return ParseTrace(text.data(), text.size(), true, lenient);
}

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

// The policy's counter `name` (a failed check when it has none).
inline std::uint64_t Counter(const Policy& p, const std::string& name) {
  for (const auto& [n, v] : p.counters())
    if (n == name) return v;
  CHECK(false);
  return 0;
}

}  // namespace jaxlake::replay::testing

#endif  // JAXLAKE_TESTS_CC_POLICY_UTIL_H_
