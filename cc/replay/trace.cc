// jaxlake: the trace parser and writers. See trace.h and docs/traces.md.
#include "cc/replay/trace.h"
#include "cc/replay/trace_line.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

namespace jaxlake::replay {

namespace {

const char* const kKindNames[] = {
    "",
#define JAXLAKE_X(name) #name,
    JAXLAKE_TRACE_KINDS(JAXLAKE_X)
#undef JAXLAKE_X
};
constexpr int kNumKinds = sizeof(kKindNames) / sizeof(kKindNames[0]);

int KindByName(const char* s, std::size_t n) {
  for (int i = 1; i < kNumKinds; ++i)
    if (std::strlen(kKindNames[i]) == n &&
        std::memcmp(kKindNames[i], s, n) == 0)
      return i;
  return -1;
}

std::string KindList() {
  std::string out;
  for (int i = 1; i < kNumKinds; ++i)
    out += std::string(i > 1 ? ", " : "") + kKindNames[i];
  return out;
}

// Thrown inside one line's parse; caught per line.
struct LineError {
  std::string reason;
};

[[noreturn]] void Fail(std::string reason) { throw LineError{std::move(reason)}; }

// -- a small JSON reader for one line ----------------------------------------

class Json {
 public:
  Json(const char* begin, const char* end) : begin_(begin), p_(begin), end_(end) {}

  void Ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\r')) ++p_;
  }
  bool AtEnd() {
    Ws();
    return p_ == end_;
  }
  char Peek() { return p_ < end_ ? *p_ : '\0'; }
  void Expect(char c, const char* what) {
    Ws();
    if (p_ >= end_ || *p_ != c) Fail(Where() + "expected " + what);
    ++p_;
  }
  std::string Where() const {
    return "malformed JSON at column " + std::to_string(p_ - begin_ + 1) +
           (p_ >= end_ ? " (the line ends early)" : "") + ": ";
  }

  // A string; sets raw [s, s+n) to its bytes when it has no escapes, and
  // returns false when it has some (the caller then treats it as opaque).
  bool String(const char** s, std::size_t* n) {
    Ws();
    if (p_ >= end_ || *p_ != '"') Fail(Where() + "expected a string");
    ++p_;
    const char* start = p_;
    bool plain = true;
    while (true) {
      if (p_ >= end_) Fail(Where() + "unterminated string");
      const char c = *p_;
      if (c == '"') break;
      if (c == '\\') {
        plain = false;
        ++p_;
        if (p_ >= end_) Fail(Where() + "unterminated string");
      } else if (static_cast<unsigned char>(c) < 0x20) {
        Fail(Where() + "control character in a string");
      }
      ++p_;
    }
    *s = start;
    *n = static_cast<std::size_t>(p_ - start);
    ++p_;
    return plain;
  }

