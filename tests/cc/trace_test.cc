// Tests of the trace parser and writers (JSON lines and RMM's CSV): the
// events, the errors with their lines, lenient reading and round trips.
#include <cstring>
#include <string>
#include <vector>

#include "cc/replay/trace.h"
#include "tests/cc/check.h"
#include "tests/cc/policy_util.h"

namespace {

using namespace jaxlake::replay;           // NOLINT: the code under test
using namespace jaxlake::replay::testing;  // NOLINT: its test helpers
using jaxlake::vmm::Call;

// ---- the parser --------------------------------------------------------------

TEST(parse_valid_jsonl_assigns_slots_and_sizes) {
  const Trace t = Jsonl(
      "{\"t\": 0, \"op\": \"alloc\", \"id\": 7, \"dev\": 0, \"size\": 100, "
      "\"stream\": 0, \"kind\": \"temp\"}\n"
      "{\"t\": 1, \"op\": \"alloc\", \"id\": 8, \"size\": 50}\n"
      "\n"
      "{\"t\": 2, \"op\": \"free\", \"id\": 7, \"future_field\": [1, 2]}\n"
      "{\"t\": 2, \"op\": \"alloc\", \"id\": 7, \"size\": 30, \"kind\": null}\n"
      "{\"op\": \"free\", \"id\": 8, \"stream\": 3}");  // no final newline
  REQUIRE(t.ok());
  REQUIRE_EQ(t.events.size(), 5u);
  CHECK_EQ(t.devices, 1u);
  CHECK_EQ(t.slots, 2u);  // at most two live at once
  CHECK_EQ(t.events[0].slot, 0u);
  CHECK_EQ(t.events[1].slot, 1u);
  CHECK_EQ(t.events[2].slot, 0u);   // the free of id 7
  CHECK_EQ(t.events[2].size, 100u);  // a free carries its allocation's size
  CHECK_EQ(t.events[3].slot, 0u);   // slot 0 is taken again
  CHECK_EQ(t.events[2].line, 5u);   // the blank line counts
  CHECK_EQ(std::string(jaxlake::replay::KindName(t.events[0].kind)), "temp");
  CHECK_EQ(t.events[3].kind, 0);
  CHECK_EQ(t.events[5 - 1].t, 2u);  // missing t: the previous one
  CHECK_EQ(t.events[4].stream, 3u);
}

struct BadCase {
  std::string body;
  std::uint32_t line;
  const char* reason_part;
};

TEST(parse_reports_each_problem_with_its_line) {
  const std::string a = "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":64}\n";
  const BadCase cases[] = {
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":-5}\n", 2, "negative \"size\""},
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":0}\n", 2, "must be positive"},
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":1.5}\n", 2, "must be an integer"},
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1}\n", 2, "alloc without \"size\""},
      {"{\"t\":0,\"op\":\"free\",\"id\":9}\n", 2, "free of id 9 on device 0"},
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":5,\"dev\":1}\n", 2,
       "is not below devices=1"},
      {"{\"t\":0,\"op\":\"grow\",\"id\":1,\"size\":5}\n", 2, "unknown \"op\""},
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":5,\"kind\":\"x\"}\n", 2,
       "unknown \"kind\""},
      {"{\"t\":0,\"op\":\"alloc\" \"id\":1}\n", 2, "malformed JSON at column"},
      {"not json\n", 2, "malformed JSON at column 1"},
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":5}}\n", 2,
       "characters after the object"},
      {"{\"op\":\"alloc\",\"size\":5}\n", 2, "without \"id\""},
      {"{\"t\":5,\"op\":\"alloc\",\"id\":1,\"size\":5}\n"
       "{\"t\":4,\"op\":\"free\",\"id\":1}\n",
       3, "goes back in time"},
      {a + a, 3, "second allocation of id 1"},
      {"{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":64}\n{\"t\":1,\"op\":\"fr",
       3, "truncated line"},
  };
  for (const BadCase& c : cases) {
    const Trace t = Jsonl(c.body);
    CHECK(!t.ok());
    CHECK_EQ(t.error.line, c.line);
    if (t.error.reason.find(c.reason_part) == std::string::npos)
      CHECK_EQ(t.error.reason, std::string(c.reason_part));
  }
}

TEST(parse_second_allocation_names_the_first_line) {
  const Trace t = Jsonl(
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":64}\n"
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":64}\n");
  CHECK_EQ(t.error.line, 3u);
  CHECK(t.error.reason.find("live since line 2") != std::string::npos);
}

TEST(parse_header_problems_are_fatal_even_when_lenient) {
  const Trace none = Jsonl("", true, "");
  CHECK_EQ(none.error.reason, std::string("empty trace: no header line"));
  const Trace event =
      Jsonl("", true, "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":5}\n");
  CHECK_EQ(event.error.line, 1u);
  CHECK(event.error.reason.find("missing header") != std::string::npos);
  CHECK(event.error.reason.find("(it is an event)") != std::string::npos);
  const Trace version = Jsonl(
      "", true, "{\"format\":\"jaxlake-trace\",\"version\":2}\n");
  CHECK(version.error.reason.find("version 2 is not supported") !=
        std::string::npos);
  const Trace other =
      Jsonl("", true, "{\"format\":\"other\",\"version\":1}\n");
  CHECK(other.error.reason.find("not a jaxlake trace") != std::string::npos);
}

