// The fake GPU's dense cuSOLVER (cusolverDn), by NVIDIA's names and
// signatures (cusolverDn.h): handles that keep their stream, the params,
// syevj and gesvdj info objects, the workspace queries (the `_bufferSize`
// calls) and the factorizations and eigen/singular value solvers that JAX
// (jaxlib's gpu_solver) and XLA call. The solvers are kernels: each checks
// its handle, its sizes, that its matrices, workspace and info are device
// memory of the fake of the sizes its arguments give, and that the
// workspace is at least what the query answered, then computes nothing.
//
// The workspace rule (what a query answers; cuSOLVER's own figures depend on
// its internal blocking and the GPU): with a block of nb = 64 columns,
//   getrf, geqrf, orgqr/ungqr, sytrd/hetrd, potrf: nb * n elements;
//   ormqr/unmqr: nb * n (side left) or nb * m (right) elements;
//   syevd/heevd: 1 + 6n + 2n^2 elements with vectors, 1 + 2n without
//     (LAPACK's syevd minimum);
//   syevj/heevj: 2n^2 elements, and batch times that for syevjBatched;
//   gesvd: max(3 min(m,n) + max(m,n), 5 min(m,n)) + nb (m + n) elements;
//   gesvdj: m n + 2 min(m,n)^2 elements, batch times that for
//     gesvdjBatched;
// in elements of the data type, as the legacy API counts them. The 64-bit
// API (Xsyevd, XsyevBatched, Xgesvd, Xgesvdp, Xgeev, Xpotrf, Xgetrf,
// Xgeqrf) answers the same figures in bytes of its data type (geev: 2n^2 +
// 4n elements; gesvdp: the gesvdj figure), and needs no host workspace.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>

#include "cc/fakegpu/fakegpu.h"
#include "cc/fakegpu/libs.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

// cusolverStatus_t (cusolver_common.h).
constexpr int kSuccess = 0, kNotInitialized = 1, kInvalidValue = 3;

constexpr std::int64_t kBlock = 64;  // nb of the workspace rule

struct Handle {
  void* stream = nullptr;
};
struct Params {
  int function = 0;
  int algorithm = 0;
};
// syevjInfo_t and gesvdjInfo_t: the Jacobi methods' settings.
struct JacobiInfo {
  double tolerance = 0;
  int max_sweeps = 100;
  int sort = 1;
};

fg::Registry<Handle>& Handles() {
  static auto* r = new fg::Registry<Handle>;
  return *r;
}
fg::Registry<Params>& AllParams() {
  static auto* r = new fg::Registry<Params>;
  return *r;
}
fg::Registry<JacobiInfo>& SyevjInfos() {
  static auto* r = new fg::Registry<JacobiInfo>;
  return *r;
}
fg::Registry<JacobiInfo>& GesvdjInfos() {
  static auto* r = new fg::Registry<JacobiInfo>;
  return *r;
}

template <typename T>
int Create(fg::Registry<T>& r, void** out) {
  if (out == nullptr) return kInvalidValue;
  *out = r.Add(std::make_unique<T>());
  return kSuccess;
}
template <typename T>
int Destroy(fg::Registry<T>& r, void* h) {
  return r.Remove(h) != nullptr ? kSuccess : kInvalidValue;
}

bool Known(void* handle) {
  return Handles().With(handle, 0, [](Handle&) { return 1; }) == 1;
}

// ---- the workspace rule (the file's comment), in elements -----------------

std::int64_t Panel(std::int64_t n) { return kBlock * std::max<std::int64_t>(n, 1); }
std::int64_t Syevd(int jobz, std::int64_t n) {
  return jobz != 0 ? 1 + 6 * n + 2 * n * n : 1 + 2 * n;
}
std::int64_t Syevj(std::int64_t n) { return std::max<std::int64_t>(2 * n * n, 1); }
std::int64_t Gesvd(std::int64_t m, std::int64_t n) {
  const std::int64_t lo = std::min(m, n), hi = std::max(m, n);
  return std::max(3 * lo + hi, 5 * lo) + kBlock * (m + n);
}
std::int64_t Gesvdj(std::int64_t m, std::int64_t n) {
  const std::int64_t lo = std::min(m, n);
  return std::max<std::int64_t>(m * n + 2 * lo * lo, 1);
}
std::int64_t Geev(std::int64_t n) { return 2 * n * n + 4 * n; }

// A legacy query's answer: `elements` into *lwork (an int, as the API has
// it); INVALID_VALUE for a bad handle, a null output or a size an int cannot
// hold.
int Answer(void* handle, std::int64_t elements, int* lwork) {
  if (!Known(handle)) return kNotInitialized;
  if (lwork == nullptr || elements < 0 || elements > INT32_MAX)
    return kInvalidValue;
  *lwork = static_cast<int>(elements);
  return kSuccess;
}
// A 64-bit query's answer: `elements` of `type` in bytes on the device, none
// on the host.
int AnswerBytes(void* handle, std::int64_t elements, int type,
                std::size_t* device, std::size_t* host) {
  if (!Known(handle)) return kNotInitialized;
  const std::size_t bytes = fg::DataTypeBytes(type);
  if (device == nullptr || host == nullptr || bytes == 0 || elements < 0)
    return kInvalidValue;
  *device = static_cast<std::size_t>(elements) * bytes;
  *host = 0;
  return kSuccess;
}