  // An integer field value. `what` names the field in messages.
  std::uint64_t Unsigned(const char* what) {
    Ws();
    bool negative = false;
    if (p_ < end_ && *p_ == '-') {
      negative = true;
      ++p_;
    }
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') {
      if (p_ < end_ && (*p_ == '"'))
        Fail(std::string("\"") + what + "\" must be an integer, got a string");
      if (p_ < end_ && (*p_ == 'n'))
        Fail(std::string("\"") + what + "\" must be an integer, got null");
      Fail(Where() + "expected an integer for \"" + what + "\"");
    }
    std::uint64_t v = 0;
    bool overflow = false;
    const char* digits = p_;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      const std::uint64_t d = static_cast<std::uint64_t>(*p_ - '0');
      if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10)
        overflow = true;
      v = v * 10 + d;
      ++p_;
    }
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E'))
      Fail(std::string("\"") + what + "\" must be an integer, got " +
           std::string(digits - negative, NumberEnd() - digits + negative));
    if (negative && v != 0)
      Fail(std::string("negative \"") + what + "\": -" +
           std::string(digits, p_ - digits));
    if (overflow || v > (std::uint64_t{1} << 63))
      Fail(std::string("\"") + what + "\" is too large: " +
           std::string(digits, p_ - digits));
    return v;
  }

  // Skips any JSON value (used for fields an event does not need).
  void Skip(int depth = 0) {
    if (depth > 64) Fail(Where() + "nested too deeply");
    Ws();
    const char c = Peek();
    if (c == '"') {
      const char* s;
      std::size_t n;
      String(&s, &n);
    } else if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++p_;
      Ws();
      if (Peek() == close) {
        ++p_;
        return;
      }
      while (true) {
        if (c == '{') {
          const char* s;
          std::size_t n;
          String(&s, &n);
          Expect(':', "':' after a key");
        }
        Skip(depth + 1);
        Ws();
        if (Peek() == ',') {
          ++p_;
          continue;
        }
        if (Peek() == close) {
          ++p_;
          return;
        }
        Fail(Where() + "expected ',' or '" + close + "'");
      }
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      p_ = NumberEnd();
    } else if (Word("true") || Word("false") || Word("null")) {
    } else {
      Fail(Where() + "expected a value");
    }
  }

  bool Word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (static_cast<std::size_t>(end_ - p_) >= n && std::memcmp(p_, w, n) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }

  // Visits each key of an object: fn(key, n) must consume the value.
  template <typename Fn>
  void Object(Fn&& fn) {
    Expect('{', "'{' (each line is one JSON object)");
    Ws();
    if (Peek() == '}') {
      ++p_;
      return;
    }
    while (true) {
      const char* key;
      std::size_t n;
      if (!String(&key, &n)) n = 0;  // an escaped key matches nothing
      Expect(':', "':' after a key");
      Ws();
      fn(key, n);
      Ws();
      if (Peek() == ',') {
        ++p_;
        continue;
      }
      if (Peek() == '}') {
        ++p_;
        return;
      }
      Fail(Where() + "expected ',' or '}'");
    }
  }

 private:
  const char* NumberEnd() const {
    const char* q = p_;
    while (q < end_ && (std::strchr("+-0123456789.eE", *q) != nullptr) &&
           *q != '\0')
      ++q;
    return q;
  }

  const char* begin_;
  const char* p_;
  const char* end_;
};

bool KeyIs(const char* key, std::size_t n, const char* name) {
  return std::strlen(name) == n && std::memcmp(key, name, n) == 0;
}

std::string Quote(const char* s, std::size_t n) {
  std::string v(s, n > 40 ? 40 : n);
  return "\"" + v + (n > 40 ? "...\"" : "\"");
}

// -- the parser state shared by both formats ---------------------------------

struct Live {
  std::uint32_t slot;
  std::uint32_t line;
  std::uint64_t size;
};

class Builder {
 public:
  Builder(Trace* trace, bool lenient) : trace_(trace), lenient_(lenient) {}

  // Records a problem on `line`; returns false when parsing must stop.
  bool Problem(std::uint32_t line, std::string reason) {
    if (!lenient_) {
      trace_->error = {line, std::move(reason)};
      return false;
    }
    ++trace_->skipped_count;
    if (trace_->skipped.size() < kMaxSkippedKept)
      trace_->skipped.push_back({line, std::move(reason)});
    return true;
  }

  // Problem() for a line that failed to parse; `complete` is false for the
  // last line of a file that ends inside it.
  bool LineProblem(std::uint32_t line, bool complete,
                   const std::string& reason) {
    if (!complete)
      return Problem(line, "truncated line (the file ends inside it): " +
                               reason);
    return Problem(line, reason);
  }

  // Adds an event after the semantic checks; throws LineError on a problem.
  // has_t: whether the line gave a time; free_size: 0 when not given.
  void Add(TraceFileEvent e, bool has_t) {
    if (e.dev >= trace_->devices)
      Fail("\"dev\" " + std::to_string(e.dev) + " is not below devices=" +
           std::to_string(trace_->devices) + " (from the header)");
    if (!has_t) {
      e.t = last_t_;
    } else if (e.t < last_t_) {
      Fail("\"t\" " + std::to_string(e.t) +
           " goes back in time (the previous event has t=" +
           std::to_string(last_t_) + ")");
    }
    if (live_.size() <= e.dev) live_.resize(e.dev + 1);
    auto& live = live_[e.dev];
    if (e.alloc) {
      if (e.size == 0) Fail("\"size\" must be positive, got 0");
      auto [it, fresh] = live.try_emplace(e.id, Live{0, e.line, e.size});
      if (!fresh)
        Fail("second allocation of id " + std::to_string(e.id) +
             " on device " + std::to_string(e.dev) +
             ", which is live since line " + std::to_string(it->second.line));
      std::uint32_t slot;
      if (!free_slots_.empty()) {
        slot = free_slots_.back();
        free_slots_.pop_back();
      } else {
        slot = trace_->slots++;
      }
      it->second.slot = slot;
      e.slot = slot;
    } else {
      auto it = live.find(e.id);
      if (it == live.end())
        Fail("free of id " + std::to_string(e.id) + " on device " +
             std::to_string(e.dev) +
             ", which is not live (never allocated, or already freed)");
      e.slot = it->second.slot;
      e.size = it->second.size;
      free_slots_.push_back(it->second.slot);
      live.erase(it);
    }
    last_t_ = e.t;
    trace_->events.push_back(e);
  }

