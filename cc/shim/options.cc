// jaxlake shim: settings read from the environment (see options.h).
#include "cc/shim/options.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cc/shim/json.h"

namespace jaxlake::shim {
namespace {

struct SizeOption {
  const char* name;  // the LakeOptions field; the variable is JAXLAKE_<NAME>
  const char* env;
  std::size_t LakeOptions::*field;
};
struct BoolOption {
  const char* name;
  const char* env;
  bool LakeOptions::*field;
};

constexpr SizeOption kSizes[] = {
    {"capacity", "JAXLAKE_CAPACITY", &LakeOptions::capacity},
    {"small_limit", "JAXLAKE_SMALL_LIMIT", &LakeOptions::small_limit},
    {"small_slab", "JAXLAKE_SMALL_SLAB", &LakeOptions::small_slab},
    {"alignment", "JAXLAKE_ALIGNMENT", &LakeOptions::alignment},
    {"stitch_min", "JAXLAKE_STITCH_MIN", &LakeOptions::stitch_min},
    {"max_pieces", "JAXLAKE_MAX_PIECES", &LakeOptions::max_pieces},
    {"stitch_cache", "JAXLAKE_STITCH_CACHE", &LakeOptions::stitch_cache},
    {"grow_min", "JAXLAKE_GROW_MIN", &LakeOptions::grow_min},
};
constexpr BoolOption kBools[] = {
    {"stitch", "JAXLAKE_STITCH", &LakeOptions::stitch},
    {"stitch_grow", "JAXLAKE_STITCH_GROW", &LakeOptions::stitch_grow},
    {"preallocate", "JAXLAKE_PREALLOCATE", &LakeOptions::preallocate},
    {"record_trace", "JAXLAKE_RECORD_TRACE", &LakeOptions::record_trace},
};

// The variable's value, or nullptr when unset or empty.
const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

bool ParseSize(const char* text, std::size_t* out) {
  for (const char* p = text; *p != '\0'; ++p)
    if (*p < '0' || *p > '9') return false;
  errno = 0;
  const unsigned long long v = std::strtoull(text, nullptr, 10);
  if (errno == ERANGE) return false;
  *out = static_cast<std::size_t>(v);
  return true;
}

bool ParseBool(const char* text, bool* out) {
  if (std::strcmp(text, "0") == 0) {
    *out = false;
  } else if (std::strcmp(text, "1") == 0) {
    *out = true;
  } else {
    return false;
  }
  return true;
}

std::string Malformed(const char* env, const char* value, const char* what) {
  return std::string(env) + "='" + value + "' is not " + what;
}

}  // namespace

std::string ReadOptions(ShimOptions* out) {
  ShimOptions o;
  // With a fraction, JAXLAKE_CAPACITY is not read (the Python side keeps
  // the fraction there as text for a child process's own configure()).
  const bool fraction = Env("JAXLAKE_CAPACITY_FRACTION") != nullptr;
  for (const SizeOption& s : kSizes) {
    if (fraction && s.field == &LakeOptions::capacity) continue;
    if (const char* v = Env(s.env)) {
      if (!ParseSize(v, &(o.lake.*s.field)))
        return Malformed(s.env, v, "a number of bytes (decimal digits)");
    }
  }
  for (const BoolOption& b : kBools) {
    if (const char* v = Env(b.env)) {
      if (!ParseBool(v, &(o.lake.*b.field)))
        return Malformed(b.env, v, "0 or 1");
    }
  }
  if (const char* v = Env("JAXLAKE_SHIM_HOOKS")) {
    if (!ParseBool(v, &o.hooks))
      return Malformed("JAXLAKE_SHIM_HOOKS", v, "0 or 1");
  }
  if (const char* v = Env("JAXLAKE_SHIM_PEER_ACCESS")) {
    if (!ParseBool(v, &o.peer_access))
      return Malformed("JAXLAKE_SHIM_PEER_ACCESS", v, "0 or 1");
  }
  if (const char* v = Env("JAXLAKE_CAPACITY_FRACTION")) {
    char* end = nullptr;
    errno = 0;
    const double f = std::strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(f > 0.0 && f <= 1.0))
      return Malformed("JAXLAKE_CAPACITY_FRACTION", v,
                       "a decimal fraction in (0, 1]");
    o.capacity_fraction = f;
  }
  // XLA's fraction: XLA_CLIENT_MEM_FRACTION, else its deprecated spelling;
  // jaxlib refuses the two together, and so does the shim.
  const char* xla_new = Env("XLA_CLIENT_MEM_FRACTION");
  const char* xla_old = Env("XLA_PYTHON_CLIENT_MEM_FRACTION");
  if (xla_new != nullptr && xla_old != nullptr)
    return std::string("XLA_CLIENT_MEM_FRACTION and "
                       "XLA_PYTHON_CLIENT_MEM_FRACTION are both set: set "
                       "only XLA_CLIENT_MEM_FRACTION (jaxlib refuses both)");
  if (const char* v = xla_new != nullptr ? xla_new : xla_old) {
    const char* name = xla_new != nullptr ? "XLA_CLIENT_MEM_FRACTION"
                                          : "XLA_PYTHON_CLIENT_MEM_FRACTION";
    char* end = nullptr;
    errno = 0;
    const double f = std::strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(f > 0.0 && f <= 1.0))
      return Malformed(name, v, "a decimal fraction in (0, 1]");
    o.xla_fraction = f;
  }
  if (const char* v = Env("JAXLAKE_TRACE_FLUSH")) {
    if (!ParseSize(v, &o.trace_flush) || o.trace_flush == 0)
      return Malformed("JAXLAKE_TRACE_FLUSH", v, "a positive count");
  }
  if (const char* v = Env("JAXLAKE_TRACE_FILE")) o.trace_file = v;
  if (const char* v = Env("JAXLAKE_EXIT_REPORT")) {
    if (!ParseBool(v, &o.exit_report))
      return Malformed("JAXLAKE_EXIT_REPORT", v, "0 or 1");
  }
  *out = o;
  return {};
}

std::string OptionsJson(const ShimOptions& o) {
  std::string out = "{";
  for (const SizeOption& s : kSizes)
    out += JsonString(s.name) + ": " + std::to_string(o.lake.*s.field) + ", ";
  for (const BoolOption& b : kBools)
    out += JsonString(b.name) + ": " + JsonBool(o.lake.*b.field) + ", ";
  out += "\"hooks\": " + std::string(JsonBool(o.hooks)) +
         ", \"peer_access\": " + JsonBool(o.peer_access) +
         ", \"capacity_fraction\": " + std::to_string(o.capacity_fraction) +
         ", \"xla_fraction\": " + std::to_string(o.xla_fraction) +
         ", \"trace_flush\": " + std::to_string(o.trace_flush) +
         ", \"trace_file\": " + JsonString(o.trace_file) +
         ", \"exit_report\": " + JsonBool(o.exit_report) + "}";
  return out;
}

}  // namespace jaxlake::shim