// The bytes of a column-major rows x cols matrix with leading dimension ld
// (0 for an empty one); -1 when ld is too small.
std::int64_t MatrixBytes(std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         std::size_t elem) {
  if (rows < 0 || cols < 0 || ld < std::max<std::int64_t>(rows, 1)) return -1;
  if (rows == 0 || cols == 0) return 0;
  return (ld * (cols - 1) + rows) * static_cast<std::int64_t>(elem);
}

// What every solver checks: the handle, then device memory for each
// (pointer, bytes) pair (a negative size is a bad argument).
struct Buf {
  const void* p;
  std::int64_t bytes;
};
int Run(void* handle, std::initializer_list<Buf> bufs) {
  if (!Known(handle)) return kNotInitialized;
  for (const Buf& b : bufs)
    if (b.bytes < 0 || !fg::DeviceBytes(b.p, static_cast<std::uint64_t>(b.bytes)))
      return kInvalidValue;
  return kSuccess;
}
// A workspace of lwork elements that must hold `needed`.
Buf Work(const void* p, int lwork, std::int64_t needed, std::size_t elem) {
  if (lwork < needed) return {p, -1};
  return {p, static_cast<std::int64_t>(lwork) * static_cast<std::int64_t>(elem)};
}
Buf Info(const void* p, std::int64_t count = 1) { return {p, 4 * count}; }

bool Jobz(int jobz) { return jobz == 0 || jobz == 1; }  // CUSOLVER_EIG_MODE_*

}  // namespace

// ---- handles and settings ---------------------------------------------------

LIB int cusolverDnCreate(void** handle) {
  ENTER();
  return Create(Handles(), handle);
}
LIB int cusolverDnDestroy(void* handle) {
  ENTER();
  return Destroy(Handles(), handle);
}
LIB int cusolverDnSetStream(void* handle, void* stream) {
  ENTER();
  return Handles().With(handle, kNotInitialized, [&](Handle& h) {
    h.stream = stream;
    return kSuccess;
  });
}
LIB int cusolverDnGetStream(void* handle, void** stream) {
  ENTER();
  if (stream == nullptr) return kInvalidValue;
  return Handles().With(handle, kNotInitialized, [&](Handle& h) {
    *stream = h.stream;
    return kSuccess;
  });
}
LIB int cusolverDnCreateParams(void** params) {
  ENTER();
  return Create(AllParams(), params);
}
LIB int cusolverDnDestroyParams(void* params) {
  ENTER();
  return Destroy(AllParams(), params);
}
LIB int cusolverDnSetAdvOptions(void* params, int function, int algorithm) {
  ENTER();
  return AllParams().With(params, kInvalidValue, [&](Params& p) {
    p.function = function;
    p.algorithm = algorithm;
    return kSuccess;
  });
}
LIB int cusolverDnCreateSyevjInfo(void** info) {
  ENTER();
  return Create(SyevjInfos(), info);
}
LIB int cusolverDnDestroySyevjInfo(void* info) {
  ENTER();
  return Destroy(SyevjInfos(), info);
}
LIB int cusolverDnCreateGesvdjInfo(void** info) {
  ENTER();
  return Create(GesvdjInfos(), info);
}
LIB int cusolverDnDestroyGesvdjInfo(void* info) {
  ENTER();
  return Destroy(GesvdjInfos(), info);
}

#define JAXLAKE_JACOBI_SETTERS(kind, registry)                                \
  LIB int cusolverDnX##kind##SetTolerance(void* info, double tolerance) {     \
    ENTER();                                                                  \
    return registry().With(info, kInvalidValue, [&](JacobiInfo& j) {          \
      j.tolerance = tolerance;                                                \
      return kSuccess;                                                        \
    });                                                                       \
  }                                                                           \
  LIB int cusolverDnX##kind##SetMaxSweeps(void* info, int sweeps) {           \
    ENTER();                                                                  \
    if (sweeps < 1) return kInvalidValue;                                     \
    return registry().With(info, kInvalidValue, [&](JacobiInfo& j) {          \
      j.max_sweeps = sweeps;                                                  \
      return kSuccess;                                                        \
    });                                                                       \
  }                                                                           \
  LIB int cusolverDnX##kind##SetSortEig(void* info, int sort) {               \
    ENTER();                                                                  \
    return registry().With(info, kInvalidValue, [&](JacobiInfo& j) {          \
      j.sort = sort;                                                          \
      return kSuccess;                                                        \
    });                                                                       \
  }                                                                           \
  /* No solver ran: no sweeps, no residual. */                                \
  LIB int cusolverDnX##kind##GetSweeps(void* handle, void* info, int* sweeps) \
  {                                                                           \
    ENTER();                                                                  \
    if (!Known(handle)) return kNotInitialized;                               \
    if (sweeps == nullptr) return kInvalidValue;                              \
    return registry().With(info, kInvalidValue, [&](JacobiInfo&) {            \
      *sweeps = 0;                                                            \
      return kSuccess;                                                        \
    });                                                                       \
  }                                                                           \
  LIB int cusolverDnX##kind##GetResidual(void* handle, void* info,            \
                                         double* residual) {                  \
    ENTER();                                                                  \
    if (!Known(handle)) return kNotInitialized;                               \
    if (residual == nullptr) return kInvalidValue;                            \
    return registry().With(info, kInvalidValue, [&](JacobiInfo&) {            \
      *residual = 0;                                                          \
      return kSuccess;                                                        \
    });                                                                       \
  }