 private:
  Trace* trace_;
  bool lenient_;
  std::uint64_t last_t_ = 0;
  std::vector<std::unordered_map<std::uint64_t, Live>> live_;
  std::vector<std::uint32_t> free_slots_;
};

// Splits data into lines; fn(line_number, begin, end, complete) returns
// false to stop. `complete`: the line ended with a newline.
template <typename Fn>
void Lines(const char* data, std::size_t size, Fn&& fn) {
  const char* p = data;
  const char* end = data + size;
  std::uint32_t n = 0;
  while (p < end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
    const bool complete = nl != nullptr;
    const char* stop = complete ? nl : end;
    ++n;
    if (!fn(n, p, stop, complete)) return;
    p = complete ? nl + 1 : end;
  }
}

bool Blank(const char* b, const char* e) {
  for (; b < e; ++b)
    if (*b != ' ' && *b != '\t' && *b != '\r') return false;
  return true;
}

// -- JSON lines -------------------------------------------------------------

void ParseHeader(const char* b, const char* e, Trace* trace) {
  Json j(b, e);
  bool has_format = false;
  bool has_version = false;
  bool looks_like_event = false;
  std::string format;
  std::uint64_t version = 0;
  std::uint64_t devices = 1;
  j.Object([&](const char* key, std::size_t n) {
    if (KeyIs(key, n, "format")) {
      const char* s;
      std::size_t len;
      if (j.Peek() != '"') Fail("the header's \"format\" must be a string");
      j.String(&s, &len);
      format.assign(s, len);
      has_format = true;
    } else if (KeyIs(key, n, "version")) {
      version = j.Unsigned("version");
      has_version = true;
    } else if (KeyIs(key, n, "devices")) {
      devices = j.Unsigned("devices");
    } else {
      if (KeyIs(key, n, "op")) looks_like_event = true;
      j.Skip();
    }
  });
  if (!j.AtEnd()) Fail(j.Where() + "characters after the object");
  if (!has_format) {
    Fail(std::string("missing header: the first line must be "
                     "{\"format\": \"jaxlake-trace\", \"version\": 1, ...}") +
         (looks_like_event ? " (it is an event)" : ""));
  }
  if (format != "jaxlake-trace")
    Fail("not a jaxlake trace: the header's format is \"" + format +
         "\", expected \"jaxlake-trace\"");
  if (!has_version) Fail("the header has no \"version\"");
  if (version != 1)
    Fail("trace version " + std::to_string(version) +
         " is not supported (this jaxlake reads version 1)");
  if (devices < 1 || devices > 1u << 16)
    Fail("the header's \"devices\" must be between 1 and 65536, got " +
         std::to_string(devices));
  trace->devices = static_cast<std::uint32_t>(devices);
  trace->header.assign(b, e);
}

