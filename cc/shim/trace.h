// jaxlake shim: writing the allocation trace of the served calls.
//
// The file is JSON lines, version 1 of docs/traces.md: a header line
// (source "shim") and one event per allocation or free the lakes served.
// `t` is nanoseconds since the trace started, `id` numbers allocations made
// while tracing (frees of allocations made before the start are left out),
// `dev` is the device ordinal and `stream` the stream the lake saw (0: the
// legacy default stream, 2: a per-thread default stream, else the CUstream
// handle's value).
//
// The header's meta holds "outside_pool_bytes": the peak of the device
// memory the program took outside the lakes through the shim since the
// trace started (OutsideLedger, lakes.h). Known only as the program runs,
// it is written as null padded to 20 characters and overwritten in place
// at every flush with the peak so far (a file the writer cannot seek in,
// a FIFO say, keeps null).
//
// The file is flushed every `flush_every` events (set_flush_every, from
// JAXLAKE_TRACE_FLUSH) and by Flush(), so a process that dies keeps all but
// its last few events. The shim calls Finish() at process exit.
//
// A path ending in ".gz" (any case) gets gzip, as the Python writers write
// it: the text goes to PATH.part, which Stop() (and so Finish(), at exit)
// compresses into PATH with zlib, loaded at run time (libz.so.1), and then
// removes. Writing plain text first keeps the header's figure writable in
// place, and a process that dies leaves its events readable in PATH.part.
// If zlib cannot be loaded or the compression fails, PATH.part stays and
// the shim says so on stderr.
#ifndef JAXLAKE_SHIM_TRACE_H_
#define JAXLAKE_SHIM_TRACE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cc/replay/trace_line.h"

namespace jaxlake::shim {

class TraceWriter {
 public:
  TraceWriter() = default;
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Starts a trace in `path` (truncated), stopping any running one first.
  // The header is written with the first event (or at the stop), when
  // `devices` can tell the number of devices for it: the driver may not be
  // initialised yet when the trace starts. Returns 0, or -errno when the
  // file cannot be opened.
  int Start(const std::string& path, const std::string& name,
            std::function<int()> devices,
            std::function<std::uint64_t()> outside_peak = nullptr);
  // Stops the trace and closes the file. Returns the events written, or -1
  // when no trace was running.
  long long Stop();

  bool active() const { return active_.load(std::memory_order_acquire); }
  std::string path() const;
  // Events between two flushes (at least 1).
  void set_flush_every(std::size_t n);
  // Writes the header (if not yet) and whatever is buffered to the file.
  void Flush();
  // At process exit: stops a gzip trace (compressing it), flushes a plain
  // one (which stays open for the events of the exit itself). Nothing in a
  // forked child: the trace is its parent's.
  void Finish();
  // fork() handlers (pthread_atfork): before the fork the buffered events
  // reach the file and the writer is locked; after it the parent goes on,
  // and the child closes its copy of the file unwritten and traces nothing
  // (so no event is written twice, and a .gz trace is compressed once, by
  // its owner).
  void BeforeFork();
  void AfterForkInParent();
  void AfterForkInChild();

  void Alloc(int device, std::uintptr_t ptr, std::size_t size,
             std::uint64_t stream);
  void Free(int device, std::uintptr_t ptr, std::uint64_t stream);

 private:
  struct Live {
    std::uint64_t id;
    std::size_t size;
  };
  std::uint64_t Now() const;
  long long StopLocked();
  void HeaderLocked();
  // Writes one event line (cc/replay/trace_line.h, the format's one
  // writer), flushing every flush_every_ events.
  void WriteLineLocked(const TraceLine& line);
  // Flushes the file and writes the outside peak into the header.
  void FlushLocked();

  mutable std::mutex mu_;
  std::atomic<bool> active_{false};
  std::FILE* file_ = nullptr;
  std::string path_;
  std::string line_;       // the event line being written (kept: no
                           // allocation per event)
  std::string gzip_path_;  // the .gz file to compress into at the stop
  long owner_pid_ = 0;     // the process that started the trace
  std::string name_;
  std::function<int()> devices_;
  std::function<std::uint64_t()> outside_peak_;
  long outside_at_ = -1;  // the file offset of the header's figure
  bool header_written_ = false;
  std::chrono::steady_clock::time_point start_;
  std::uint64_t last_t_ = 0;
  std::uint64_t next_id_ = 0;
  long long events_ = 0;
  std::size_t flush_every_ = 64;
  std::unordered_map<std::uintptr_t, Live> live_;
};

}  // namespace jaxlake::shim

#endif  // JAXLAKE_SHIM_TRACE_H_
