// jaxlake shim: settings read from the environment (see options.h).
#include "cc/shim/options.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cc/shim/json.h"

namespace jaxlake::shim {
namespace {

// Calls f(name, &LakeOptions::name) for each lake option (options.inc), in
// its order; the variable of an option is JAXLAKE_<NAME>.
template <typename F>
void ForEachLakeOption(F&& f) {
#define JAXLAKE_LAKE_OPTION(type, field, default_value, help) \
  f(#field, &LakeOptions::field);
#include "cc/lake/options.inc"
#undef JAXLAKE_LAKE_OPTION
}

std::string EnvName(const char* name) {
  std::string env = "JAXLAKE_";
  for (const char* p = name; *p != '\0'; ++p)
    env += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  return env;
}

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

// A lake option's value from the environment, parsed by its type.
std::string ReadLakeOption(const std::string& env, std::size_t* out) {
  const char* v = Env(env.c_str());
  if (v == nullptr || ParseSize(v, out)) return {};
  return Malformed(env.c_str(), v, "a number of bytes (decimal digits)");
}
std::string ReadLakeOption(const std::string& env, bool* out) {
  const char* v = Env(env.c_str());
  if (v == nullptr || ParseBool(v, out)) return {};
  return Malformed(env.c_str(), v, "0 or 1");
}

std::string JsonValue(std::size_t v) { return std::to_string(v); }
std::string JsonValue(bool v) { return JsonBool(v); }

}  // namespace

std::string ReadOptions(ShimOptions* out) {
  ShimOptions o;
  // With a fraction, JAXLAKE_CAPACITY is not read (the Python side keeps
  // the fraction there as text for a child process's own configure()).
  const bool fraction = Env("JAXLAKE_CAPACITY_FRACTION") != nullptr;
  std::string error;
  ForEachLakeOption([&](const char* name, auto field) {
    if (!error.empty() || (fraction && std::strcmp(name, "capacity") == 0))
      return;
    error = ReadLakeOption(EnvName(name), &(o.lake.*field));
  });
  if (!error.empty()) return error;
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
  ForEachLakeOption([&](const char* name, auto field) {
    out += JsonString(name) + ": " + JsonValue(o.lake.*field) + ", ";
  });
  out += "\"hooks\": " + std::string(JsonBool(o.hooks)) +
         ", \"peer_access\": " + JsonBool(o.peer_access) +
         ", \"capacity_fraction\": " + std::to_string(o.capacity_fraction) +
         ", \"xla_fraction\": " + std::to_string(o.xla_fraction) +
         ", \"trace_flush\": " + std::to_string(o.trace_flush) +
         ", \"trace_file\": " + JsonString(o.trace_file) +
         ", \"exit_report\": " + JsonBool(o.exit_report) + "}";
  return out;
}

double CapacityFraction(const ShimOptions& o) {
  if (o.capacity_fraction > 0.0) return o.capacity_fraction;
  if (o.lake.capacity != 0) return 0.0;
  if (o.xla_fraction > 0.0) return o.xla_fraction;
  return o.lake.preallocate ? kXlaDefaultFraction : 1.0;
}

}  // namespace jaxlake::shim
