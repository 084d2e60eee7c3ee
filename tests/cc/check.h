// jaxlake: a tiny self-contained test framework (C++17, header only).
//
//   TEST(name) { ... }         defines and registers a test
//   CHECK(cond)                records a failure and goes on
//   CHECK_EQ(a, b), CHECK_NE   same, printing both values
//   REQUIRE(cond), REQUIRE_EQ  records a failure and returns from the
//                              enclosing (void) function
//   int main(int argc, char** argv) {
//     return jaxlake::check::RunAll(argc, argv);
//   }
//
// RunAll runs every registered test in registration order (or those whose
// name contains one of the command-line arguments; --list prints the names),
// reports each failed check as file:line with the expression and values, and
// ends with one line "N passed, M failed". It returns nonzero when a test
// failed or when the arguments matched no test. Checks may be made from
// any thread. Values print through operator<< when one is found (also by
// argument-dependent lookup), enums as their integer value.
#ifndef JAXLAKE_TESTS_CC_CHECK_H_
#define JAXLAKE_TESTS_CC_CHECK_H_

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace jaxlake::check {

using TestFn = void (*)();

struct TestCase {
  const char* name;
  TestFn fn;
};

inline std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

inline bool Register(const char* name, TestFn fn) {
  Registry().push_back(TestCase{name, fn});
  return true;
}

// Failed checks in the running test.
inline std::atomic<int> g_failures{0};
inline std::mutex g_print_mu;

inline void Fail(const char* file, int line, const std::string& what) {
  g_failures.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_print_mu);
  std::fprintf(stderr, "%s:%d: %s\n", file, line, what.c_str());
  std::fflush(stderr);
}

template <typename T, typename = void>
struct IsStreamable : std::false_type {};
template <typename T>
struct IsStreamable<T, std::void_t<decltype(std::declval<std::ostream&>()
                                            << std::declval<const T&>())>>
    : std::true_type {};

template <typename T>
std::string Describe(const T& value) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, bool>) {
    os << (value ? "true" : "false");
  } else if constexpr (std::is_same_v<T, char> ||
                       std::is_same_v<T, signed char> ||
                       std::is_same_v<T, unsigned char>) {
    os << static_cast<int>(value);
  } else if constexpr (IsStreamable<T>::value) {
    os << value;
  } else if constexpr (std::is_enum_v<T>) {
    os << static_cast<long long>(
        static_cast<std::underlying_type_t<T>>(value));
  } else {
    os << "<unprintable>";
  }
  return os.str();
}

// a == b, without sign-compare surprises between integers.
template <typename A, typename B>
bool Equal(const A& a, const B& b) {
  if constexpr (std::is_integral_v<A> && std::is_integral_v<B> &&
                !std::is_same_v<A, bool> && !std::is_same_v<B, bool> &&
                std::is_signed_v<A> != std::is_signed_v<B>) {
    if constexpr (std::is_signed_v<A>) {
      return a >= 0 && static_cast<std::make_unsigned_t<A>>(a) == b;
    } else {
      return b >= 0 && a == static_cast<std::make_unsigned_t<B>>(b);
    }
  } else {
    return a == b;
  }
}

template <typename A, typename B>
bool CheckEq(bool want_equal, const A& a, const B& b, const char* op,
             const char* a_text, const char* b_text, const char* file,
             int line) {
  if (Equal(a, b) == want_equal) return true;
  Fail(file, line,
       std::string(op) + "(" + a_text + ", " + b_text + ") failed: " +
           Describe(a) + (want_equal ? " != " : " == ") + Describe(b));
  return false;
}

inline bool Selected(const char* name, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const std::string& s : only)
    if (std::strstr(name, s.c_str()) != nullptr) return true;
  return false;
}

inline int RunAll(int argc, char** argv) {
  std::vector<std::string> only;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      list = true;
    } else {
      only.emplace_back(argv[i]);
    }
  }
  int passed = 0;
  int failed = 0;
  for (const TestCase& t : Registry()) {
    if (!Selected(t.name, only)) continue;
    if (list) {
      std::printf("%s\n", t.name);
      continue;
    }
    g_failures.store(0);
    const auto start = std::chrono::steady_clock::now();
    t.fn();
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    const bool ok = g_failures.load() == 0;
    (ok ? passed : failed) += 1;
    std::printf("%s %s (%.1f ms)\n", ok ? "ok  " : "FAIL", t.name, ms);
    std::fflush(stdout);
  }
  if (list) return 0;
  std::printf("%d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return (failed != 0 || passed == 0) ? 1 : 0;
}

}  // namespace jaxlake::check

#define TEST(name)                                                         \
  static void check_test_##name();                                         \
  [[maybe_unused]] static const bool check_registered_##name =             \
      ::jaxlake::check::Register(#name, &check_test_##name);               \
  static void check_test_##name()

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond))                                                           \
      ::jaxlake::check::Fail(__FILE__, __LINE__,                           \
                             "CHECK(" #cond ") failed");                   \
  } while (0)

#define CHECK_EQ(a, b)                                                     \
  ((void)::jaxlake::check::CheckEq(true, (a), (b), "CHECK_EQ", #a, #b,     \
                                   __FILE__, __LINE__))

#define CHECK_NE(a, b)                                                     \
  ((void)::jaxlake::check::CheckEq(false, (a), (b), "CHECK_NE", #a, #b,    \
                                   __FILE__, __LINE__))

#define REQUIRE(cond)                                                      \
  do {                                                                     \
    if (!(cond)) {                                                         \
      ::jaxlake::check::Fail(__FILE__, __LINE__,                           \
                             "REQUIRE(" #cond ") failed");                 \
      return;                                                              \
    }                                                                      \
  } while (0)

#define REQUIRE_EQ(a, b)                                                   \
  do {                                                                     \
    if (!::jaxlake::check::CheckEq(true, (a), (b), "REQUIRE_EQ", #a, #b,   \
                                   __FILE__, __LINE__))                    \
      return;                                                              \
  } while (0)

#endif  // JAXLAKE_TESTS_CC_CHECK_H_
