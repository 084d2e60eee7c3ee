// jaxlake: allocation traces in memory, and their parser and writers.
//
// The file formats are the contract of docs/traces.md: JSON lines with a
// versioned header, or RMM's memory-event CSV. The parser reads a whole
// (already decompressed) file from memory. It validates as it goes and
// gives every problem with its 1-based line number: a malformed or
// truncated line, a missing or mistyped field, a negative or zero size, a
// device out of range, a time that goes back, a second allocation of a
// live id, a free of an id that is not live. Strict mode stops at the
// first problem; lenient mode skips the line, records why and goes on.
//
// Each event also gets a dense `slot`: allocations take the lowest slot
// not live, and a free carries the slot of the allocation it frees. The
// replay engine keeps addresses in a vector indexed by slot, so it never
// hashes an id. Ids are live per device.
#ifndef JAXLAKE_REPLAY_TRACE_H_
#define JAXLAKE_REPLAY_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace jaxlake::replay {

// The kinds docs/traces.md allows on an allocation; 0 is "not given".
#define JAXLAKE_TRACE_KINDS(X) \
  X(param)                     \
  X(opt_state)                 \
  X(input)                     \
  X(output)                    \
  X(temp)                      \
  X(grad)                      \
  X(activation)                \
  X(other)

const char* KindName(std::uint8_t kind);  // "" for 0

// One event of a trace file (docs/traces.md), as the replay reads it; not
// the lake's own record of a call (jaxlake::TraceEvent, cc/lake/lake.h).
struct TraceFileEvent {
  std::uint64_t t = 0;
  std::uint64_t id = 0;
  std::uint64_t size = 0;    // requested bytes (a free: its allocation's)
  std::uint64_t stream = 0;
  std::uint32_t slot = 0;    // dense allocation index (see above)
  std::uint32_t line = 0;    // 1-based line in the file
  std::uint32_t dev = 0;
  bool alloc = false;
  std::uint8_t kind = 0;     // 1 + index in JAXLAKE_TRACE_KINDS, 0: none
};

struct TraceProblem {
  std::uint32_t line = 0;
  std::string reason;
};

struct Trace {
  std::string header;  // the JSON header line as written (empty for CSV)
  std::uint32_t header_line = 0;  // its line number
  std::uint32_t devices = 1;
  std::vector<TraceFileEvent> events;
  std::uint32_t slots = 0;      // slots used (the most allocations live)
  std::uint32_t lines = 0;      // lines read
  // The first problem that stopped the parse (empty reason when none): in
  // strict mode any problem, in lenient mode a fatal one. Fatal problems
  // (a bad or missing header, an empty file) stop both modes.
  TraceProblem error;
  bool error_fatal = false;
  // Lenient mode: the lines skipped, the first kMaxSkippedKept of them
  // kept with their reason, all of them counted.
  std::vector<TraceProblem> skipped;
  std::uint64_t skipped_count = 0;
  std::uint64_t ignored = 0;    // valid records with no event (RMM failures)

  bool ok() const { return error.reason.empty(); }
};

inline constexpr std::size_t kMaxSkippedKept = 1000;

// Parses a whole file. `csv` selects RMM's CSV, else JSON lines. A NUL
// byte marks where a damaged (cut) compressed stream ended: the line it is
// on counts as truncated.
Trace ParseTrace(const char* data, std::size_t size, bool csv, bool lenient);

// The events as JSON lines under `header` (a JSON object on one line,
// written as given), or as RMM's CSV (Time = t / 1e9 seconds with nine
// decimals, so t survives a round trip; Pointer = 0x + id in hex; frees
// carry their allocation's size). CSV has no device column: an event of a
// device other than 0 makes WriteCsv return false and set *error.
std::string WriteJsonl(const Trace& trace, const std::string& header);
bool WriteCsv(const Trace& trace, std::string* out, std::string* error);

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_TRACE_H_
