// jaxlake stress harness: random operations on a lake over the CPU drivers,
// with every result checked independently of the lake.
//
// The driver stack is lake -> FaultyDriver -> TrackingDriver -> sim or host.
// The TrackingDriver resolves every live allocation to physical ranges, so
// the harness sees (a) two live allocations sharing memory and (b) memory
// freed on a stream whose work is still in flight (the stream is held)
// handed to another stream. On the host backend a pattern is written into
// every allocation and checked when it is freed. Sizes run from 256 B to
// 1 GiB (heavy-tailed) under a capacity that forces out-of-memory; four
// streams are held and released at random; empty_cache() and check() run
// at intervals. With faults, one driver call kind at a time is armed to
// fail (every kind in turn, event_destroy and event_create in short-lived
// extra lakes), and check() runs after each injected failure. With threads,
// the workers share their allocations (frees cross threads and streams)
// while a controller thread holds and releases streams (and arms faults).
// At the end everything is freed, faults are cleared and empty_cache() must
// leave 0 bytes reserved by the lake and 0 held by the driver; after the
// lake's destruction the driver must hold nothing at all.
//
// Usage (docs/stress.md; STRESS_TRACE=1 prints every operation):
//   stress [--backend sim|host|all] [--faults off|on|both] [--threads N]
//          [--ops N] [--seconds S] [--seed N] [--check-every N] [--quick]
// Single-threaded runs do --ops operations per backend and fault mode;
// threaded runs last --seconds. --quick is the short pass ctest runs. The
// exit status is 0 only when every count of failures is 0.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/vmm/faulty_driver.h"
#include "cc/vmm/host_driver.h"
#include "cc/vmm/sim_driver.h"
#include "tests/stress/tracking_driver.h"

namespace jaxlake::stress {
namespace {

using Clock = std::chrono::steady_clock;
using vmm::Call;
constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr int kStreams = 4;  // streams 0..3; 4 and 5 serve the extra lakes

struct Config {
  std::vector<std::string> backends{"sim", "host"};
  std::vector<bool> faults{false, true};
  int threads = 1;
  std::uint64_t ops = 200000;
  double seconds = 10;
  std::uint64_t seed = 1;
  std::uint64_t check_every = 1000;
};

// Failure and activity counts of one run.
struct Counts {
#define JAXLAKE_STRESS_COUNTS(X)                                          \
  X(ops) X(allocs) X(frees) X(ooms) X(driver_errors) X(injected) X(checks) \
  X(holds) X(empty_caches) X(extra_lakes) X(invariant_failures)           \
  X(overlaps) X(cross_stream) X(data_errors) X(unexpected) X(leaks)
#define JAXLAKE_X(name) std::atomic<std::uint64_t> name{0};
  JAXLAKE_STRESS_COUNTS(JAXLAKE_X)
#undef JAXLAKE_X
  std::array<std::atomic<std::uint64_t>, vmm::kNumCalls> injected_by{};
  std::uint64_t failures() const {
    return invariant_failures + overlaps + cross_stream + data_errors +
           unexpected + leaks;
  }
};

// STRESS_TRACE=1 in the environment prints every operation to stderr.
bool Trace() {
  static const bool on = std::getenv("STRESS_TRACE") != nullptr;
  return on;
}

std::uint64_t Mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// 256 B .. 1 GiB, heavy-tailed: log2(size / 256) = 22 * u^3.
std::size_t RandomSize(std::mt19937_64& rng) {
  const double u = std::uniform_real_distribution<double>(0, 1)(rng);
  const double bits = 22.0 * u * u * u;
  const auto base = static_cast<std::size_t>(256.0 * std::exp2(bits));
  return std::min<std::size_t>(kGiB, base + rng() % 256);
}

struct Live {
  std::uintptr_t addr;
  std::size_t size;
  Stream stream;
  std::uint64_t id;
  std::vector<PhysRange> ranges;
};

class Run {
 public:
  Run(const Config& cfg, const std::string& backend, bool faults)
      : cfg_(cfg), backend_(backend), faults_(faults) {
    vmm::SimOptions so;
    if (backend == "host") {
      so = vmm::HostDefaults();
      so.device_bytes = 1 * kGiB;
      sim_ = std::make_unique<vmm::HostDriver>(so);
      capacity_ = 512 * kMiB;
    } else {
      so.device_bytes = 64 * kGiB;
      sim_ = std::make_unique<vmm::SimDriver>(so);
      capacity_ = 8 * kGiB;
    }
    track_ = std::make_unique<TrackingDriver>(*sim_);
    faulty_ = std::make_unique<vmm::FaultyDriver>(*track_);
    tracker_ = std::make_unique<Tracker>(*sim_);
    LakeOptions o;
    o.capacity = capacity_;
    o.stitch_cache = 16;
    // The default lake has no small pool (small_limit 0: every request is
    // split from the shared blocks at the alignment); the runs with faults
    // turn the per-stream small pool on, so its slabs, deferred
    // cross-stream frees and slab returns meet threads and faults too.
    if (faults_) o.small_limit = 1 * kMiB;
    lake_ = std::make_unique<Lake>(*faulty_, o);
    // Fewer live allocations per thread when several share the pool.
    target_live_ = cfg.threads > 1 ? 96 : 256;
  }

