// The fake GPU's cuFFT, by NVIDIA's names and signatures (cufft.h): plans
// (cufftHandle, an int), made once by the Plan*/MakePlan* calls, with a work
// area whose size is the fake's rule (below); the plan allocates it itself
// (auto-allocation, cuFFT's default) or takes the caller's (XLA's scratch
// allocator: cufftSetAutoAllocation(plan, 0), then cufftSetWorkArea). The
// transforms are kernels: an execution checks its plan, its type, its
// buffers and the work area, and computes nothing.
//
// The work area rule: a plan's work area is one complex copy of the
// transform's data, batch x the elements of the complex side (the last
// dimension n/2 + 1 for a real transform) x 8 bytes (single precision) or
// 16 (double). cuFFT's own figure depends on the sizes' factorization and
// the GPU; this one grows with the transform as cuFFT's does for sizes
// that need more than one pass.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "cc/fakegpu/fakegpu.h"
#include "cc/fakegpu/libs.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

// The fake driver's own allocation calls (memory_alloc.cc): an auto-allocated
// work area is device memory of the fake, counted against the device.
extern "C" int cuMemAlloc_v2(unsigned long long* dptr, std::size_t bytes);
extern "C" int cuMemFree_v2(unsigned long long dptr);

namespace {

// cufftResult (cufft.h).
constexpr int kSuccess = 0, kInvalidPlan = 1, kAllocFailed = 2,
              kInvalidType = 3, kInvalidValue = 4, kInvalidSize = 8,
              kNoWorkspace = 13;

// cufftType (cufft.h).
constexpr int kR2C = 0x2a, kC2R = 0x2c, kC2C = 0x29, kD2Z = 0x6a,
              kZ2D = 0x6c, kZ2Z = 0x69;

bool ValidType(int t) {
  return t == kR2C || t == kC2R || t == kC2C || t == kD2Z || t == kZ2D ||
         t == kZ2Z;
}
bool Double(int t) { return t == kD2Z || t == kZ2D || t == kZ2Z; }
bool Real(int t) { return t != kC2C && t != kZ2Z; }

// A plan: its transform once made, its stream and its work area.
struct Plan {
  bool made = false;
  int type = 0;
  std::uint64_t input_bytes = 0;   // of one execution's input
  std::uint64_t output_bytes = 0;  // and output (packed layouts)
  std::size_t work_size = 0;
  bool auto_allocate = true;
  void* work_area = nullptr;
  unsigned long long owned = 0;  // the auto-allocated work area, or 0
  void* stream = nullptr;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() { Release(); }
  void Release() {
    if (owned != 0) cuMemFree_v2(owned);
    owned = 0;
  }
};

struct Plans {
  std::mutex mu;
  std::map<int, std::unique_ptr<Plan>> live;
  int next = 1;
};
Plans& P() {
  static Plans* p = new Plans;
  return *p;
}

template <typename F>
int WithPlan(int handle, F f) {
  std::lock_guard<std::mutex> lock(P().mu);
  auto it = P().live.find(handle);
  if (it == P().live.end()) return kInvalidPlan;
  return f(*it->second);
}

// A transform's shape, checked: rank 1 to 3, positive sizes and batch.
struct Shape {
  int rank = 0;
  std::int64_t n[3] = {1, 1, 1};
  std::int64_t batch = 1;
  int type = 0;
};

int Check(const Shape& s) {
  if (!ValidType(s.type)) return kInvalidType;
  if (s.rank < 1 || s.rank > 3 || s.batch < 1) return kInvalidValue;
  for (int i = 0; i < s.rank; ++i)
    if (s.n[i] < 1) return kInvalidSize;
  return kSuccess;
}

// Elements of the real side and of the complex side of one execution.
void Elements(const Shape& s, std::uint64_t* real, std::uint64_t* complex) {
  std::uint64_t outer = static_cast<std::uint64_t>(s.batch);
  for (int i = 0; i + 1 < s.rank; ++i)
    outer *= static_cast<std::uint64_t>(s.n[i]);
  const auto last = static_cast<std::uint64_t>(s.n[s.rank - 1]);
  *real = outer * last;
  *complex = Real(s.type) ? outer * (last / 2 + 1) : outer * last;
}

// The fake's work area rule (the file's comment).
std::size_t WorkSize(const Shape& s) {
  std::uint64_t real = 0, complex = 0;
  Elements(s, &real, &complex);
  return complex * (Double(s.type) ? 16 : 8);
}

template <typename I>
Shape ShapeOf(int rank, const I* n, I batch, int type) {
  Shape s;
  s.rank = rank;
  s.type = type;
  s.batch = static_cast<std::int64_t>(batch);
  for (int i = 0; i < rank && i < 3 && n != nullptr; ++i)
    s.n[i] = static_cast<std::int64_t>(n[i]);
  if (n == nullptr) s.rank = 0;
  return s;
}

// Makes `handle`'s plan for `s` (MakePlan*): the work area is allocated now
// under auto-allocation; *work_size (when given) receives its size.
int Make(int handle, const Shape& s, std::size_t* work_size) {
  const int bad = Check(s);
  if (bad != kSuccess) return bad;
  return WithPlan(handle, [&](Plan& p) {
    if (p.made) return kInvalidPlan;  // a plan is made once
    std::uint64_t real = 0, complex = 0;
    Elements(s, &real, &complex);
    const std::uint64_t real_bytes = real * (Double(s.type) ? 8 : 4);
    const std::uint64_t complex_bytes = complex * (Double(s.type) ? 16 : 8);
    const bool to_complex = s.type == kR2C || s.type == kD2Z;
    const bool from_complex = s.type == kC2R || s.type == kZ2D;
    p.type = s.type;
    p.input_bytes = to_complex ? real_bytes : complex_bytes;
    p.output_bytes = from_complex ? real_bytes : complex_bytes;
    p.work_size = WorkSize(s);
    if (p.auto_allocate && p.work_size > 0) {
      unsigned long long area = 0;
      if (cuMemAlloc_v2(&area, p.work_size) != 0) return kAllocFailed;
      p.owned = area;
      p.work_area = reinterpret_cast<void*>(area);
    }
    p.made = true;
    if (work_size != nullptr) *work_size = p.work_size;
    return kSuccess;
  });
}

int NewPlan(int* handle) {
  if (handle == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(P().mu);
  const int h = P().next++;
  P().live[h] = std::make_unique<Plan>();
  *handle = h;
  return kSuccess;
}

int DestroyPlan(int handle) {
  std::unique_ptr<Plan> plan;
  {
    std::lock_guard<std::mutex> lock(P().mu);
    auto it = P().live.find(handle);
    if (it == P().live.end()) return kInvalidPlan;
    plan = std::move(it->second);
    P().live.erase(it);
  }
  return kSuccess;  // ~Plan frees an auto-allocated work area
}

// cufftPlan*: a new plan, made at once (auto-allocated).
int CreateAndMake(int* handle, const Shape& s) {
  if (handle == nullptr) return kInvalidValue;
  const int bad = Check(s);
  if (bad != kSuccess) return bad;
  int h = 0;
  NewPlan(&h);
  const int r = Make(h, s, nullptr);
  if (r != kSuccess) {
    DestroyPlan(h);
    return r;
  }
  *handle = h;
  return kSuccess;
}

int Estimate(const Shape& s, std::size_t* work_size) {
  if (work_size == nullptr) return kInvalidValue;
  const int bad = Check(s);
  if (bad != kSuccess) return bad;
  *work_size = WorkSize(s);
  return kSuccess;
}

// An execution: a made plan of a type the call computes, device buffers of
// the plan's sizes, and a work area when the plan needs one.
int Execute(int handle, bool double_precision, int kind, const void* in,
            const void* out) {
  return WithPlan(handle, [&](Plan& p) {
    if (!p.made) return kInvalidPlan;
    const bool c2c = p.type == kC2C || p.type == kZ2Z;
    const bool r2c = p.type == kR2C || p.type == kD2Z;
    const int plan_kind = c2c ? 0 : r2c ? 1 : 2;
    if (Double(p.type) != double_precision || plan_kind != kind)
      return kInvalidValue;
    if (!fg::DeviceBytes(in, p.input_bytes) ||
        !fg::DeviceBytes(out, p.output_bytes))
      return kInvalidValue;
    if (p.work_size > 0 && !fg::DeviceBytes(p.work_area, p.work_size))
      return kNoWorkspace;
    return kSuccess;
  });
}

int ExecuteC2C(int handle, bool dbl, const void* in, const void* out,
               int direction) {
  if (direction != -1 && direction != 1) return kInvalidValue;
  return Execute(handle, dbl, 0, in, out);
}

}  // namespace

// ---- plans --------------------------------------------------------------

LIB int cufftCreate(int* handle) {
  ENTER();
  return NewPlan(handle);
}

LIB int cufftDestroy(int plan) {
  ENTER();
  return DestroyPlan(plan);
}

LIB int cufftSetAutoAllocation(int plan, int auto_allocate) {
  ENTER();
  return WithPlan(plan, [&](Plan& p) {
    p.auto_allocate = auto_allocate != 0;
    return kSuccess;
  });
}

// The caller's work area (null for a plan that needs none); an
// auto-allocated one is freed, as cuFFT documents.
LIB int cufftSetWorkArea(int plan, void* work_area) {
  ENTER();
  return WithPlan(plan, [&](Plan& p) {
    p.Release();
    p.work_area = work_area;
    return kSuccess;
  });
}

LIB int cufftSetStream(int plan, void* stream) {
  ENTER();
  return WithPlan(plan, [&](Plan& p) {
    p.stream = stream;
    return kSuccess;
  });
}

LIB int cufftGetSize(int plan, std::size_t* work_size) {
  ENTER();
  if (work_size == nullptr) return kInvalidValue;
  return WithPlan(plan, [&](Plan& p) {
    *work_size = p.work_size;
    return kSuccess;
  });
}

LIB int cufftMakePlan1d(int plan, int nx, int type, int batch,
                        std::size_t* work_size) {
  ENTER();
  const int n[1] = {nx};
  return Make(plan, ShapeOf(1, n, batch, type), work_size);
}

LIB int cufftMakePlan2d(int plan, int nx, int ny, int type,
                        std::size_t* work_size) {
  ENTER();
  const int n[2] = {nx, ny};
  return Make(plan, ShapeOf(2, n, 1, type), work_size);
}

LIB int cufftMakePlan3d(int plan, int nx, int ny, int nz, int type,
                        std::size_t* work_size) {
  ENTER();
  const int n[3] = {nx, ny, nz};
  return Make(plan, ShapeOf(3, n, 1, type), work_size);
}

// The embedding arguments (inembed, strides, distances) place the data in
// memory; the fake's sizes are those of the packed layout.
LIB int cufftMakePlanMany(int plan, int rank, int* n, int*, int, int, int*,
                          int, int, int type, int batch,
                          std::size_t* work_size) {
  ENTER();
  return Make(plan, ShapeOf(rank, n, batch, type), work_size);
}

LIB int cufftMakePlanMany64(int plan, int rank, long long* n, long long*,
                            long long, long long, long long*, long long,
                            long long, int type, long long batch,
                            std::size_t* work_size) {
  ENTER();
  return Make(plan, ShapeOf(rank, n, batch, type), work_size);
}

LIB int cufftPlan1d(int* plan, int nx, int type, int batch) {
  ENTER();
  const int n[1] = {nx};
  return CreateAndMake(plan, ShapeOf(1, n, batch, type));
}

LIB int cufftPlan2d(int* plan, int nx, int ny, int type) {
  ENTER();
  const int n[2] = {nx, ny};
  return CreateAndMake(plan, ShapeOf(2, n, 1, type));
}

LIB int cufftPlan3d(int* plan, int nx, int ny, int nz, int type) {
  ENTER();
  const int n[3] = {nx, ny, nz};
  return CreateAndMake(plan, ShapeOf(3, n, 1, type));
}

LIB int cufftPlanMany(int* plan, int rank, int* n, int*, int, int, int*, int,
                      int, int type, int batch) {
  ENTER();
  return CreateAndMake(plan, ShapeOf(rank, n, batch, type));
}

// ---- sizes ------------------------------------------------------------

LIB int cufftEstimate1d(int nx, int type, int batch, std::size_t* work_size) {
  ENTER();
  const int n[1] = {nx};
  return Estimate(ShapeOf(1, n, batch, type), work_size);
}

LIB int cufftEstimate2d(int nx, int ny, int type, std::size_t* work_size) {
  ENTER();
  const int n[2] = {nx, ny};
  return Estimate(ShapeOf(2, n, 1, type), work_size);
}

LIB int cufftEstimate3d(int nx, int ny, int nz, int type,
                        std::size_t* work_size) {
  ENTER();
  const int n[3] = {nx, ny, nz};
  return Estimate(ShapeOf(3, n, 1, type), work_size);
}

LIB int cufftEstimateMany(int rank, int* n, int*, int, int, int*, int, int,
                          int type, int batch, std::size_t* work_size) {
  ENTER();
  return Estimate(ShapeOf(rank, n, batch, type), work_size);
}

// cufftGetSize*: the estimate for an existing plan.
namespace {
int GetSizeOf(int plan, const Shape& s, std::size_t* work_size) {
  const int known = WithPlan(plan, [](Plan&) { return kSuccess; });
  if (known != kSuccess) return known;
  return Estimate(s, work_size);
}
}  // namespace

LIB int cufftGetSize1d(int plan, int nx, int type, int batch,
                       std::size_t* work_size) {
  ENTER();
  const int n[1] = {nx};
  return GetSizeOf(plan, ShapeOf(1, n, batch, type), work_size);
}

LIB int cufftGetSize2d(int plan, int nx, int ny, int type,
                       std::size_t* work_size) {
  ENTER();
  const int n[2] = {nx, ny};
  return GetSizeOf(plan, ShapeOf(2, n, 1, type), work_size);
}

LIB int cufftGetSize3d(int plan, int nx, int ny, int nz, int type,
                       std::size_t* work_size) {
  ENTER();
  const int n[3] = {nx, ny, nz};
  return GetSizeOf(plan, ShapeOf(3, n, 1, type), work_size);
}

LIB int cufftGetSizeMany(int plan, int rank, int* n, int*, int, int, int*,
                         int, int, int type, int batch,
                         std::size_t* work_size) {
  ENTER();
  return GetSizeOf(plan, ShapeOf(rank, n, batch, type), work_size);
}

LIB int cufftGetSizeMany64(int plan, int rank, long long* n, long long*,
                           long long, long long, long long*, long long,
                           long long, int type, long long batch,
                           std::size_t* work_size) {
  ENTER();
  return GetSizeOf(plan, ShapeOf(rank, n, batch, type), work_size);
}

// ---- executions (kernels: checked, not computed) ------------------------

LIB int cufftExecC2C(int plan, void* in, void* out, int direction) {
  ENTER();
  return ExecuteC2C(plan, false, in, out, direction);
}

LIB int cufftExecZ2Z(int plan, void* in, void* out, int direction) {
  ENTER();
  return ExecuteC2C(plan, true, in, out, direction);
}

LIB int cufftExecR2C(int plan, void* in, void* out) {
  ENTER();
  return Execute(plan, false, 1, in, out);
}

LIB int cufftExecD2Z(int plan, void* in, void* out) {
  ENTER();
  return Execute(plan, true, 1, in, out);
}

LIB int cufftExecC2R(int plan, void* in, void* out) {
  ENTER();
  return Execute(plan, false, 2, in, out);
}

LIB int cufftExecZ2D(int plan, void* in, void* out) {
  ENTER();
  return Execute(plan, true, 2, in, out);
}
