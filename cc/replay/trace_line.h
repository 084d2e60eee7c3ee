// jaxlake: one event line of the JSON-lines trace format (docs/traces.md).
// The one place the format's event lines are written: the replay's writer
// (WriteJsonl), the shim's trace (cc/shim/trace.cc) and, through the
// bindings, jaxlake.TraceWriter all call AppendTraceLine. Header-only, so
// the shim uses it without linking the replay engine.
#ifndef JAXLAKE_CC_REPLAY_TRACE_LINE_H_
#define JAXLAKE_CC_REPLAY_TRACE_LINE_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace jaxlake {

struct TraceLine {
  std::uint64_t t = 0;
  std::uint64_t id = 0;
  std::uint64_t dev = 0;
  std::uint64_t size = 0;       // an allocation's requested bytes
  std::uint64_t stream = 0;
  bool alloc = false;
  bool free_size = false;       // a free carries its allocation's size too
  const char* kind = nullptr;   // an allocation's kind, or none
};

// Appends `e` as one line, with its newline:
//   {"t":T,"op":"alloc","id":I,"dev":D,"size":S,"stream":S[,"kind":"K"]}
//   {"t":T,"op":"free","id":I,"dev":D[,"size":S],"stream":S}
inline void AppendTraceLine(std::string* out, const TraceLine& e) {
  const auto u64 = [out](std::uint64_t v) {
    char buf[24];
    const int n = std::snprintf(buf, sizeof buf, "%llu",
                                static_cast<unsigned long long>(v));
    out->append(buf, static_cast<std::size_t>(n));
  };
  *out += "{\"t\":";
  u64(e.t);
  *out += e.alloc ? ",\"op\":\"alloc\",\"id\":" : ",\"op\":\"free\",\"id\":";
  u64(e.id);
  *out += ",\"dev\":";
  u64(e.dev);
  if (e.alloc || e.free_size) {
    *out += ",\"size\":";
    u64(e.size);
  }
  *out += ",\"stream\":";
  u64(e.stream);
  if (e.alloc && e.kind != nullptr && *e.kind != '\0') {
    *out += ",\"kind\":\"";
    *out += e.kind;
    *out += '"';
  }
  *out += "}\n";
}

}  // namespace jaxlake

#endif  // JAXLAKE_CC_REPLAY_TRACE_LINE_H_
