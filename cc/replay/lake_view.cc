// jaxlake: the replay behind `jaxlake view`. See lake_view.h.
#include "cc/replay/lake_view.h"

#include <algorithm>
#include <memory>

#include "cc/vmm/sim_driver.h"

namespace jaxlake::replay {

namespace {

bool IsStitch(AllocState s) {
  return s == AllocState::stitch || s == AllocState::stitch_grow;
}

bool ByStitchedRange(AllocState s) {
  return IsStitch(s) || s == AllocState::stitch_reuse;
}

}  // namespace

LakeViewResult ReplayLakeView(const Trace& trace, const PolicyOptions& policy,
                              const LakeViewOptions& options) {
  LakeViewResult r;
  const std::vector<TraceFileEvent>& events = trace.events;
  r.served.assign(events.size(), kNotServed);
  vmm::SimOptions sim;
  LakeOptions lake_options;
  if (!LakePolicySetup(policy, &sim, &lake_options, &r.error)) return r;
  vmm::SimDriver driver(sim);
  auto lake = std::make_unique<Lake>(driver, lake_options);

  std::vector<std::uint64_t> asked = options.snapshot_events;
  std::sort(asked.begin(), asked.end());
  asked.erase(std::unique(asked.begin(), asked.end()), asked.end());
  auto next_asked = asked.begin();

  std::vector<std::uintptr_t> address(trace.slots, 0);
  std::vector<std::uint64_t> alloc_event(trace.slots, 0);
  std::vector<std::uint8_t> valid(trace.slots, 0);

  auto take = [&](std::uint64_t event, std::uint8_t why) {
    LakeViewSnapshot s;
    s.event = event;
    s.why = why;
    s.layout = lake->snapshot();
    for (std::uint32_t slot = 0; slot < trace.slots; ++slot)
      if (valid[slot]) s.live.emplace_back(address[slot], alloc_event[slot]);
    return s;
  };

  // Stitch snapshots, thinned to the budget: keep stitch number k when
  // k % stride == 0.
  std::vector<std::pair<std::uint64_t, LakeViewSnapshot>> stitched;
  std::uint64_t stride = 1;
  std::vector<LakeViewSnapshot> regular;

  for (std::size_t i = 0; i < events.size(); ++i) {
    const TraceFileEvent& e = events[i];
    if (e.dev != options.device) continue;
    std::uint8_t why = 0;
    while (next_asked != asked.end() && *next_asked < i) ++next_asked;
    if (next_asked != asked.end() && *next_asked == i) why |= kSnapshotAsked;
    if (e.alloc) {
      std::uintptr_t a = 0;
      AllocState state = AllocState::small;
      const vmm::Status s = lake->allocate(e.size, e.stream, &a, &state);
      if (s == vmm::Status::kOutOfMemory) {
        r.oom = true;
        r.oom_event = i;
        regular.push_back(
            take(i, static_cast<std::uint8_t>(why | kSnapshotOom)));
        break;
      }
      if (s != vmm::Status::kOk) {
        r.error = std::string("allocate failed with ") + vmm::StatusName(s) +
                  " at event " + std::to_string(i) + " (line " +
                  std::to_string(e.line) + "): " + lake->last_error();
        break;
      }
      r.served[i] = static_cast<std::uint8_t>(state);
      address[e.slot] = a;
      alloc_event[e.slot] = i;
      valid[e.slot] = 1;
      if (IsStitch(state)) ++r.stitches;
      if (ByStitchedRange(state)) {
        const std::uint64_t k = r.stitched_allocs++;
        if (options.stitch_snapshots > 0 && k % stride == 0) {
          stitched.emplace_back(k, take(i, static_cast<std::uint8_t>(
                                              why | kSnapshotStitch)));
          why = 0;  // taken
          if (stitched.size() > options.stitch_snapshots) {
            stride *= 2;
            std::vector<std::pair<std::uint64_t, LakeViewSnapshot>> kept;
            for (auto& p : stitched)
              if (p.first % stride == 0) kept.push_back(std::move(p));
            // A dropped snapshot that was also asked for stays.
            for (auto& p : stitched)
              if (p.first % stride != 0 && (p.second.why & kSnapshotAsked)) {
                p.second.why = kSnapshotAsked;
                regular.push_back(std::move(p.second));
              }
            stitched = std::move(kept);
          }
        }
      }
    } else {
      if (!valid[e.slot]) continue;  // cannot happen: the parser checked
      const vmm::Status s = lake->free(address[e.slot], e.stream);
      if (s != vmm::Status::kOk) {
        r.error = std::string("free failed with ") + vmm::StatusName(s) +
                  " at event " + std::to_string(i) + " (line " +
                  std::to_string(e.line) + ")";
        break;
      }
      valid[e.slot] = 0;
    }
    if (why != 0) regular.push_back(take(i, why));
  }
  r.snapshots = std::move(regular);
  for (auto& p : stitched) r.snapshots.push_back(std::move(p.second));
  std::sort(r.snapshots.begin(), r.snapshots.end(),
            [](const LakeViewSnapshot& a, const LakeViewSnapshot& b) {
              return a.event < b.event;
            });
  return r;
}

}  // namespace jaxlake::replay
