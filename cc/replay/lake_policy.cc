// jaxlake: the "jaxlake" policy, the real lake over the simulated driver.
//
// Nothing here is a model: allocations go through jaxlake::Lake with its
// default options (those of the option table) and the driver calls it
// makes are the sim driver's counted calls, charged by the same latency
// model as the baselines' calls. The sim driver's own bookkeeping (maps of
// mappings, a mutex) is part of the timed calls; the modelled driver time
// is reported apart, never waited for.
#include <memory>
#include <string>

#include "cc/lake/lake.h"
#include "cc/replay/policy.h"
#include "cc/vmm/sim_driver.h"

namespace jaxlake::replay {

namespace {

class LakePolicy final : public Policy {
 public:
  LakePolicy(const vmm::SimOptions& sim, const LakeOptions& options)
      : driver_(sim), lake_(driver_, options) {}

  const char* name() const override { return "jaxlake"; }

  bool allocate(std::size_t nbytes, std::uint64_t stream,
                std::uintptr_t* address) override {
    const vmm::Status s = lake_.allocate(nbytes, stream, address);
    if (s == vmm::Status::kOk) return true;
    if (s != vmm::Status::kOutOfMemory && error_.empty())
      error_ = std::string("allocate failed with ") + vmm::StatusName(s) +
               ": " + lake_.last_error();
    return false;
  }

  void free(std::uintptr_t address, std::uint64_t stream) override {
    const vmm::Status s = lake_.free(address, stream);
    if (s != vmm::Status::kOk && error_.empty())
      error_ = std::string("free failed with ") + vmm::StatusName(s);
  }

  std::size_t reserved() const override { return driver_.physical_bytes(); }
  vmm::CallCounts calls() const override { return driver_.calls(); }
  vmm::CallTimes driver_us() const override { return driver_.driver_us(); }

  Counters counters() const override {
    const Stats s = lake_.stats();
    return {
        {"stitches", s.alloc_stitch + s.alloc_stitch_grow},
        {"stitched_bytes", s.stitched_bytes_total},
        {"stitch_reuses", s.alloc_stitch_reuse},
        {"reclaims", s.reclaims},
        {"stitch_pieces", s.stitch_pieces},
        {"stitch_evictions", s.stitch_evictions},
        {"segments_released", s.segments_released},
        {"alloc_small", s.alloc_small},
        {"alloc_fit", s.alloc_fit},
        {"alloc_split", s.alloc_split},
        {"alloc_grow", s.alloc_grow},
        {"event_waits", s.event_waits},
    };
  }

  std::string check() const override {
    if (!error_.empty()) return error_;
    return lake_.check();
  }

 private:
  vmm::SimDriver driver_;
  Lake lake_;
  std::string error_;
};

}  // namespace

bool LakePolicySetup(const PolicyOptions& o, vmm::SimOptions* sim,
                     LakeOptions* lake, std::string* error) {
  sim->granularity = o.granularity;
  sim->device_bytes = o.capacity / o.granularity * o.granularity;
  sim->latency = o.latency;
  *lake = o.lake;
  lake->capacity = sim->device_bytes;
  vmm::SimDriver probe(*sim);
  const std::string problem = ValidateOptions(*lake, probe);
  if (!problem.empty()) {
    *error = "jaxlake: " + problem;
    return false;
  }
  return true;
}

std::unique_ptr<Policy> MakeLakePolicy(const PolicyOptions& o,
                                       std::string* error) {
  vmm::SimOptions sim;
  LakeOptions lake;
  if (!LakePolicySetup(o, &sim, &lake, error)) return nullptr;
  return std::make_unique<LakePolicy>(sim, lake);
}

}  // namespace jaxlake::replay