  // Single-threaded: cfg.ops operations.
  void Single() {
    std::mt19937_64 rng(cfg_.seed);
    int kind = 0;
    std::uint64_t armed_at = 0;
    for (std::uint64_t i = 0; i < cfg_.ops; ++i) {
      if (faults_ && i - armed_at >= 64) {  // the next kind in turn
        Arm(rng, kind++ % vmm::kNumCalls, 1 + rng() % 8);
        armed_at = i;
      }
      if (faults_ && i % 5000 == 4999) ExtraLake(rng, kind++);
      if (rng() % 64 == 0) {  // hold or release a stream
        const Stream s = rng() % kStreams;
        if (Trace())
          std::fprintf(stderr, "toggle stream %llu\n", U(s));
        if (sim_->stream_held(s)) {
          sim_->release_stream(s);
        } else {
          sim_->hold_stream(s, /*until_waited=*/true);  // one thread: no
          ++n_.holds;                                  // one else releases
        }
      }
      Step(rng);
      if (i % 4096 == 0) tracker_->Prune();
    }
  }

  // Threaded: cfg.threads workers for cfg.seconds, a controller holding
  // and releasing streams (and arming faults).
  void Threads() {
    std::atomic<bool> stop{false};
    const auto until = Clock::now() + std::chrono::duration<double>(
                                          cfg_.seconds);
    std::vector<std::thread> workers;
    for (int t = 0; t < cfg_.threads; ++t) {
      workers.emplace_back([&, t] {
        std::mt19937_64 rng(Mix(cfg_.seed * 1000 + static_cast<unsigned>(t)));
        while (Clock::now() < until) {
          for (int k = 0; k < 64; ++k) Step(rng);
        }
      });
    }
    std::thread controller([&] {
      std::mt19937_64 rng(Mix(cfg_.seed + 77));
      std::array<Clock::time_point, kStreams> end{};
      std::array<bool, kStreams> held{};
      int kind = 0;
      auto next_fault = Clock::now();
      while (!stop.load()) {
        const auto now = Clock::now();
        for (int s = 0; s < kStreams; ++s) {
          if (held[s] && now >= end[s]) {
            sim_->release_stream(static_cast<Stream>(s));
            held[s] = false;
          } else if (!held[s] && rng() % 8 == 0) {
            sim_->hold_stream(static_cast<Stream>(s));
            held[s] = true;
            ++n_.holds;
            end[s] = now + std::chrono::microseconds(50 + rng() % 2000);
          }
        }
        if (faults_ && now >= next_fault) {
          // Event kinds are armed less often: a failed wait is retried.
          Arm(rng, kind++ % vmm::kNumCalls, 1 + rng() % 16);
          next_fault = now + std::chrono::microseconds(200 + rng() % 2000);
        }
        tracker_->Prune();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      for (int s = 0; s < kStreams; ++s)
        sim_->release_stream(static_cast<Stream>(s));
    });
    for (auto& w : workers) w.join();
    stop = true;
    controller.join();
  }

  // Frees everything and checks that nothing is left anywhere.
  void Finish() {
    for (int s = 0; s < kStreams + 2; ++s)
      sim_->release_stream(static_cast<Stream>(s));
    faulty_->clear();
    std::vector<Live> all;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      all.swap(pool_);
    }
    std::mt19937_64 rng(cfg_.seed + 5);
    for (Live& l : all) Free(l, static_cast<Stream>(rng() % kStreams));
    Status s = Status::kOk;
    lake_->empty_cache(&s);
    if (s != Status::kOk) Fail(n_.leaks, "final empty_cache failed: " +
                                              lake_->last_error());
    Check("after freeing everything");
    const Stats st = lake_->stats();
    auto zero = [&](const char* what, std::int64_t v) {
      if (v != 0)
        Fail(n_.leaks, std::string("after empty_cache: ") + what + " is " +
                           std::to_string(v) + ", expected 0");
    };
    zero("lake bytes_reserved", st.bytes_reserved.current);
    zero("lake segments", st.segments.current);
    zero("lake stitched_bytes", st.stitched_bytes.current);
    zero("lake bytes_small_reserved", st.bytes_small_reserved.current);
    zero("lake unreleased", st.unreleased.current);
    zero("lake bytes_unreleased", st.bytes_unreleased.current);
    zero("lake live_allocations", st.live_allocations.current);
    zero("driver physical_bytes",
         static_cast<std::int64_t>(sim_->physical_bytes()));
    zero("driver mapped_bytes",
         static_cast<std::int64_t>(sim_->mapped_bytes()));
    zero("driver reserved_bytes",
         static_cast<std::int64_t>(sim_->reserved_bytes()));
    zero("driver live_handles",
         static_cast<std::int64_t>(sim_->live_handles()));
    driver_errors_seen_ = st.driver_errors;
    lake_.reset();
    auto gone = [&](const char* what, std::size_t v) {
      if (v != 0)
        Fail(n_.leaks, std::string("after destruction: driver ") + what +
                           " is " + std::to_string(v) + ", expected 0");
    };
    gone("physical_bytes", sim_->physical_bytes());
    gone("mapped_bytes", sim_->mapped_bytes());
    gone("reserved_bytes", sim_->reserved_bytes());
    gone("live_handles", sim_->live_handles());
    gone("live_events", sim_->live_events());
  }

