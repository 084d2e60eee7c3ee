// jaxlake shim: the little JSON writing the C API and the trace need.
#ifndef JAXLAKE_SHIM_JSON_H_
#define JAXLAKE_SHIM_JSON_H_

#include <cstdio>
#include <string>

namespace jaxlake::shim {

// `s` as a JSON string literal, quotes included.
inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

inline const char* JsonBool(bool b) { return b ? "true" : "false"; }

}  // namespace jaxlake::shim

#endif  // JAXLAKE_SHIM_JSON_H_