JAXLAKE_JACOBI_SETTERS(syevj, SyevjInfos)
JAXLAKE_JACOBI_SETTERS(gesvdj, GesvdjInfos)

// ---- the legacy API, one set for each of S, D, C and Z ----------------------
//
// E: the bytes of an element, R: of its real part (the eigenvalues and
// singular values); the pointer types of cusolverDn.h are all passed as
// pointers, so void* stands for them.

namespace {
bool JacobiKnown(fg::Registry<JacobiInfo>& r, void* info) {
  return r.With(info, 0, [](JacobiInfo&) { return 1; }) == 1;
}
}  // namespace

#define JAXLAKE_CUSOLVER_LEGACY(P, E, R, orgqr, ormqr, syevd, syevj, sytrd)   \
  LIB int cusolverDn##P##getrf_bufferSize(void* h, int m, int n, void*,      \
                                          int lda, int* lwork) {             \
    ENTER();                                                                  \
    if (m < 0 || n < 0 || lda < std::max(1, m)) return kInvalidValue;         \
    return Answer(h, Panel(n), lwork);                                        \
  }                                                                           \
  LIB int cusolverDn##P##getrf(void* h, int m, int n, void* a, int lda,       \
                               void* work, int* ipiv, int* info) {            \
    ENTER();                                                                  \
    return Run(h, {{a, MatrixBytes(m, n, lda, E)},                            \
                   {work, Panel(n) * (E)},                                    \
                   {ipiv, ipiv == nullptr ? 0 : 4 * std::min<std::int64_t>(m, n)},\
                   Info(info)});                                              \
  }                                                                           \
  LIB int cusolverDn##P##getrs(void* h, int trans, int n, int nrhs,           \
                               const void* a, int lda, const int* ipiv,       \
                               void* b, int ldb, int* info) {                 \
    ENTER();                                                                  \
    if (trans < 0 || trans > 2) return kInvalidValue;                         \
    return Run(h, {{a, MatrixBytes(n, n, lda, E)},                            \
                   {ipiv, 4 * std::int64_t{n}},                               \
                   {b, MatrixBytes(n, nrhs, ldb, E)},                         \
                   Info(info)});                                              \
  }                                                                           \
  LIB int cusolverDn##P##geqrf_bufferSize(void* h, int m, int n, void*,      \
                                          int lda, int* lwork) {             \
    ENTER();                                                                  \
    if (m < 0 || n < 0 || lda < std::max(1, m)) return kInvalidValue;         \
    return Answer(h, Panel(n), lwork);                                        \
  }                                                                           \
  LIB int cusolverDn##P##geqrf(void* h, int m, int n, void* a, int lda,       \
                               void* tau, void* work, int lwork, int* info) { \
    ENTER();                                                                  \
    return Run(h, {{a, MatrixBytes(m, n, lda, E)},                            \
                   {tau, std::min<std::int64_t>(m, n) * (E)},                 \
                   Work(work, lwork, Panel(n), E), Info(info)});              \
  }                                                                           \
  LIB int cusolverDn##P##orgqr##_bufferSize(void* h, int m, int n, int k,     \
                                            const void*, int lda,             \
                                            const void*, int* lwork) {        \
    ENTER();                                                                  \
    if (m < n || n < k || k < 0 || lda < std::max(1, m))                      \
      return kInvalidValue;                                                   \
    return Answer(h, Panel(n), lwork);                                        \
  }                                                                           \
  LIB int cusolverDn##P##orgqr(void* h, int m, int n, int k, void* a,         \
                               int lda, const void* tau, void* work,          \
                               int lwork, int* info) {                        \
    ENTER();                                                                  \
    if (m < n || n < k || k < 0) return kInvalidValue;                        \
    return Run(h, {{a, MatrixBytes(m, n, lda, E)},                            \
                   {tau, std::int64_t{k} * (E)},                              \
                   Work(work, lwork, Panel(n), E), Info(info)});              \
  }                                                                           \
  LIB int cusolverDn##P##ormqr##_bufferSize(                                  \
      void* h, int side, int trans, int m, int n, int k, const void*,         \
      int lda, const void*, const void*, int ldc, int* lwork) {               \
    ENTER();                                                                  \
    if (side < 0 || side > 1 || trans < 0 || trans > 2 || m < 0 || n < 0 ||   \
        k < 0 || ldc < std::max(1, m) || lda < 1)                             \
      return kInvalidValue;                                                   \
    return Answer(h, Panel(side == 0 ? n : m), lwork);                        \
  }                                                                           \
  LIB int cusolverDn##P##ormqr(void* h, int side, int trans, int m, int n,    \
                               int k, const void* a, int lda,                 \
                               const void* tau, void* c, int ldc, void* work, \
                               int lwork, int* info) {                        \
    ENTER();                                                                  \
    if (side < 0 || side > 1 || trans < 0 || trans > 2) return kInvalidValue; \
    const int rows = side == 0 ? m : n;                                       \
    return Run(h, {{a, MatrixBytes(rows, k, lda, E)},                         \
                   {tau, std::int64_t{k} * (E)},                              \
                   {c, MatrixBytes(m, n, ldc, E)},                            \
                   Work(work, lwork, Panel(side == 0 ? n : m), E),            \
                   Info(info)});                                              \
  }                                                                           \
  LIB int cusolverDn##P##potrf_bufferSize(void* h, int uplo, int n, void*,   \
                                          int lda, int* lwork) {             \
    ENTER();                                                                  \
    if (uplo < 0 || uplo > 1 || n < 0 || lda < std::max(1, n))                \
      return kInvalidValue;                                                   \
    return Answer(h, Panel(n), lwork);                                        \
  }                                                                           \
  LIB int cusolverDn##P##potrf(void* h, int uplo, int n, void* a, int lda,    \
                               void* work, int lwork, int* info) {            \
    ENTER();                                                                  \
    if (uplo < 0 || uplo > 1) return kInvalidValue;                           \
    return Run(h, {{a, MatrixBytes(n, n, lda, E)},                            \
                   Work(work, lwork, Panel(n), E), Info(info)});              \
  }                                                                           \
  /* The pointer array is device memory; its pointers are written by a       \
     kernel, which does not run in the fake, so they are not read. */         \
  LIB int cusolverDn##P##potrfBatched(void* h, int uplo, int n, void** a,     \
                                      int lda, int* info, int batch) {        \
    ENTER();                                                                  \
    if (uplo < 0 || uplo > 1 || n < 0 || lda < std::max(1, n) || batch < 0)   \
      return kInvalidValue;                                                   \
    return Run(h, {{a, 8 * std::int64_t{batch}}, Info(info, batch)});         \
  }                                                                           \
  LIB int cusolverDn##P##potrs(void* h, int uplo, int n, int nrhs,            \
                               const void* a, int lda, void* b, int ldb,      \
                               int* info) {                                   \
    ENTER();                                                                  \
    if (uplo < 0 || uplo > 1) return kInvalidValue;                           \
    return Run(h, {{a, MatrixBytes(n, n, lda, E)},                            \
                   {b, MatrixBytes(n, nrhs, ldb, E)}, Info(info)});           \
  }                                                                           \
  LIB int cusolverDn##P##syevd##_bufferSize(void* h, int jobz, int uplo,      \
                                            int n, const void*, int lda,      \
                                            const void*, int* lwork) {        \
    ENTER();                                                                  \
    if (!Jobz(jobz) || uplo < 0 || uplo > 1 || n < 0 || lda < std::max(1, n)) \
      return kInvalidValue;                                                   \
    return Answer(h, Syevd(jobz, n), lwork);                                  \
  }                                                                           \
  LIB int cusolverDn##P##syevd(void* h, int jobz, int uplo, int n, void* a,   \
                               int lda, void* w, void* work, int lwork,       \
                               int* info) {                                   \
    ENTER();                                                                  \
    if (!Jobz(jobz) || uplo < 0 || uplo > 1) return kInvalidValue;            \
    return Run(h, {{a, MatrixBytes(n, n, lda, E)},                            \
                   {w, std::int64_t{n} * (R)},                                \
                   Work(work, lwork, Syevd(jobz, n), E), Info(info)});        \
  }                                                                           \
  LIB int cusolverDn##P##syevj##_bufferSize(                                  \
      void* h, int jobz, int uplo, int n, const void*, int lda, const void*,  \
      int* lwork, void* params) {                                             \
    ENTER();                                                                  \
    if (!Jobz(jobz) || uplo < 0 || uplo > 1 || n < 0 ||                      \
        lda < std::max(1, n) || !JacobiKnown(SyevjInfos(), params))           \
      return kInvalidValue;                                                   \
    return Answer(h, Syevj(n), lwork);                                        \
  }                                                                           \
  LIB int cusolverDn##P##syevj(void* h, int jobz, int uplo, int n, void* a,   \
                               int lda, void* w, void* work, int lwork,       \
                               int* info, void* params) {                     \
    ENTER();                                                                  \
    if (!Jobz(jobz) || uplo < 0 || uplo > 1 ||                                \
        !JacobiKnown(SyevjInfos(), params))                                   \
      return kInvalidValue;                                                   \
    return Run(h, {{a, MatrixBytes(n, n, lda, E)},                            \
                   {w, std::int64_t{n} * (R)},                                \
                   Work(work, lwork, Syevj(n), E), Info(info)});              \
  }                                                                           \
  LIB int cusolverDn##P##syevj##Batched_bufferSize(                           \
      void* h, int jobz, int uplo, int n, const void*, int lda, const void*,  \
      int* lwork, void* params, int batch) {                                  \
    ENTER();                                                                  \
    if (!Jobz(jobz) || uplo < 0 || uplo > 1 || n < 0 || n > 32 ||             \
        lda < std::max(1, n) || batch < 0 ||                                  \
        !JacobiKnown(SyevjInfos(), params))                                   \
      return kInvalidValue;                                                   \
    return Answer(h, Syevj(n) * batch, lwork);                                \
  }                                                                           \
  LIB int cusolverDn##P##syevj##Batched(void* h, int jobz, int uplo, int n,   \
                                        void* a, int lda, void* w,            \
                                        void* work, int lwork, int* info,     \
                                        void* params, int batch) {            \
    ENTER();                                                                  \
    if (!Jobz(jobz) || uplo < 0 || uplo > 1 || n > 32 || batch < 0 ||         \
        !JacobiKnown(SyevjInfos(), params))                                   \
      return kInvalidValue;                                                   \
    const std::int64_t one = MatrixBytes(n, n, lda, E);                       \
    return Run(h, {{a, one < 0 ? -1 : one * batch},                           \
                   {w, std::int64_t{n} * batch * (R)},                        \
                   Work(work, lwork, Syevj(n) * batch, E),                    \
                   Info(info, batch)});                                       \
  }                                                                           \
  LIB int cusolverDn##P##gesvd_bufferSize(void* h, int m, int n,              \
                                          int* lwork) {                       \
    ENTER();                                                                  \
    if (m < 0 || n < 0) return kInvalidValue;                                 \
    return Answer(h, Gesvd(m, n), lwork);                                     \
  }                                                                           \
  /* jobu/jobvt 'A', 'S', 'O' or 'N'; U and VT are read only when asked. */   \
  LIB int cusolverDn##P##gesvd(void* h, signed char jobu, signed char jobvt,  \
                               int m, int n, void* a, int lda, void* s,       \
                               void* u, int ldu, void* vt, int ldvt,          \
                               void* work, int lwork, void*, int* info) {     \
    ENTER();                                                                  \
    const std::int64_t lo = std::min(m, n);                                   \
    const std::int64_t ucols = jobu == 'A' ? m : jobu == 'S' ? lo : 0;        \
    const std::int64_t vrows = jobvt == 'A' ? n : jobvt == 'S' ? lo : 0;      \
    return Run(h, {{a, MatrixBytes(m, n, lda, E)}, {s, lo * (R)},             \
                   {u, ucols ? MatrixBytes(m, ucols, ldu, E) : 0},            \
                   {vt, vrows ? MatrixBytes(vrows, n, ldvt, E) : 0},          \
                   Work(work, lwork, Gesvd(m, n), E), Info(info)});           \
  }                                                                           \
  LIB int cusolverDn##P##gesvdj_bufferSize(                                   \
      void* h, int jobz, int, int m, int n, const void*, int lda,             \
      const void*, const void*, int, const void*, int, int* lwork,            \
      void* params) {                                                         \
    ENTER();                                                                  \
    if (!Jobz(jobz) || m < 0 || n < 0 || lda < std::max(1, m) ||              \
        !JacobiKnown(GesvdjInfos(), params))                                  \
      return kInvalidValue;                                                   \
    return Answer(h, Gesvdj(m, n), lwork);                                    \
  }                                                                           \
  LIB int cusolverDn##P##gesvdj(void* h, int jobz, int econ, int m, int n,    \
                                void* a, int lda, void* s, void* u, int ldu,  \
                                void* v, int ldv, void* work, int lwork,      \
                                int* info, void* params) {                    \
    ENTER();                                                                  \
    if (!Jobz(jobz) || !JacobiKnown(GesvdjInfos(), params))                   \
      return kInvalidValue;                                                   \
    const std::int64_t lo = std::min(m, n);                                   \
    const std::int64_t uc = econ ? lo : m, vc = econ ? lo : n;                \
    return Run(h, {{a, MatrixBytes(m, n, lda, E)}, {s, lo * (R)},             \
                   {u, jobz ? MatrixBytes(m, uc, ldu, E) : 0},                \
                   {v, jobz ? MatrixBytes(n, vc, ldv, E) : 0},                \
                   Work(work, lwork, Gesvdj(m, n), E), Info(info)});          \
  }                                                                           \
  LIB int cusolverDn##P##gesvdjBatched_bufferSize(                            \
      void* h, int jobz, int m, int n, const void*, int lda, const void*,     \
      const void*, int, const void*, int, int* lwork, void* params,           \
      int batch) {                                                            \
    ENTER();                                                                  \
    if (!Jobz(jobz) || m < 0 || n < 0 || m > 32 || n > 32 ||                  \
        lda < std::max(1, m) || batch < 0 ||                                  \
        !JacobiKnown(GesvdjInfos(), params))                                  \
      return kInvalidValue;                                                   \
    return Answer(h, Gesvdj(m, n) * batch, lwork);                            \
  }                                                                           \
  LIB int cusolverDn##P##gesvdjBatched(                                       \
      void* h, int jobz, int m, int n, void* a, int lda, void* s, void* u,    \
      int ldu, void* v, int ldv, void* work, int lwork, int* info,            \
      void* params, int batch) {                                              \
    ENTER();                                                                  \
    if (!Jobz(jobz) || m > 32 || n > 32 || batch < 0 ||                       \
        !JacobiKnown(GesvdjInfos(), params))                                  \
      return kInvalidValue;                                                   \
    const std::int64_t lo = std::min(m, n);                                   \
    const std::int64_t am = MatrixBytes(m, n, lda, E);                        \
    const std::int64_t um = jobz ? MatrixBytes(m, m, ldu, E) : 0;             \
    const std::int64_t vm = jobz ? MatrixBytes(n, n, ldv, E) : 0;             \
    return Run(h, {{a, am < 0 ? -1 : am * batch}, {s, lo * batch * (R)},      \
                   {u, um < 0 ? -1 : um * batch},                             \
                   {v, vm < 0 ? -1 : vm * batch},                             \
                   Work(work, lwork, Gesvdj(m, n) * batch, E),                \
                   Info(info, batch)});                                       \
  }                                                                           \
  LIB int cusolverDn##P##sytrd##_bufferSize(void* h, int uplo, int n,         \
                                            const void*, int lda,             \
                                            const void*, const void*,         \
                                            const void*, int* lwork) {        \
    ENTER();                                                                  \
    if (uplo < 0 || uplo > 1 || n < 0 || lda < std::max(1, n))                \
      return kInvalidValue;                                                   \
    return Answer(h, Panel(n), lwork);                                        \
  }                                                                           \
  LIB int cusolverDn##P##sytrd(void* h, int uplo, int n, void* a, int lda,    \
                               void* d, void* e, void* tau, void* work,       \
                               int lwork, int* info) {                        \
    ENTER();                                                                  \
    if (uplo < 0 || uplo > 1) return kInvalidValue;                           \
    const std::int64_t off = std::max(n - 1, 0);                              \
    return Run(h, {{a, MatrixBytes(n, n, lda, E)}, {d, std::int64_t{n} * (R)},\
                   {e, off * (R)}, {tau, off * (E)},                          \
                   Work(work, lwork, Panel(n), E), Info(info)});              \
  }