  void Report(double secs) const {
    std::printf(
        "stress %s threads=%d faults=%s: %llu ops in %.1f s (%.0f ops/s); "
        "allocs %llu, frees %llu, out-of-memory %llu, driver errors %llu, "
        "injected %llu, checks %llu, holds %llu, empty_cache %llu, extra "
        "lakes %llu; invariant failures %llu, overlaps %llu, cross-stream "
        "%llu, data errors %llu, unexpected %llu, leaks %llu\n",
        backend_.c_str(), cfg_.threads, faults_ ? "on" : "off", U(n_.ops),
        secs, static_cast<double>(n_.ops) / std::max(secs, 1e-9),
        U(n_.allocs), U(n_.frees), U(n_.ooms), U(n_.driver_errors),
        U(n_.injected), U(n_.checks), U(n_.holds), U(n_.empty_caches),
        U(n_.extra_lakes), U(n_.invariant_failures), U(n_.overlaps),
        U(n_.cross_stream), U(n_.data_errors), U(n_.unexpected),
        U(n_.leaks));
    if (faults_) {
      std::printf("  injected by call:");
      for (int c = 0; c < vmm::kNumCalls; ++c)
        std::printf(" %s=%llu", vmm::CallName(static_cast<Call>(c)),
                    U(n_.injected_by[c]));
      std::printf("\n");
    }
    std::fflush(stdout);
  }

  const Counts& counts() const { return n_; }

 private:
  static unsigned long long U(std::uint64_t v) { return v; }

