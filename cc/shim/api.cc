// jaxlake shim: the C API for Python (see jaxlake_shim.h).
#include "cc/shim/jaxlake_shim.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "cc/shim/json.h"
#include "cc/shim/lakes.h"
#include "cc/shim/loader.h"
#include "cc/shim/trampolines.h"
#include "cc/stats/stats.h"

#ifndef JAXLAKE_SHIM_VERSION
#define JAXLAKE_SHIM_VERSION "unknown"
#endif

namespace jaxlake::shim {
namespace {

// snprintf-style copy (see jaxlake_shim.h).
std::size_t Copy(const std::string& s, char* buf, std::size_t size) {
  if (buf != nullptr && size > 0) {
    const std::size_t n = std::min(s.size(), size - 1);
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return s.size();
}

std::string StatsJson(int device, const Lake& lake) {
  const Stats s = lake.stats();
  std::string out = "{\"device\": " + std::to_string(device) +
                    ", \"capacity\": " + std::to_string(lake.capacity()) +
                    ", \"granularity\": " +
                    std::to_string(lake.granularity()) +
                    ", \"total_memory\": " +
                    std::to_string(lake.driver().total_memory()) + ", ";
  // Free physical memory the lake holds: all of it, and its largest run of
  // adjacent free chunks (what a request can get without a stitch).
  const LakeSnapshot snap = lake.snapshot();
  out += "\"free\": {\"bytes\": " +
         std::to_string(snap.free_chunks * snap.granularity) +
         ", \"largest_block\": " +
         std::to_string(snap.largest_free * snap.granularity) + "}, ";
  if (const DeviceCounter* c = Lakes::Get().device_counter(device)) {
    out += "\"allocations\": {\"served\": " + std::to_string(c->served.load()) +
           ", \"forwarded\": " + std::to_string(c->forwarded.load()) +
           ", \"captured\": " + std::to_string(c->captured.load()) + "}, ";
  }
  out += "\"gauges\": {";
  const char* sep = "";
#define JAXLAKE_X(name, doc)                                              \
  out += sep + JsonString(#name) + ": {\"current\": " +                   \
         std::to_string(s.name.current) +                                 \
         ", \"peak\": " + std::to_string(s.name.peak) + "}";              \
  sep = ", ";
  JAXLAKE_GAUGES(JAXLAKE_X)
#undef JAXLAKE_X
  out += "}, \"counters\": {";
  sep = "";
#define JAXLAKE_X(name, doc) \
  out += sep + JsonString(#name) + ": " + std::to_string(s.name); \
  sep = ", ";
  JAXLAKE_COUNTERS(JAXLAKE_X)
#undef JAXLAKE_X
  out += "}, \"driver_calls\": {";
  for (int i = 0; i < vmm::kNumCalls; ++i) {
    out += (i == 0 ? "" : ", ") +
           JsonString(vmm::CallName(static_cast<vmm::Call>(i))) + ": " +
           std::to_string(s.driver_calls[static_cast<std::size_t>(i)]);
  }
  return out + "}}";
}

std::string HooksJson(Lakes& lakes) {
  std::string out = "{";
  for (int i = 0; i < kNumHooks; ++i) {
    const auto h = static_cast<Hook>(i);
    const HookCounter& c = lakes.counter(h);
    out += (i == 0 ? "" : ", ") + JsonString(HookName(h)) +
           ": {\"calls\": " + std::to_string(c.calls.load()) +
           ", \"served\": " + std::to_string(c.served.load()) +
           ", \"forwarded\": " + std::to_string(c.forwarded.load()) +
           ", \"failed\": " + std::to_string(c.failed.load()) +
           ", \"captured\": " + std::to_string(c.captured.load()) +
           ", \"forwarded_bytes\": " +
           std::to_string(c.forwarded_bytes.load()) +
           ", \"pressure\": " + std::to_string(c.pressure.load()) +
           ", \"pressure_ok\": " + std::to_string(c.pressure_ok.load()) +
           ", \"pressure_bytes\": " +
           std::to_string(c.pressure_bytes.load()) + "}";
  }
  return out + "}";
}

std::string StatusJson(Lakes& lakes) {
  const RealDriver& real = Real();
  std::string devices;
  for (int d : lakes.Devices())
    devices += (devices.empty() ? "" : ", ") + std::to_string(d);
  const std::string trace_path = lakes.trace().path();
  return "{\"api_version\": " + std::to_string(JAXLAKE_SHIM_API_VERSION) +
         ", \"version\": " + JsonString(JAXLAKE_SHIM_VERSION) +
         ", \"active\": " + JsonBool(lakes.active()) +
         ", \"reason\": " + JsonString(lakes.reason()) +
         ", \"real_libcuda\": " + JsonString(real.path) +
         ", \"self\": " + JsonString(real.self) +
         ", \"forwarded_names\": " + std::to_string(kNumForwarded) +
         ", \"forwarded_found\": " + std::to_string(real.forwarded) +
         ", \"lakes\": [" + devices + "]" +
         ", \"options\": " + OptionsJson(lakes.options()) +
         ", \"outside_pool\": {\"current\": " +
         std::to_string(lakes.outside().current()) +
         ", \"peak\": " + std::to_string(lakes.outside().peak()) +
         ", \"allocations\": " +
         std::to_string(lakes.outside().allocations()) + "}" +
         ", \"trace\": {\"active\": " + JsonBool(!trace_path.empty()) +
         ", \"path\": " + JsonString(trace_path) + "}}";
}

}  // namespace
}  // namespace jaxlake::shim

using jaxlake::shim::Lakes;

// Every entry point catches whatever the C++ below may throw (only
// std::bad_alloc in practice) and answers as for "nothing".

int jaxlake_shim_api_version(void) { return JAXLAKE_SHIM_API_VERSION; }

const char* jaxlake_shim_version(void) { return JAXLAKE_SHIM_VERSION; }

int jaxlake_shim_active(void) {
  try {
    return Lakes::Get().active() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

size_t jaxlake_shim_reason(char* buf, size_t size) {
  try {
    return jaxlake::shim::Copy(Lakes::Get().reason(), buf, size);
  } catch (...) {
    return jaxlake::shim::Copy("", buf, size);
  }
}

void jaxlake_shim_disable(const char* reason) {
  try {
    Lakes::Get().Disable(reason != nullptr ? reason : "disabled");
  } catch (...) {
  }
}

int jaxlake_shim_num_lakes(void) {
  try {
    return static_cast<int>(Lakes::Get().Devices().size());
  } catch (...) {
    return 0;
  }
}

int jaxlake_shim_lake_devices(int* out, int max) {
  try {
    const std::vector<int> devices = Lakes::Get().Devices();
    for (int i = 0; out != nullptr && i < max &&
                    i < static_cast<int>(devices.size());
         ++i)
      out[i] = devices[static_cast<std::size_t>(i)];
    return static_cast<int>(devices.size());
  } catch (...) {
    return 0;
  }
}

int jaxlake_shim_open_lake(int device) {
  try {
    return Lakes::Get().LakeFor(device) != nullptr ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

size_t jaxlake_shim_exit_report(char* buf, size_t size) {
  try {
    return jaxlake::shim::Copy(Lakes::Get().ExitReport(), buf, size);
  } catch (...) {
    return jaxlake::shim::Copy("", buf, size);
  }
}

long long jaxlake_shim_stats_json(int device, char* buf, size_t size) {
  try {
    const jaxlake::Lake* lake = Lakes::Get().Existing(device);
    if (lake == nullptr) return -1;
    return static_cast<long long>(jaxlake::shim::Copy(
        jaxlake::shim::StatsJson(device, *lake), buf, size));
  } catch (...) {
    return -1;
  }
}

size_t jaxlake_shim_hooks_json(char* buf, size_t size) {
  try {
    return jaxlake::shim::Copy(jaxlake::shim::HooksJson(Lakes::Get()), buf,
                               size);
  } catch (...) {
    return jaxlake::shim::Copy("{}", buf, size);
  }
}

size_t jaxlake_shim_status_json(char* buf, size_t size) {
  try {
    return jaxlake::shim::Copy(jaxlake::shim::StatusJson(Lakes::Get()), buf,
                               size);
  } catch (...) {
    return jaxlake::shim::Copy("{}", buf, size);
  }
}

long long jaxlake_shim_empty_cache(int device) {
  try {
    Lakes& lakes = Lakes::Get();
    if (device == -1) {
      long long released = 0;
      for (int d : lakes.Devices())
        released += static_cast<long long>(lakes.Existing(d)->empty_cache());
      return released;
    }
    jaxlake::Lake* lake = lakes.Existing(device);
    return lake != nullptr ? static_cast<long long>(lake->empty_cache()) : -1;
  } catch (...) {
    return -1;
  }
}

size_t jaxlake_shim_check(int device, char* buf, size_t size) {
  try {
    Lakes& lakes = Lakes::Get();
    std::string problems;
    for (int d : lakes.Devices()) {
      if (device != -1 && d != device) continue;
      const std::string p = lakes.Existing(d)->check();
      if (!p.empty())
        problems += "device " + std::to_string(d) + ": " + p + "\n";
    }
    return jaxlake::shim::Copy(problems, buf, size);
  } catch (...) {
    return jaxlake::shim::Copy("the check could not run (out of memory)\n",
                               buf, size);
  }
}

int jaxlake_shim_trace_start(const char* path, const char* name) {
  if (path == nullptr) return -EINVAL;
  try {
    Lakes& lakes = Lakes::Get();
    return lakes.StartTrace(path, name != nullptr ? name : "shim");
  } catch (...) {
    return -ENOMEM;
  }
}

long long jaxlake_shim_trace_stop(void) {
  try {
    return Lakes::Get().trace().Stop();
  } catch (...) {
    return -1;
  }
}