JAXLAKE_CUSOLVER_LEGACY(S, 4, 4, orgqr, ormqr, syevd, syevj, sytrd)
JAXLAKE_CUSOLVER_LEGACY(D, 8, 8, orgqr, ormqr, syevd, syevj, sytrd)
JAXLAKE_CUSOLVER_LEGACY(C, 8, 4, ungqr, unmqr, heevd, heevj, hetrd)
JAXLAKE_CUSOLVER_LEGACY(Z, 16, 8, ungqr, unmqr, heevd, heevj, hetrd)

// ---- the 64-bit API -------------------------------------------------------
//
// Each takes cudaDataType arguments; the workspace counts bytes. A real
// eigenvalue or singular value type is half a complex data type.

namespace {
bool ParamsKnown(void* params) {
  return AllParams().With(params, 0, [](Params&) { return 1; }) == 1;
}
std::int64_t Bytes(int type) {
  return static_cast<std::int64_t>(fg::DataTypeBytes(type));
}
// A device workspace of `bytes` that must hold `needed` elements of `type`.
Buf WorkBytes(const void* p, std::size_t bytes, std::int64_t needed,
              int type) {
  if (static_cast<std::int64_t>(bytes) < needed * Bytes(type)) return {p, -1};
  return {p, static_cast<std::int64_t>(bytes)};
}
}  // namespace