  void Fail(std::atomic<std::uint64_t>& count, const std::string& what) {
    if (count.fetch_add(1) < 5) {
      std::lock_guard<std::mutex> lock(print_mu_);
      std::fprintf(stderr, "stress %s faults=%s: %s\n", backend_.c_str(),
                   faults_ ? "on" : "off", what.c_str());
    }
  }

  void Check(const std::string& when) {
    ++n_.checks;
    const std::string err = lake_->check();
    if (!err.empty()) Fail(n_.invariant_failures, when + ": " + err);
  }

  // Arms `kind` to fail at its nth next call (a random failure status).
  void Arm(std::mt19937_64& rng, int kind, std::uint64_t nth) {
    static constexpr Status kStatuses[] = {
        Status::kDriverError, Status::kOutOfMemory, Status::kInvalidValue,
        Status::kNotSupported};
    faulty_->clear();
    armed_ = kind;
    faulty_->fail(static_cast<Call>(kind), nth, kStatuses[rng() % 4]);
  }

  // Counts injected failures since the last look; checks the lake if any.
  void AfterOp() {
    const std::uint64_t inj = faulty_->injected();
    std::uint64_t seen = injected_seen_.load();
    if (inj != seen && injected_seen_.compare_exchange_strong(seen, inj)) {
      n_.injected += inj - seen;
      n_.injected_by[armed_.load()] += inj - seen;
      Check("after an injected driver failure");
    }
  }

  // One random operation.
  void Step(std::mt19937_64& rng) {
    ++n_.ops;
    std::size_t live;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      live = pool_.size();
    }
    const std::uint64_t r = rng() % 1000;
    if (r < 2) {
      ++n_.empty_caches;
      Status s = Status::kOk;
      lake_->empty_cache(&s);
      if (s != Status::kOk && !faults_)
        Fail(n_.unexpected, std::string("empty_cache failed without faults: ") +
                                vmm::StatusName(s));
    } else if (live == 0 || r < (live < target_live_ ? 560u : 440u)) {
      Allocate(rng);
    } else {
      Live l;
      {
        std::lock_guard<std::mutex> lock(pool_mu_);
        if (pool_.empty()) return;
        const std::size_t k = rng() % pool_.size();
        l = std::move(pool_[k]);
        pool_[k] = std::move(pool_.back());
        pool_.pop_back();
      }
      // Mostly on the stream it was allocated on; often on another one.
      const Stream s = rng() % 10 < 6 ? l.stream : rng() % kStreams;
      Free(l, s);
    }
    AfterOp();
    if (n_.ops % cfg_.check_every == 0) Check("periodic check");
  }

  void Allocate(std::mt19937_64& rng) {
    const std::size_t size = RandomSize(rng);
    const Stream stream = rng() % kStreams;
    std::uintptr_t addr = 0;
    AllocState how = AllocState::small;
    const Status s = lake_->allocate(size, stream, &addr, &how);
    if (s == Status::kOutOfMemory) {
      ++n_.ooms;
      return;
    }
    if (s != Status::kOk) {
      ++n_.driver_errors;
      if (!faults_)
        Fail(n_.unexpected, std::string("allocate failed without faults: ") +
                                vmm::StatusName(s));
      return;
    }
    ++n_.allocs;
    Live l{addr, size, stream, next_id_++, {}};
    if (Trace())
      std::fprintf(stderr, "alloc %llu size %zu stream %llu addr %zx %s inj %llu\n",
                   U(l.id), size, U(stream), static_cast<std::size_t>(addr), AllocStateName(how), U(faulty_->injected()));
    // What the lake hands out: the request rounded to the alignment (blocks
    // are split at the alignment, small requests are carved at it).
    const std::size_t unit = lake_->options().alignment;
    const std::size_t rounded = (size + unit - 1) / unit * unit;
    std::vector<PhysRange> held;
    if (!track_->Resolve(addr, size, &l.ranges) ||
        !track_->Resolve(addr, rounded, &held)) {
      Fail(n_.data_errors, "allocation " + std::to_string(l.id) + " of " +
                               std::to_string(size) +
                               " bytes is not wholly mapped");
    } else {
      const std::string err =
          tracker_->Allocated(l.id, stream, l.ranges, held);
      if (!err.empty())
        Fail(err.find("in flight") != std::string::npos ? n_.cross_stream
                                                        : n_.overlaps,
             err);
    }
    if (backend_ == "host") Pattern(l, true);
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_.push_back(std::move(l));
  }