TEST(lenient_parse_skips_and_reports) {
  const Trace t = Jsonl(
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":64}\n"   // 2 ok
      "{\"t\":1,\"op\":\"alloc\",\"id\":2,\"size\":-1}\n"   // 3 negative
      "{\"t\":2,\"op\":\"free\",\"id\":2}\n"                // 4 unknown id
      "garbage\n"                                           // 5 malformed
      "{\"t\":3,\"op\":\"free\",\"id\":1}\n"                // 6 ok
      "{\"t\":4,\"op\":\"alloc\",\"id\":3,\"si",           // 7 truncated
      true);
  REQUIRE(t.ok());
  CHECK_EQ(t.events.size(), 2u);
  REQUIRE_EQ(t.skipped.size(), 4u);
  CHECK_EQ(t.skipped_count, 4u);
  CHECK_EQ(t.skipped[0].line, 3u);
  CHECK_EQ(t.skipped[1].line, 4u);
  CHECK_EQ(t.skipped[2].line, 5u);
  CHECK_EQ(t.skipped[3].line, 7u);
  CHECK(t.skipped[3].reason.find("truncated line") != std::string::npos);
}

TEST(parse_damaged_compressed_stream) {
  // A NUL at the end marks a cut gzip stream (tracefile.py).
  std::string text = kTraceHeader + "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":64}\n";
  text.push_back('\0');
  const Trace strict = ParseTrace(text.data(), text.size(), false, false);
  CHECK(!strict.ok());
  CHECK_EQ(strict.error.line, 2u);
  CHECK(strict.error.reason.find("truncated file") != std::string::npos);
  const Trace lenient = ParseTrace(text.data(), text.size(), false, true);
  CHECK(lenient.ok());
  CHECK_EQ(lenient.events.size(), 1u);
  CHECK_EQ(lenient.skipped_count, 1u);
}

TEST(parse_rmm_csv) {
  const Trace t = Csv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "140230,1634567890.000012,allocate,0x7f3a00000000,4194304,0x0\n"
      "140230,1634567890.000010,allocate,0x7f3a00400000,100,0x7f00\n"
      "140230,1634567890.5,allocate failure,0x0,999999999999,0x0\n"
      "140230,1634567891,deallocate,0x7f3a00000000,4194304,0x0\n"
      "140230,1634567892.25,free,0x7f3a00400000,100,0x7f00\n"
      "140230,14:32:05.5,allocate,0x7f3a00000000,8,0x0\n");
  REQUIRE(t.ok());
  REQUIRE_EQ(t.events.size(), 5u);
  CHECK_EQ(t.ignored, 1u);
  CHECK_EQ(t.events[0].id, 0x7f3a00000000ull);
  CHECK_EQ(t.events[0].size, 4194304u);
  CHECK_EQ(t.events[0].t, 1634567890000012000ull);
  CHECK_EQ(t.events[1].t, 1634567890000012000ull);  // clamped: no going back
  CHECK_EQ(t.events[1].stream, 0x7f00u);
  CHECK(!t.events[2].alloc);
  CHECK_EQ(t.events[3].t, 1634567892250000000ull);
  // HH:MM:SS.f times are seconds of the day; a pointer freed is new again.
  CHECK(t.events[4].alloc);
  CHECK_EQ(t.events[4].t, 1634567892250000000ull);

  const Trace bad = Csv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,allocate,0x10,-4,0x0\n");
  CHECK_EQ(bad.error.line, 2u);
  CHECK(bad.error.reason.find("negative Size") != std::string::npos);
  const Trace unknown = Csv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,free,0x10,4,0x0\n");
  CHECK(unknown.error.reason.find("free of id 16") != std::string::npos);
  const Trace action = Csv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,alloc,0x10,4,0x0\n");
  CHECK(action.error.reason.find("unknown Action") != std::string::npos);
  const Trace fields = Csv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0.1,allocate,0x10\n");
  CHECK(fields.error.reason.find("expected 6 comma-separated fields") !=
        std::string::npos);
  const Trace header = Csv("a,b,c\n");
  CHECK(header.error.reason.find("not an RMM memory-event CSV") !=
        std::string::npos);
}

TEST(writers_round_trip) {
  const Trace t = Jsonl(
      "{\"t\":5,\"op\":\"alloc\",\"id\":17,\"dev\":0,\"size\":4194304,"
      "\"stream\":2,\"kind\":\"grad\"}\n"
      "{\"t\":1000000001,\"op\":\"free\",\"id\":17,\"dev\":0,\"stream\":2}\n");
  REQUIRE(t.ok());
  const std::string header = kTraceHeader.substr(0, kTraceHeader.size() - 1);
  const std::string jsonl = jaxlake::replay::WriteJsonl(t, header);
  CHECK_EQ(jsonl, header +
                      "\n{\"t\":5,\"op\":\"alloc\",\"id\":17,\"dev\":0,"
                      "\"size\":4194304,\"stream\":2,\"kind\":\"grad\"}\n"
                      "{\"t\":1000000001,\"op\":\"free\",\"id\":17,\"dev\":0,"
                      "\"stream\":2}\n");
  std::string csv, error;
  REQUIRE(jaxlake::replay::WriteCsv(t, &csv, &error));
  CHECK_EQ(csv,
           std::string("Thread,Time,Action,Pointer,Size,Stream\n"
                       "0,0.000000005,allocate,0x11,4194304,0x2\n"
                       "0,1.000000001,free,0x11,4194304,0x2\n"));
  const Trace back = Csv(csv);
  REQUIRE(back.ok());
  REQUIRE_EQ(back.events.size(), 2u);
  CHECK_EQ(back.events[0].t, 5u);
  CHECK_EQ(back.events[1].t, 1000000001u);
  CHECK_EQ(back.events[0].id, 17u);
  CHECK_EQ(back.events[0].stream, 2u);
}

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