LIB int cusolverDnXsyevd_bufferSize(void* h, void* params, int jobz, int uplo,
                                    std::int64_t n, int type_a, const void*,
                                    std::int64_t lda, int type_w, const void*,
                                    int compute, std::size_t* device,
                                    std::size_t* host) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobz) || uplo < 0 || uplo > 1 || n < 0 ||
      lda < std::max<std::int64_t>(1, n) || Bytes(type_a) == 0 ||
      Bytes(type_w) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Syevd(jobz, n), compute, device, host);
}

LIB int cusolverDnXsyevd(void* h, void* params, int jobz, int uplo,
                         std::int64_t n, int type_a, void* a,
                         std::int64_t lda, int type_w, void* w, int compute,
                         void* work, std::size_t work_bytes, void*,
                         std::size_t, int* info) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobz) || uplo < 0 || uplo > 1)
    return kInvalidValue;
  return Run(h, {{a, MatrixBytes(n, n, lda, fg::DataTypeBytes(type_a))},
                 {w, n * Bytes(type_w)},
                 WorkBytes(work, work_bytes, Syevd(jobz, n), compute),
                 Info(info)});
}

LIB int cusolverDnXsyevBatched_bufferSize(
    void* h, void* params, int jobz, int uplo, std::int64_t n, int type_a,
    const void*, std::int64_t lda, int type_w, const void*, int compute,
    std::size_t* device, std::size_t* host, std::int64_t batch) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobz) || uplo < 0 || uplo > 1 || n < 0 ||
      lda < std::max<std::int64_t>(1, n) || batch < 0 ||
      Bytes(type_a) == 0 || Bytes(type_w) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Syevd(jobz, n) * batch, compute, device, host);
}