  void Free(Live& l, Stream s) {
    if (backend_ == "host" && !Pattern(l, false))
      Fail(n_.data_errors, "allocation " + std::to_string(l.id) +
                               " lost its pattern before its free");
    // Out of the live set before the lake may hand the memory out again;
    // the stream's state is read before the free, so a hold that ends
    // meanwhile is never missed (the free may only be later than it).
    tracker_->Freeing(l.id, s, l.ranges);
    if (Trace()) {
      bool held = false;
      sim_->stream_releases(s, &held);
      std::fprintf(stderr, "free %llu on stream %llu held %d\n", U(l.id),
                   U(s), held);
    }
    const Status st = lake_->free(l.addr, s);
    ++n_.frees;
    if (st != Status::kOk)
      Fail(n_.unexpected, "free of a live allocation failed: " +
                              std::string(vmm::StatusName(st)));
  }

  // Writes (write=true) or checks a pattern: a word naming the allocation
  // and the offset at its start, every 64 KiB and at its end.
  bool Pattern(const Live& l, bool write) {
    bool ok = true;
    auto at = [&](std::size_t off) {
      auto* p = reinterpret_cast<std::uint64_t*>(l.addr + off);
      const std::uint64_t want = Mix(l.id * 0x100000001b3ull + off);
      if (write)
        std::memcpy(p, &want, sizeof want);
      else {
        std::uint64_t have;
        std::memcpy(&have, p, sizeof have);
        ok = ok && have == want;
      }
    };
    for (std::size_t off = 0; off + 8 <= l.size; off += 64 * kKiB) at(off);
    at((l.size - 8) & ~std::size_t{7});
    return ok;
  }

  // A short-lived extra lake on the same driver stack (streams 4 and 5),
  // with one kind armed, then destroyed: its creation of events and its
  // destruction (event_destroy, the release calls) meet faults too. The
  // driver must hold afterwards exactly what it held before.
  void ExtraLake(std::mt19937_64& rng, int kind) {
    ++n_.extra_lakes;
    const std::size_t phys = sim_->physical_bytes(),
                      mapped = sim_->mapped_bytes(),
                      reserved = sim_->reserved_bytes(),
                      handles = sim_->live_handles(),
                      events = sim_->live_events();
    {
      LakeOptions o;
      o.capacity = 64 * kMiB;
      o.stitch_cache = 2;
      // Every other one preallocates: its one creation meets the faults
      // (a refused one falls back to growth on demand).
      o.preallocate = (n_.extra_lakes % 2) == 0;
      Lake extra(*faulty_, o);
      faulty_->clear();
      armed_ = kind % vmm::kNumCalls;
      faulty_->fail(static_cast<Call>(kind % vmm::kNumCalls), 1 + rng() % 6);
      sim_->hold_stream(4, /*until_waited=*/true);
      std::vector<std::uintptr_t> mine;
      for (int i = 0; i < 24; ++i) {
        std::uintptr_t p = 0;
        const std::size_t size = rng() % 2 ? 1 + rng() % (64 * kKiB)
                                           : 1 + rng() % (12 * kMiB);
        if (extra.allocate(size, 4 + rng() % 2, &p) == Status::kOk)
          mine.push_back(p);
        if (!mine.empty() && rng() % 3 == 0) {
          const std::size_t k = rng() % mine.size();
          extra.free(mine[k], 4 + rng() % 2);
          mine[k] = mine.back();
          mine.pop_back();
        }
        if (i % 8 == 7) extra.empty_cache();
      }
      const std::string err = extra.check();
      if (!err.empty()) Fail(n_.invariant_failures, "extra lake: " + err);
      for (std::uintptr_t p : mine) extra.free(p, 4);
      sim_->release_stream(4);
      // Destroyed with its last fault (if not met yet) still armed.
      faulty_->clear();
      faulty_->fail(static_cast<Call>(kind % vmm::kNumCalls), 1);
    }
    faulty_->clear();
    AfterOp();
    if (sim_->physical_bytes() != phys || sim_->mapped_bytes() != mapped ||
        sim_->reserved_bytes() != reserved ||
        sim_->live_handles() != handles || sim_->live_events() != events)
      Fail(n_.leaks, std::string("an extra lake left driver resources "
                                 "behind (armed call: ") +
                         vmm::CallName(static_cast<Call>(
                             kind % vmm::kNumCalls)) + ")");
  }