void ParseEvent(const char* b, const char* e, std::uint32_t line,
                Builder* builder) {
  Json j(b, e);
  TraceFileEvent ev;
  ev.line = line;
  int op = -1;  // 1 alloc, 0 free
  bool has_id = false, has_size = false, has_t = false;
  j.Object([&](const char* key, std::size_t n) {
    if (KeyIs(key, n, "t")) {
      ev.t = j.Unsigned("t");
      has_t = true;
    } else if (KeyIs(key, n, "op")) {
      const char* s;
      std::size_t len;
      if (j.Peek() != '"') Fail("\"op\" must be the string \"alloc\" or \"free\"");
      j.String(&s, &len);
      if (KeyIs(s, len, "alloc")) {
        op = 1;
      } else if (KeyIs(s, len, "free")) {
        op = 0;
      } else {
        Fail("unknown \"op\" " + Quote(s, len) +
             ": expected \"alloc\" or \"free\"");
      }
    } else if (KeyIs(key, n, "id")) {
      ev.id = j.Unsigned("id");
      has_id = true;
    } else if (KeyIs(key, n, "dev")) {
      const std::uint64_t d = j.Unsigned("dev");
      if (d > 1u << 16) Fail("\"dev\" " + std::to_string(d) + " is too large");
      ev.dev = static_cast<std::uint32_t>(d);
    } else if (KeyIs(key, n, "size")) {
      ev.size = j.Unsigned("size");
      has_size = true;
    } else if (KeyIs(key, n, "stream")) {
      ev.stream = j.Unsigned("stream");
    } else if (KeyIs(key, n, "kind")) {
      if (j.Word("null")) return;
      const char* s;
      std::size_t len;
      if (j.Peek() != '"') Fail("\"kind\" must be a string");
      j.String(&s, &len);
      const int k = KindByName(s, len);
      if (k < 0)
        Fail("unknown \"kind\" " + Quote(s, len) + ": expected one of " +
             KindList());
      ev.kind = static_cast<std::uint8_t>(k);
    } else {
      j.Skip();  // fields of later minor revisions
    }
  });
  if (!j.AtEnd()) Fail(j.Where() + "characters after the object");
  if (op < 0) Fail("event without \"op\"");
  if (!has_id) Fail("event without \"id\"");
  ev.alloc = op == 1;
  if (ev.alloc && !has_size) Fail("alloc without \"size\"");
  builder->Add(ev, has_t);
}

void ParseJsonl(const char* data, std::size_t size, Trace* trace,
                Builder* builder) {
  bool have_header = false;
  Lines(data, size, [&](std::uint32_t n, const char* b, const char* e,
                        bool complete) {
    trace->lines = n;
    if (Blank(b, e)) return true;
    try {
      if (!have_header) {
        try {
          ParseHeader(b, e, trace);
        } catch (const LineError& err) {
          // A bad header is fatal in both modes.
          trace->error = {n, (!complete ? "truncated header line: " : "") +
                                 err.reason};
          trace->error_fatal = true;
          return false;
        }
        trace->header_line = n;
        have_header = true;
        return true;
      }
      ParseEvent(b, e, n, builder);
    } catch (const LineError& err) {
      return builder->LineProblem(n, complete, err.reason);
    }
    return true;
  });
  if (trace->ok() && !have_header) {
    trace->error = {1, "empty trace: no header line"};
    trace->error_fatal = true;
  }
}

// -- RMM CSV -----------------------------------------------------------------

enum Column { kThread, kTime, kAction, kPointer, kSize, kStream, kNumColumns };
const char* const kColumnNames[] = {"thread", "time", "action",
                                    "pointer", "size", "stream"};

void Split(const char* b, const char* e,
           std::vector<std::pair<const char*, const char*>>* out) {
  out->clear();
  const char* start = b;
  for (const char* p = b;; ++p) {
    if (p == e || *p == ',') {
      const char* fb = start;
      const char* fe = p;
      while (fb < fe && (*fb == ' ' || *fb == '\t')) ++fb;
      while (fe > fb && (fe[-1] == ' ' || fe[-1] == '\t' || fe[-1] == '\r'))
        --fe;
      out->emplace_back(fb, fe);
      if (p == e) break;
      start = p + 1;
    }
  }
}

bool EqualsNoCase(const char* b, const char* e, const char* word) {
  const std::size_t n = std::strlen(word);
  if (static_cast<std::size_t>(e - b) != n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    char c = b[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != word[i]) return false;
  }
  return true;
}