LIB int cusolverDnXsyevBatched(void* h, void* params, int jobz, int uplo,
                               std::int64_t n, int type_a, void* a,
                               std::int64_t lda, int type_w, void* w,
                               int compute, void* work,
                               std::size_t work_bytes, void*, std::size_t,
                               int* info, std::int64_t batch) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobz) || uplo < 0 || uplo > 1 ||
      batch < 0)
    return kInvalidValue;
  const std::int64_t one = MatrixBytes(n, n, lda, fg::DataTypeBytes(type_a));
  return Run(h, {{a, one < 0 ? -1 : one * batch},
                 {w, n * batch * Bytes(type_w)},
                 WorkBytes(work, work_bytes, Syevd(jobz, n) * batch, compute),
                 Info(info, batch)});
}

LIB int cusolverDnXgesvd_bufferSize(
    void* h, void* params, signed char, signed char, std::int64_t m,
    std::int64_t n, int type_a, const void*, std::int64_t lda, int type_s,
    const void*, int, const void*, std::int64_t, int, const void*,
    std::int64_t, int compute, std::size_t* device, std::size_t* host) {
  ENTER();
  if (!ParamsKnown(params) || m < 0 || n < 0 ||
      lda < std::max<std::int64_t>(1, m) || Bytes(type_a) == 0 ||
      Bytes(type_s) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Gesvd(m, n), compute, device, host);
}

