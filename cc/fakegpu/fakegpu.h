// The fake GPU (libjaxlake_fakegpu.so): NVIDIA's driver, NVML, CUDA runtime,
// cuDNN, cuBLAS(Lt), NCCL, cuFFT, cuSOLVER, cuSPARSE and CUPTI's version
// calls, each a subset of its public API, on host memory. `jaxlake run
// --fake-gpu` puts it where those libraries would be (cc/fakegpu/README.md),
// so that XLA's real GPU client runs, unmodified, on a machine with no GPU,
// over the shipped shim and lake. Kernels do not run; copies, memsets and
// host functions do, in stream order.
//
// This header is the state the libraries share: options, devices, memory
// ranges, streams and events, call counts and fault injection.
#ifndef JAXLAKE_FAKEGPU_FAKEGPU_H_
#define JAXLAKE_FAKEGPU_FAKEGPU_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cc/vmm/host_driver.h"

#define JAXLAKE_FAKEGPU_EXPORT \
  extern "C" __attribute__((visibility("default")))

// The first statement of an implemented entry point: counts the call and,
// when fault injection fails it, returns the injected error.
#define JAXLAKE_FAKEGPU_ENTER()                                              \
  do {                                                                       \
    int fault_code_ = 0;                                                     \
    if (::jaxlake::fakegpu::Enter(__func__, &fault_code_)) return fault_code_; \
  } while (0)

namespace jaxlake::fakegpu {

// What the options (environment variables, read once) choose.
struct Options {
  std::string model = "h100";  // JAXLAKE_FAKEGPU_MODEL: h100 or h200
  std::string name;            // the device name the model reports
  int count = 1;               // JAXLAKE_FAKEGPU_COUNT
  std::size_t memory = 0;      // JAXLAKE_FAKEGPU_MEMORY (bytes a device)
  int cuda_major = 12;         // JAXLAKE_FAKEGPU_CUDA: the runtime's major
  // JAXLAKE_FAKEGPU_DRIVER_VERSION: what cuDriverGetVersion reports.
  int driver_version = 13000;
  // JAXLAKE_FAKEGPU_NO_VMM=ORDINAL,...: devices without virtual memory
  // management (and without peer access to any other device).
  std::vector<int> no_vmm;
  int sms = 132;
  int clock_khz = 1980000;
  int memory_clock_khz = 2619000;
  int bus_width = 5120;
  // JAXLAKE_FAKEGPU_FAIL=NAME:N[:CODE],...: the Nth call of entry point NAME
  // fails with CODE (default: CUDA_ERROR_OUT_OF_MEMORY).
  struct Fault {
    std::uint64_t nth;
    int code;
  };
  std::map<std::string, Fault> faults;
  // JAXLAKE_FAKEGPU_LOG: where unsupported entry points are named (stderr
  // by default; "0" for nowhere, or a file path).
  std::string log = "stderr";
  // JAXLAKE_FAKEGPU_STATS: a file the call counts are written to at exit
  // (JSON).
  std::string stats;
  // JAXLAKE_FAKEGPU_SHARED: the name of the device memory accounting shared
  // with every process that gives the same name (shared.cc); empty: this
  // process's own.
  std::string shared;
  // JAXLAKE_FAKEGPU_LOOP_LIMIT: the read that makes this many in a row of
  // the same nonzero byte from one device address into one host address,
  // by one-byte device-to-host copies, gives 0 (0: never). ReadLoopGuard.
  std::uint64_t loop_limit = 100;
};
const Options& Opts();
// False for a device JAXLAKE_FAKEGPU_NO_VMM names.
bool HasVmm(int device);

// Counts a call of `name` and says whether fault injection fails it (then
// *code is the error to return).
bool Enter(const char* name, int* code);

// Calls of the entry point `name` so far (Enter's count).
std::uint64_t Calls(const std::string& name);

// A call refused because of a stream capture (CUDA_ERROR_STREAM_CAPTURE_
// UNSUPPORTED from the capture rules): counted, for the control API.
void CountCaptureRefusal();
std::uint64_t CaptureRefusals();

// The answer of an entry point the fake does not implement: named once in
// the log, counted, and `code` returned.
int Unsupported(const char* library, const char* name, int code);

// A range of memory the fake handed out. kReserved is a VMM reservation,
// whose mapped pieces are memfd pages (Host()); `anonymous` marks a range
// that MapAnonymous made (not host memory the program registered).
enum class Kind { kDevice, kHost, kReserved };
struct Range {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  int device = 0;
  Kind kind = Kind::kDevice;
  bool anonymous = false;
};
void AddRange(const Range& r);
void RemoveRange(std::uintptr_t base);
bool FindRange(std::uintptr_t p, Range* out);

// Device memory accounting (cuMemCreate, cuMemAlloc and the driver's pool
// all count): false when `n` more bytes do not fit on `device`.
bool Charge(int device, std::size_t n);
void Uncharge(int device, std::size_t n);
std::size_t Used(int device);

// The accounting shared across processes (shared.cc), which Charge,
// Uncharge and Used use when JAXLAKE_FAKEGPU_SHARED names a segment.
// SharedError: why that segment cannot be used (then cuInit fails), or
// null. SharedUsage: each process's bytes on `device` (up to `max` of
// them), and the number of processes holding a slot; -1 when not shared.
bool SharedMode();
const char* SharedError();
bool SharedCharge(int device, std::size_t n);
void SharedUncharge(int device, std::size_t n);
std::size_t SharedUsed(int device);
int SharedUsage(int device, int* pids, unsigned long long* used, int max);
// A process's start time (clock ticks since boot; 0 when it cannot be
// read), which tells it apart from a later process reusing its pid; and
// whether the process `pid` that started at `start` still runs.
std::uint64_t ProcessStartTime(int pid);
bool ProcessAlive(int pid, std::uint64_t start);

// Anonymous, lazily backed memory (only touched pages cost), and its
// release.
void* MapAnonymous(std::size_t size);
void UnmapAnonymous(void* p, std::size_t size);

// The bytes of copies and memsets, as the device's work writes them. Host
// memory is committed only where a meaningful byte lands: whole pages that
// would be written with zeros inside a range the fake made are dropped
// instead (punched from the memfd behind a VMM mapping, so that every
// mapping of those pages reads zeros; discarded from an anonymous map), and
// only the partial pages at the ends are written.
void Zero(void* dst, std::size_t n);
template <typename T>
void Fill(void* dst, T value, std::size_t count);  // T: 8, 16, 32 bits
// memmove, except that whole destination pages whose source pages hold no
// data (never written, or dropped) are dropped rather than written.
void Move(void* dst, const void* src, std::size_t n);

// Called after a copy of `n` bytes from `src` to `dst` has run. Kernels do
// not run, so a flag that kernels compute never changes: a loop that reads
// it back each turn (XLA's while loop reads its predicate, one byte, from
// the device into a host buffer of its own every iteration) would never
// end. A one-byte copy from device memory to host memory that reads the
// same nonzero byte from the same device address into the same host
// address for the loop_limit-th time in a row writes 0 instead (named once
// on stderr), and that reader is then a stuck flag: its later loops end at
// their second read in a row of one nonzero byte. A read of another value,
// or of zero, starts that reader's count again.
void ReadLoopGuard(void* dst, const void* src, std::size_t n);

// The VMM calls' backing: memfd-backed mappings (jaxlake's HostDriver).
vmm::HostDriver& Host();

// A stream runs its work in order on a thread of its own.
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void Enqueue(std::function<void()> work);
  void Synchronize();  // until everything enqueued so far has run
  bool Idle();
  // A hold: work enqueued after it waits until Release() (the control API
  // holds a stream so that a test sees its events pending).
  void Hold();
  void Release();  // ends every hold so far
  bool Held();      // a hold not released yet
  int device() const { return device_; }
  int priority = 0;
  unsigned flags = 0;