std::uint64_t CsvInt(const char* b, const char* e, const char* what,
                     bool hex_ok) {
  std::string text(b, e);
  if (b == e) Fail(std::string(what) + " is empty");
  if (*b == '-')
    Fail(std::string("negative ") + what + ": " + text);
  int base = 10;
  if (hex_ok && e - b > 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X')) {
    base = 16;
    b += 2;
  }
  std::uint64_t v = 0;
  for (const char* p = b; p < e; ++p) {
    int d;
    if (*p >= '0' && *p <= '9') {
      d = *p - '0';
    } else if (base == 16 && *p >= 'a' && *p <= 'f') {
      d = *p - 'a' + 10;
    } else if (base == 16 && *p >= 'A' && *p <= 'F') {
      d = *p - 'A' + 10;
    } else {
      Fail(std::string(what) + " is not " +
           (hex_ok ? "an integer (decimal or 0x hex)" : "a decimal integer") +
           ": " + text);
    }
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / base)
      Fail(std::string(what) + " is too large: " + text);
    v = v * base + d;
  }
  return v;
}

// Seconds as "S", "S.fffffffff" or "HH:MM:SS.ffffff" -> nanoseconds.
std::uint64_t CsvTime(const char* b, const char* e) {
  const std::string text(b, e);
  std::uint64_t whole = 0;
  const char* p = b;
  std::uint64_t part = 0;
  bool any = false;
  for (; p < e && *p != '.'; ++p) {
    if (*p == ':') {
      whole = (whole + part) * 60;
      part = 0;
      continue;
    }
    if (*p < '0' || *p > '9')
      Fail("Time is not a number of seconds: " + text);
    part = part * 10 + static_cast<std::uint64_t>(*p - '0');
    any = true;
    if (part > (std::uint64_t{1} << 40)) Fail("Time is too large: " + text);
  }
  whole += part;
  std::uint64_t frac = 0;
  int digits = 0;
  if (p < e) {
    for (++p; p < e; ++p) {
      if (*p < '0' || *p > '9')
        Fail("Time is not a number of seconds: " + text);
      any = true;
      if (digits < 9) {
        frac = frac * 10 + static_cast<std::uint64_t>(*p - '0');
        ++digits;
      }
    }
  }
  if (!any) Fail("Time is empty");
  for (; digits < 9; ++digits) frac *= 10;
  return whole * 1000000000ull + frac;
}

void ParseCsv(const char* data, std::size_t size, Trace* trace,
              Builder* builder) {
  int col[kNumColumns];
  for (int& c : col) c = -1;
  std::size_t ncols = 0;
  bool have_header = false;
  std::uint64_t last_t = 0;
  std::vector<std::pair<const char*, const char*>> f;
  Lines(data, size, [&](std::uint32_t n, const char* b, const char* e,
                        bool complete) {
    trace->lines = n;
    if (Blank(b, e)) return true;
    Split(b, e, &f);
    if (!have_header) {
      for (std::size_t i = 0; i < f.size(); ++i)
        for (int c = 0; c < kNumColumns; ++c)
          if (EqualsNoCase(f[i].first, f[i].second, kColumnNames[c]))
            col[c] = static_cast<int>(i);
      if (col[kAction] < 0 || col[kPointer] < 0 || col[kSize] < 0) {
        trace->error = {n, "not an RMM memory-event CSV: the header must "
                           "name the columns Thread,Time,Action,Pointer,"
                           "Size,Stream (Action, Pointer and Size at least)"};
        trace->error_fatal = true;
        return false;
      }
      ncols = f.size();
      have_header = true;
      return true;
    }
    try {
      if (f.size() < ncols)
        Fail("expected " + std::to_string(ncols) + " comma-separated fields, "
             "got " + std::to_string(f.size()));
      if (f.size() > ncols)
        Fail("expected " + std::to_string(ncols) + " comma-separated fields, "
             "got " + std::to_string(f.size()));
      const auto& action = f[col[kAction]];
      TraceFileEvent ev;
      ev.line = n;
      if (EqualsNoCase(action.first, action.second, "allocate")) {
        ev.alloc = true;
      } else if (EqualsNoCase(action.first, action.second, "free") ||
                 EqualsNoCase(action.first, action.second, "deallocate")) {
        ev.alloc = false;
      } else if (EqualsNoCase(action.first, action.second,
                              "allocate failure") ||
                 EqualsNoCase(action.first, action.second,
                              "allocate_failure")) {
        ++trace->ignored;  // RMM logs a failed request; nothing happened
        return true;
      } else {
        Fail("unknown Action \"" + std::string(action.first, action.second) +
             "\": expected allocate, free or deallocate");
      }
      ev.id = CsvInt(f[col[kPointer]].first, f[col[kPointer]].second,
                     "Pointer", true);
      const std::uint64_t sz =
          CsvInt(f[col[kSize]].first, f[col[kSize]].second, "Size", false);
      if (ev.alloc) ev.size = sz;
      if (col[kStream] >= 0)
        ev.stream = CsvInt(f[col[kStream]].first, f[col[kStream]].second,
                           "Stream", true);
      bool has_t = false;
      if (col[kTime] >= 0) {
        // Times of several threads may interleave slightly out of order:
        // the file order is kept and the time clamped to be non-decreasing.
        const std::uint64_t t =
            CsvTime(f[col[kTime]].first, f[col[kTime]].second);
        ev.t = t < last_t ? last_t : t;
        has_t = true;
      }
      builder->Add(ev, has_t);
      last_t = trace->events.back().t;
    } catch (const LineError& err) {
      return builder->LineProblem(n, complete, err.reason);
    }
    return true;
  });
  if (trace->ok() && !have_header) {
    trace->error = {1, "empty trace: no CSV header line"};
    trace->error_fatal = true;
  }
}