LIB int cusolverDnXgesvd(void* h, void* params, signed char jobu,
                         signed char jobvt, std::int64_t m, std::int64_t n,
                         int type_a, void* a, std::int64_t lda, int type_s,
                         void* s, int type_u, void* u, std::int64_t ldu,
                         int type_vt, void* vt, std::int64_t ldvt, int compute,
                         void* work, std::size_t work_bytes, void*,
                         std::size_t, int* info) {
  ENTER();
  if (!ParamsKnown(params)) return kInvalidValue;
  const std::int64_t lo = std::min(m, n);
  const std::int64_t ucols = jobu == 'A' ? m : jobu == 'S' ? lo : 0;
  const std::int64_t vrows = jobvt == 'A' ? n : jobvt == 'S' ? lo : 0;
  return Run(
      h, {{a, MatrixBytes(m, n, lda, fg::DataTypeBytes(type_a))},
          {s, lo * Bytes(type_s)},
          {u, ucols ? MatrixBytes(m, ucols, ldu, fg::DataTypeBytes(type_u)) : 0},
          {vt, vrows ? MatrixBytes(vrows, n, ldvt, fg::DataTypeBytes(type_vt))
                     : 0},
          WorkBytes(work, work_bytes, Gesvd(m, n), compute), Info(info)});
}

LIB int cusolverDnXgesvdp_bufferSize(
    void* h, void* params, int jobz, int, std::int64_t m, std::int64_t n,
    int type_a, const void*, std::int64_t lda, int type_s, const void*, int,
    const void*, std::int64_t, int, const void*, std::int64_t, int compute,
    std::size_t* device, std::size_t* host) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobz) || m < 0 || n < 0 ||
      lda < std::max<std::int64_t>(1, m) || Bytes(type_a) == 0 ||
      Bytes(type_s) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Gesvdj(m, n), compute, device, host);
}

LIB int cusolverDnXgesvdp(void* h, void* params, int jobz, int econ,
                          std::int64_t m, std::int64_t n, int type_a, void* a,
                          std::int64_t lda, int type_s, void* s, int type_u,
                          void* u, std::int64_t ldu, int type_v, void* v,
                          std::int64_t ldv, int compute, void* work,
                          std::size_t work_bytes, void*, std::size_t,
                          int* info, double* err_sigma) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobz) || err_sigma == nullptr)
    return kInvalidValue;
  const std::int64_t lo = std::min(m, n);
  const std::int64_t uc = econ ? lo : m, vc = econ ? lo : n;
  const int r = Run(
      h, {{a, MatrixBytes(m, n, lda, fg::DataTypeBytes(type_a))},
          {s, lo * Bytes(type_s)},
          {u, jobz ? MatrixBytes(m, uc, ldu, fg::DataTypeBytes(type_u)) : 0},
          {v, jobz ? MatrixBytes(n, vc, ldv, fg::DataTypeBytes(type_v)) : 0},
          WorkBytes(work, work_bytes, Gesvdj(m, n), compute), Info(info)});
  if (r == kSuccess) *err_sigma = 0;
  return r;
}