  const Config& cfg_;
  const std::string backend_;
  const bool faults_;
  std::size_t capacity_ = 0;
  std::size_t target_live_ = 256;
  std::unique_ptr<vmm::SimDriver> sim_;
  std::unique_ptr<TrackingDriver> track_;
  std::unique_ptr<vmm::FaultyDriver> faulty_;
  std::unique_ptr<Tracker> tracker_;
  std::unique_ptr<Lake> lake_;
  std::mutex pool_mu_;
  std::vector<Live> pool_;
  std::atomic<std::uint64_t> next_id_{1};
  std::atomic<std::uint64_t> injected_seen_{0};
  std::atomic<int> armed_{0};  // the call kind armed last
  std::uint64_t driver_errors_seen_ = 0;
  std::mutex print_mu_;
  Counts n_;
};

int Usage(const char* why) {
  std::fprintf(stderr,
               "stress: %s\nusage: stress [--backend sim|host|all] "
               "[--faults off|on|both] [--threads N] [--ops N] [--seconds S] "
               "[--seed N] [--check-every N] [--quick]\n",
               why);
  return 2;
}

}  // namespace
}  // namespace jaxlake::stress

int main(int argc, char** argv) {
  using namespace jaxlake::stress;
  Config cfg;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) return "";
      return argv[++i];
    };
    if (a == "--quick") {
      quick = true;
    } else if (a == "--backend") {
      const std::string v = value();
      if (v == "all")
        cfg.backends = {"sim", "host"};
      else if (v == "sim" || v == "host")
        cfg.backends = {v};
      else
        return Usage(("unknown backend '" + v + "'").c_str());
    } else if (a == "--faults") {
      const std::string v = value();
      if (v == "both")
        cfg.faults = {false, true};
      else if (v == "on" || v == "off")
        cfg.faults = {v == "on"};
      else
        return Usage(("--faults takes off, on or both, not '" + v + "'")
                         .c_str());
    } else if (a == "--threads") {
      cfg.threads = std::atoi(value().c_str());
      if (cfg.threads < 1 || cfg.threads > 64)
        return Usage("--threads takes 1 to 64");
    } else if (a == "--ops") {
      cfg.ops = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--seconds") {
      cfg.seconds = std::atof(value().c_str());
    } else if (a == "--seed") {
      cfg.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--check-every") {
      cfg.check_every = std::max<std::uint64_t>(
          1, std::strtoull(value().c_str(), nullptr, 10));
    } else {
      return Usage(("unknown argument '" + a + "'").c_str());
    }
  }
  // The short pass: every backend and fault mode, one thread and four.
  std::vector<Config> plan;
  if (quick) {
    Config one = cfg;
    one.threads = 1;
    one.ops = 20000;
    one.check_every = 250;
    Config many = cfg;
    many.threads = 4;
    many.seconds = 1;
    many.check_every = 250;
    plan = {one, many};
  } else {
    plan = {cfg};
  }
  std::uint64_t failures = 0;
  for (const Config& c : plan) {
    for (const std::string& backend : c.backends) {
      for (bool faults : c.faults) {
        const auto t0 = Clock::now();
        Run run(c, backend, faults);
        if (c.threads == 1)
          run.Single();
        else
          run.Threads();
        run.Finish();
        const double secs =
            std::chrono::duration<double>(Clock::now() - t0).count();
        run.Report(secs);
        failures += run.counts().failures();
      }
    }
  }
  std::printf("stress: %s (%llu failures)\n", failures ? "FAILED" : "ok",
              static_cast<unsigned long long>(failures));
  return failures ? 1 : 0;
}