void AppendU64(std::string* out, std::uint64_t v) {
  char buf[24];
  const int n = std::snprintf(buf, sizeof buf, "%llu",
                              static_cast<unsigned long long>(v));
  out->append(buf, n);
}

void AppendHex(std::string* out, std::uint64_t v) {
  char buf[24];
  const int n = std::snprintf(buf, sizeof buf, "0x%llx",
                              static_cast<unsigned long long>(v));
  out->append(buf, n);
}

}  // namespace

const char* KindName(std::uint8_t kind) {
  return kind < kNumKinds ? kKindNames[kind] : "";
}

Trace ParseTrace(const char* data, std::size_t size, bool csv, bool lenient) {
  Trace trace;
  // A NUL marks where a cut compressed stream ended (see tracefile.py).
  bool damaged = false;
  if (size > 0 && data[size - 1] == '\0') {
    damaged = true;
    --size;
  }
  Builder builder(&trace, lenient);
  if (csv) {
    ParseCsv(data, size, &trace, &builder);
  } else {
    ParseJsonl(data, size, &trace, &builder);
  }
  if (trace.ok() && damaged) {
    // The rest of the file is missing. Its last line was already reported
    // when it did not parse; otherwise report the cut on that line.
    const bool reported =
        !trace.skipped.empty() && trace.skipped.back().line == trace.lines;
    if (!reported)
      builder.Problem(trace.lines,
                      "truncated file (the compressed stream ends early, "
                      "after this line)");
  }
  return trace;
}

std::string WriteJsonl(const Trace& trace, const std::string& header) {
  std::string out;
  out.reserve(header.size() + 1 + trace.events.size() * 72);
  out += header;
  out += '\n';
  for (const TraceFileEvent& e : trace.events) {
    AppendTraceLine(&out, TraceLine{e.t, e.id, e.dev, e.size, e.stream,
                                    e.alloc, false, KindName(e.kind)});
  }
  return out;
}

bool WriteCsv(const Trace& trace, std::string* out, std::string* error) {
  out->clear();
  out->reserve(48 + trace.events.size() * 56);
  *out += "Thread,Time,Action,Pointer,Size,Stream\n";
  char time[40];
  for (const TraceFileEvent& e : trace.events) {
    if (e.dev != 0) {
      *error = "line " + std::to_string(e.line) + ": an event on device " +
               std::to_string(e.dev) +
               ": RMM's CSV has no device column, so only single-device "
               "traces convert";
      out->clear();
      return false;
    }
    std::snprintf(time, sizeof time, "0,%llu.%09llu,",
                  static_cast<unsigned long long>(e.t / 1000000000ull),
                  static_cast<unsigned long long>(e.t % 1000000000ull));
    *out += time;
    *out += e.alloc ? "allocate," : "free,";
    AppendHex(out, e.id);
    *out += ',';
    AppendU64(out, e.size);
    *out += ',';
    AppendHex(out, e.stream);
    *out += '\n';
  }
  return true;
}

}  // namespace jaxlake::replay