LIB int cusolverDnXgeev_bufferSize(
    void* h, void* params, int jobvl, int jobvr, std::int64_t n, int type_a,
    const void*, std::int64_t lda, int type_w, const void*, int, const void*,
    std::int64_t, int, const void*, std::int64_t, int compute,
    std::size_t* device, std::size_t* host) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobvl) || !Jobz(jobvr) || n < 0 ||
      lda < std::max<std::int64_t>(1, n) || Bytes(type_a) == 0 ||
      Bytes(type_w) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Geev(n), compute, device, host);
}

LIB int cusolverDnXgeev(void* h, void* params, int jobvl, int jobvr,
                        std::int64_t n, int type_a, void* a, std::int64_t lda,
                        int type_w, void* w, int type_vl, void* vl,
                        std::int64_t ldvl, int type_vr, void* vr,
                        std::int64_t ldvr, int compute, void* work,
                        std::size_t work_bytes, void*, std::size_t,
                        int* info) {
  ENTER();
  if (!ParamsKnown(params) || !Jobz(jobvl) || !Jobz(jobvr))
    return kInvalidValue;
  return Run(
      h, {{a, MatrixBytes(n, n, lda, fg::DataTypeBytes(type_a))},
          {w, n * Bytes(type_w)},
          {vl, jobvl ? MatrixBytes(n, n, ldvl, fg::DataTypeBytes(type_vl)) : 0},
          {vr, jobvr ? MatrixBytes(n, n, ldvr, fg::DataTypeBytes(type_vr)) : 0},
          WorkBytes(work, work_bytes, Geev(n), compute), Info(info)});
}

LIB int cusolverDnXpotrf_bufferSize(void* h, void* params, int uplo,
                                    std::int64_t n, int type_a, const void*,
                                    std::int64_t lda, int compute,
                                    std::size_t* device, std::size_t* host) {
  ENTER();
  if (!ParamsKnown(params) || uplo < 0 || uplo > 1 || n < 0 ||
      lda < std::max<std::int64_t>(1, n) || Bytes(type_a) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Panel(n), compute, device, host);
}

LIB int cusolverDnXpotrf(void* h, void* params, int uplo, std::int64_t n,
                         int type_a, void* a, std::int64_t lda, int compute,
                         void* work, std::size_t work_bytes, void*,
                         std::size_t, int* info) {
  ENTER();
  if (!ParamsKnown(params) || uplo < 0 || uplo > 1) return kInvalidValue;
  return Run(h, {{a, MatrixBytes(n, n, lda, fg::DataTypeBytes(type_a))},
                 WorkBytes(work, work_bytes, Panel(n), compute), Info(info)});
}

LIB int cusolverDnXgetrf_bufferSize(void* h, void* params, std::int64_t m,
                                    std::int64_t n, int type_a, const void*,
                                    std::int64_t lda, int compute,
                                    std::size_t* device, std::size_t* host) {
  ENTER();
  if (!ParamsKnown(params) || m < 0 || n < 0 ||
      lda < std::max<std::int64_t>(1, m) || Bytes(type_a) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Panel(n), compute, device, host);
}

LIB int cusolverDnXgetrf(void* h, void* params, std::int64_t m, std::int64_t n,
                         int type_a, void* a, std::int64_t lda,
                         std::int64_t* ipiv, int compute, void* work,
                         std::size_t work_bytes, void*, std::size_t,
                         int* info) {
  ENTER();
  if (!ParamsKnown(params)) return kInvalidValue;
  // ipiv may be null: no pivoting.
  return Run(h, {{a, MatrixBytes(m, n, lda, fg::DataTypeBytes(type_a))},
                 {ipiv, ipiv == nullptr ? 0 : 8 * std::min(m, n)},
                 WorkBytes(work, work_bytes, Panel(n), compute), Info(info)});
}

LIB int cusolverDnXgeqrf_bufferSize(void* h, void* params, std::int64_t m,
                                    std::int64_t n, int type_a, const void*,
                                    std::int64_t lda, int type_tau,
                                    const void*, int compute,
                                    std::size_t* device, std::size_t* host) {
  ENTER();
  if (!ParamsKnown(params) || m < 0 || n < 0 ||
      lda < std::max<std::int64_t>(1, m) || Bytes(type_a) == 0 ||
      Bytes(type_tau) == 0)
    return kInvalidValue;
  return AnswerBytes(h, Panel(n), compute, device, host);
}

LIB int cusolverDnXgeqrf(void* h, void* params, std::int64_t m, std::int64_t n,
                         int type_a, void* a, std::int64_t lda, int type_tau,
                         void* tau, int compute, void* work,
                         std::size_t work_bytes, void*, std::size_t,
                         int* info) {
  ENTER();
  if (!ParamsKnown(params)) return kInvalidValue;
  return Run(h, {{a, MatrixBytes(m, n, lda, fg::DataTypeBytes(type_a))},
                 {tau, std::min(m, n) * Bytes(type_tau)},
                 WorkBytes(work, work_bytes, Panel(n), compute), Info(info)});
}