 private:
  void Run();
  const int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t done_ = 0;
  std::uint64_t holds_ = 0;     // holds made
  std::uint64_t released_ = 0;  // holds ended
  bool stop_ = false;
  std::thread thread_;
};

// An event completes when the work recorded before it has run.
struct Event {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0;
  std::uint64_t completed = 0;
  double time_ms = 0;
  unsigned flags = 0;
};

// Stream and event handles. The null, legacy and per-thread streams are
// the current device's default stream.
Stream* StreamOf(void* handle, int current_device);
void* NewStream(int device, unsigned flags, int priority);
bool DestroyStream(void* handle);
std::vector<Stream*> StreamsOf(int device);
std::shared_ptr<Event> EventOf(void* handle);
void* NewEvent(unsigned flags);
bool DestroyEvent(void* handle);
std::size_t LiveEvents();  // events created and not destroyed
void RecordEvent(const std::shared_ptr<Event>& e, Stream* s);
void WaitEvent(Stream* s, const std::shared_ptr<Event>& e);
double NowMs();

// A graph node made (graph*.cc), by CUgraphNodeType (0 to 13), with the
// bytes of a memory alloc node: counted for the stats file.
void CountGraphNode(int type, std::size_t bytes);
// VMM address space and mappings (memory.cc): `reserved` bytes of address
// space reserved (negative: freed) and `mappings` made (negative:
// unmapped); the stats file reports their current values and peaks.
void CountVmm(std::int64_t reserved, std::int64_t mappings);
// Page-locked host memory the driver allocated (memory_alloc.cc:
// cuMemHostAlloc, cuMemAllocHost): `bytes` allocated (negative: freed by
// cuMemFreeHost); the stats file reports the bytes and regions held, now
// and at their peak.
void CountHostAlloc(std::int64_t bytes);

// The current device of the calling thread (its current context), or -1.
int CurrentDevice();
void SetCurrentDevice(int device);

}  // namespace jaxlake::fakegpu

#endif  // JAXLAKE_FAKEGPU_FAKEGPU_H_
