// The fake GPU's cuBLAS routines, by NVIDIA's names and signatures
// (cublas_api.h): level 1, 2 and 3 in the four precisions (S, D, C, Z), with
// their 64-bit-size variants (`_64`), the batched and strided-batched
// products, and the batched LU, inverse, QR and triangular solves. They are
// kernels, which do not run: each checks its handle (an unknown one is
// CUBLAS_STATUS_NOT_INITIALIZED), its sizes, increments, leading dimensions
// and enums, that its scalars are there (device memory in the device pointer
// mode), and that its matrices and vectors are device memory of the fake with
// the bytes its arguments give (CUBLAS_STATUS_INVALID_VALUE otherwise), and
// computes nothing. A batched routine's pointer arrays are checked as device
// memory of batch pointers; their entries are not read, since the callers
// fill them with kernels (jaxlib's and XLA's make_batch_pointers), which do
// not run. Results a routine writes on the host are written where they
// report on the arguments (the `info` of geqrfBatched, getrsBatched and
// gelsBatched: 0, or -i for the i-th argument invalid); computed results
// (dot products, norms, a pivot's index) are not.
//
// The pointers are `const void*` here: the fake reads none of the elements,
// and only their sizes (an element of S 4 bytes, D 8, C 8, Z 16) differ
// between the precisions.
#include <cstdint>

#include "cc/fakegpu/cublas.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/fakegpu/libs.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

constexpr int kSuccess = 0, kNotInitialized = 1, kInvalidValue = 7;

using P = const void*;
using I64 = std::int64_t;

// The checks of one call, in order; the first that fails sets the status
// (and, numbered with At(), which argument failed).
class Check {
 public:
  explicit Check(P handle) : mode_(fg::CublasPointerMode(handle)) {
    if (mode_ < 0) status_ = kNotInitialized;
  }

  // The position (1-based, the handle being 1) of the arguments the next
  // checks are about, for the routines that report it in `info`.
  Check& At(int arg) {
    arg_ = arg;
    return *this;
  }
  Check& Dim(I64 n) { return Ok(n >= 0); }
  Check& Inc(I64 inc) { return Ok(inc != 0); }
  // cublasOperation_t N, T, C; cublasFillMode_t lower, upper;
  // cublasSideMode_t left, right; cublasDiagType_t non-unit, unit.
  Check& Op(int op) { return Ok(op >= 0 && op <= 2); }
  Check& Fill(int uplo) { return Ok(uplo == 0 || uplo == 1); }
  Check& Side(int side) { return Ok(side == 0 || side == 1); }
  Check& Diag(int diag) { return Ok(diag == 0 || diag == 1); }
  Check& Ld(I64 ld, I64 rows) { return Ok(ld >= (rows > 1 ? rows : 1)); }
  Check& NonNull(P p) { return Ok(p != nullptr); }
  Check& AtMost(I64 n, I64 most) { return Ok(n <= most); }

  // A scalar argument: on the host or, in the device pointer mode, device
  // memory of `bytes`.
  Check& Scalar(P p, std::size_t bytes) {
    return Ok(p != nullptr && (mode_ == 0 || fg::DeviceBytes(p, bytes)));
  }
  // `count` column-major rows x cols matrices with leading dimension ld,
  // `stride` elements of `elem` bytes apart, in device memory (nothing is
  // asked of an empty one).
  Check& Matrix(P p, I64 rows, I64 cols, I64 ld, std::size_t elem,
                I64 count = 1, I64 stride = 0) {
    Ld(ld, rows).Ok(stride >= 0);
    if (status_ != kSuccess || rows <= 0 || cols <= 0 || count <= 0)
      return *this;
    std::uint64_t elems = 0;  // ld (cols - 1) + rows
    if (!Ok(MulAdd(ld, cols - 1, rows, &elems))) return *this;
    return Bytes(p, elems, elem, count, stride);
  }
  // `count` vectors of n elements, inc apart (0: one element, as level 1
  // allows), `stride` elements apart.
  Check& Vector(P p, I64 n, I64 inc, std::size_t elem, I64 count = 1,
                I64 stride = 0) {
    Ok(stride >= 0);
    if (status_ != kSuccess || n <= 0 || count <= 0) return *this;
    std::uint64_t elems = 0;  // |inc| (n - 1) + 1
    if (!Ok(MulAdd(inc < 0 ? -inc : inc, n - 1, 1, &elems))) return *this;
    return Bytes(p, elems, elem, count, stride);
  }
  // A batch's array of `count` pointers, in device memory.
  Check& Array(P p, I64 count) {
    if (status_ != kSuccess || !Ok(count >= 0) || count == 0) return *this;
    return Ok(fg::DeviceBytes(p, static_cast<std::uint64_t>(count) *
                                     sizeof(void*)));
  }
  // `count` device arrays of n ints (pivots, infos).
  Check& Ints(P p, I64 n, I64 count) {
    if (status_ != kSuccess || n <= 0 || count <= 0) return *this;
    return Bytes(p, static_cast<std::uint64_t>(n), sizeof(int), count, n);
  }

  int status() const { return status_; }
  // 0, or -i for the i-th argument invalid (cuBLAS's host `info`).
  int info() const { return status_ == kSuccess ? 0 : -failed_at_; }

 private:
  Check& Ok(bool ok) {
    if (status_ == kSuccess && !ok) {
      status_ = kInvalidValue;
      failed_at_ = arg_;
    }
    return *this;
  }
  explicit operator bool() const { return status_ == kSuccess; }
  // *out = a b + c, false on overflow (a, b, c >= 0).
  static bool MulAdd(I64 a, I64 b, I64 c, std::uint64_t* out) {
    std::uint64_t ab = 0;
    return !__builtin_mul_overflow(static_cast<std::uint64_t>(a),
                                   static_cast<std::uint64_t>(b), &ab) &&
           !__builtin_add_overflow(ab, static_cast<std::uint64_t>(c), out);
  }
  // `count` spans of `elems` elements of `elem` bytes, `stride` elements
  // apart, from p: (stride (count - 1) + elems) elem bytes of device memory.
  Check& Bytes(P p, std::uint64_t elems, std::size_t elem, I64 count,
               I64 stride) {
    std::uint64_t n = 0, bytes = 0;
    return Ok(MulAdd(stride, count - 1, static_cast<I64>(elems), &n) &&
              n <= static_cast<std::uint64_t>(INT64_MAX) &&
              !__builtin_mul_overflow(n, elem, &bytes) &&
              fg::DeviceBytes(p, bytes));
  }

  int mode_;
  int status_ = kSuccess;
  int arg_ = 0;
  int failed_at_ = 0;
};

// Rows of op(X) stored: X is r x c, op(X) is r x c (N) or c x r (T, C).
I64 Stored(int op, I64 rows_of_op, I64 cols_of_op) {
  return op == 0 ? rows_of_op : cols_of_op;
}
I64 StoredCols(int op, I64 rows_of_op, I64 cols_of_op) {
  return op == 0 ? cols_of_op : rows_of_op;
}

// ---- level 1 ----------------------------------------------------------------
//
// As the reference BLAS, a routine of n <= 0 elements returns at once, and
// an increment of 0 is allowed (cuBLAS names no INVALID_VALUE for them).

template <typename I>
int Xy(P h, I n, P x, I incx, P y, I incy, std::size_t e) {  // copy, swap
  if (n <= 0) return Check(h).status();
  return Check(h).Vector(x, n, incx, e).Vector(y, n, incy, e).status();
}
template <typename I>
int Axpy(P h, I n, P alpha, P x, I incx, P y, I incy, std::size_t e) {
  if (n <= 0) return Check(h).status();
  return Check(h).Scalar(alpha, e).Vector(x, n, incx, e)
      .Vector(y, n, incy, e).status();
}
template <typename I>
int Scal(P h, I n, P alpha, std::size_t alpha_bytes, P x, I incx,
         std::size_t e) {
  if (n <= 0) return Check(h).status();
  return Check(h).Scalar(alpha, alpha_bytes).Vector(x, n, incx, e).status();
}
// dot, nrm2, asum, amax, amin: the result (of `r` bytes) is a scalar.
template <typename I>
int Reduce(P h, I n, P x, I incx, P y, I incy, P result, std::size_t r,
           std::size_t e) {
  Check c(h);
  c.Scalar(result, r);
  if (n <= 0) return c.status();
  c.Vector(x, n, incx, e);
  if (y != nullptr || incy != 0) c.Vector(y, n, incy, e);
  return c.status();
}
template <typename I>
int Rot(P h, I n, P x, I incx, P y, I incy, P cos, P sin, std::size_t e,
        std::size_t real, std::size_t sin_bytes) {
  if (n <= 0) return Check(h).status();
  return Check(h).Vector(x, n, incx, e).Vector(y, n, incy, e)
      .Scalar(cos, real).Scalar(sin, sin_bytes).status();
}

// ---- level 2 ----------------------------------------------------------------
//
// An increment of 0 is CUBLAS_STATUS_INVALID_VALUE here.

template <typename I>
int Gemv(P h, int trans, I m, I n, P alpha, P a, I lda, P x, I incx, P beta,
         P y, I incy, std::size_t e) {
  const I xn = trans == 0 ? n : m, yn = trans == 0 ? m : n;
  return Check(h).Op(trans).Dim(m).Dim(n).Inc(incx).Inc(incy)
      .Scalar(alpha, e).Scalar(beta, e).Matrix(a, m, n, lda, e).Vector(x, xn, incx, e).Vector(y, yn, incy, e)
      .status();
}
template <typename I>
int Ger(P h, I m, I n, P alpha, P x, I incx, P y, I incy, P a, I lda,
        std::size_t e) {
  return Check(h).Dim(m).Dim(n).Inc(incx).Inc(incy).Scalar(alpha, e)
      .Vector(x, m, incx, e)
      .Vector(y, n, incy, e).Matrix(a, m, n, lda, e).status();
}
// symv, hemv
template <typename I>
int Symv(P h, int uplo, I n, P alpha, P a, I lda, P x, I incx, P beta, P y,
         I incy, std::size_t e) {
  return Check(h).Fill(uplo).Dim(n).Inc(incx).Inc(incy).Scalar(alpha, e)
      .Scalar(beta, e).Matrix(a, n, n, lda, e).Vector(x, n, incx, e).Vector(y, n, incy, e)
      .status();
}
// syr, her (alpha of `ab` bytes)
template <typename I>
int Syr(P h, int uplo, I n, P alpha, std::size_t ab, P x, I incx, P a, I lda,
        std::size_t e) {
  return Check(h).Fill(uplo).Dim(n).Inc(incx).Scalar(alpha, ab)
      .Vector(x, n, incx, e)
      .Matrix(a, n, n, lda, e).status();
}
// syr2, her2
template <typename I>
int Syr2(P h, int uplo, I n, P alpha, P x, I incx, P y, I incy, P a, I lda,
         std::size_t e) {
  return Check(h).Fill(uplo).Dim(n).Inc(incx).Inc(incy).Scalar(alpha, e)
      .Vector(x, n, incx, e).Vector(y, n, incy, e).Matrix(a, n, n, lda, e)
      .status();
}
// trmv, trsv
template <typename I>
int Trmv(P h, int uplo, int trans, int diag, I n, P a, I lda, P x, I incx,
         std::size_t e) {
  return Check(h).Fill(uplo).Op(trans).Diag(diag).Dim(n).Inc(incx)
      .Matrix(a, n, n, lda, e).Vector(x, n, incx, e).status();
}

// ---- level 3 ----------------------------------------------------------------

// gemm: `count` products, strided (arrays null) or through pointer arrays.
template <typename I>
int Gemm(P h, int ta, int tb, I m, I n, I k, P alpha, P a, I lda, I64 sa,
         P b, I ldb, I64 sb, P beta, P c, I ldc, I64 sc, std::size_t e,
         I64 count = 1, bool arrays = false) {
  Check ck(h);
  ck.Op(ta).Op(tb).Dim(m).Dim(n).Dim(k).Dim(count).Scalar(alpha, e)
      .Scalar(beta, e);
  if (arrays) {
    ck.Ld(lda, Stored(ta, m, k)).Ld(ldb, Stored(tb, k, n)).Ld(ldc, m)
        .Array(a, count).Array(b, count).Array(c, count);
  } else {
    ck.Matrix(a, Stored(ta, m, k), StoredCols(ta, m, k), lda, e, count, sa)
        .Matrix(b, Stored(tb, k, n), StoredCols(tb, k, n), ldb, e, count, sb)
        .Matrix(c, m, n, ldc, e, count, sc);
  }
  return ck.status();
}
// trsm (C null) and trmm (out of place into C)
template <typename I>
int Trsm(P h, int side, int uplo, int trans, int diag, I m, I n, P alpha, P a,
         I lda, P b, I ldb, P c, I ldc, std::size_t e, I64 count = 1,
         bool arrays = false) {
  const I ka = side == 0 ? m : n;
  Check ck(h);
  ck.Side(side).Fill(uplo).Op(trans).Diag(diag).Dim(m).Dim(n).Dim(count)
      .Scalar(alpha, e);
  if (arrays) {
    ck.Ld(lda, ka).Ld(ldb, m).Array(a, count).Array(b, count);
  } else {
    ck.Matrix(a, ka, ka, lda, e).Matrix(b, m, n, ldb, e);
    if (c != nullptr || ldc != 0) ck.Matrix(c, m, n, ldc, e);
  }
  return ck.status();
}
// syrk, herk; syr2k, her2k, syrkx, herkx (`two`: b given). beta has `sb`
// bytes (real for the Hermitian ones), and so has herk's alpha; the others'
// alpha is of the element type.
template <typename I>
int Syrk(P h, int uplo, int trans, I n, I k, P alpha, P a, I lda, P b, I ldb,
         P beta, std::size_t sb, P c, I ldc, std::size_t e, bool two) {
  Check ck(h);
  ck.Fill(uplo).Op(trans).Dim(n).Dim(k).Scalar(alpha, two ? e : sb)
      .Scalar(beta, sb)
      .Matrix(a, Stored(trans, n, k), StoredCols(trans, n, k), lda, e);
  if (two) ck.Matrix(b, Stored(trans, n, k), StoredCols(trans, n, k), ldb, e);
  return ck.Matrix(c, n, n, ldc, e).status();
}
// symm, hemm
template <typename I>
int Symm(P h, int side, int uplo, I m, I n, P alpha, P a, I lda, P b, I ldb,
         P beta, P c, I ldc, std::size_t e) {
  const I ka = side == 0 ? m : n;
  return Check(h).Side(side).Fill(uplo).Dim(m).Dim(n).Scalar(alpha, e)
      .Scalar(beta, e).Matrix(a, ka, ka, lda, e).Matrix(b, m, n, ldb, e)
      .Matrix(c, m, n, ldc, e).status();
}
template <typename I>
int Geam(P h, int ta, int tb, I m, I n, P alpha, P a, I lda, P beta, P b,
         I ldb, P c, I ldc, std::size_t e) {
  return Check(h).Op(ta).Op(tb).Dim(m).Dim(n).Scalar(alpha, e)
      .Scalar(beta, e)
      .Matrix(a, Stored(ta, m, n), StoredCols(ta, m, n), lda, e)
      .Matrix(b, Stored(tb, m, n), StoredCols(tb, m, n), ldb, e)
      .Matrix(c, m, n, ldc, e).status();
}
template <typename I>
int Dgmm(P h, int side, I m, I n, P a, I lda, P x, I incx, P c, I ldc,
         std::size_t e) {
  return Check(h).Side(side).Dim(m).Dim(n).Matrix(a, m, n, lda, e)
      .Vector(x, side == 0 ? m : n, incx, e)
      .Matrix(c, m, n, ldc, e).status();
}

// gemvBatched (arrays) and gemvStridedBatched
template <typename I>
int GemvBatched(P h, int trans, I m, I n, P alpha, P a, I lda, I64 sa, P x,
                I incx, I64 sx, P beta, P y, I incy, I64 sy, I count,
                std::size_t e, bool arrays) {
  const I xn = trans == 0 ? n : m, yn = trans == 0 ? m : n;
  Check ck(h);
  ck.Op(trans).Dim(m).Dim(n).Dim(count).Scalar(alpha, e).Scalar(beta, e);
  ck.Inc(incx).Inc(incy);
  if (arrays)
    return ck.Ld(lda, m).Array(a, count).Array(x, count).Array(y, count)
        .status();
  return ck.Matrix(a, m, n, lda, e, count, sa)
      .Vector(x, xn, incx, e, count, sx).Vector(y, yn, incy, e, count, sy)
      .status();
}

// ---- the batched factorizations (no 64-bit variants) --------------------------

// getrfBatched(handle, n, A[], lda, pivots, info, batch): pivots (may be
// null: no pivoting) and info are device arrays.
int GetrfBatched(P h, int n, P a, int lda, P pivots, P info, int batch) {
  Check ck(h);
  ck.Dim(n).Ld(lda, n).Dim(batch).Array(a, batch).NonNull(info);
  if (pivots != nullptr) ck.Ints(pivots, n, batch);
  return ck.Ints(info, 1, batch).status();
}
// getriBatched(handle, n, A[], lda, pivots, C[], ldc, info, batch)
int GetriBatched(P h, int n, P a, int lda, P pivots, P c, int ldc, P info,
                 int batch) {
  Check ck(h);
  ck.Dim(n).Ld(lda, n).Ld(ldc, n).Dim(batch).Array(a, batch).Array(c, batch)
      .NonNull(info);
  if (pivots != nullptr) ck.Ints(pivots, n, batch);
  return ck.Ints(info, 1, batch).status();
}
// matinvBatched(handle, n, A[], lda, Ainv[], lda_inv, info, batch): n <= 32.
int MatinvBatched(P h, int n, P a, int lda, P ainv, int lda_inv, P info,
                  int batch) {
  return Check(h).Dim(n).AtMost(n, 32).Ld(lda, n).Ld(lda_inv, n).Dim(batch)
      .Array(a, batch).Array(ainv, batch).NonNull(info).Ints(info, 1, batch)
      .status();
}

// Writes the host `info` (when there is one) and returns the status.
int Report(const Check& ck, int* info) {
  if (info != nullptr) *info = ck.info();
  return ck.status();
}

// geqrfBatched(handle, m, n, A[], lda, Tau[], info (host), batch)
int GeqrfBatched(P h, int m, int n, P a, int lda, P tau, int* info,
                 int batch) {
  Check ck(h);
  ck.At(2).Dim(m).At(3).Dim(n).At(5).Ld(lda, m).At(8).Dim(batch).At(4)
      .Array(a, batch).At(6).Array(tau, batch).At(7).NonNull(info);
  return Report(ck, info);
}
// getrsBatched(handle, trans, n, nrhs, A[], lda, pivots, B[], ldb, info
// (host), batch)
int GetrsBatched(P h, int trans, int n, int nrhs, P a, int lda, P pivots,
                 P b, int ldb, int* info, int batch) {
  Check ck(h);
  ck.At(2).Op(trans).At(3).Dim(n).At(4).Dim(nrhs).At(6).Ld(lda, n).At(9)
      .Ld(ldb, n).At(11).Dim(batch).At(5).Array(a, batch).At(8)
      .Array(b, batch).At(10).NonNull(info);
  if (pivots != nullptr) ck.At(7).Ints(pivots, n, batch);
  return Report(ck, info);
}
// gelsBatched(handle, trans, m, n, nrhs, A[], lda, C[], ldc, info (host),
// devInfo, batch): m >= n, no transpose.
int GelsBatched(P h, int trans, int m, int n, int nrhs, P a, int lda, P c,
                int ldc, int* info, P dev_info, int batch) {
  Check ck(h);
  ck.At(2).Op(trans).At(3).Dim(m).At(4).Dim(n).At(5).Dim(nrhs).At(7)
      .Ld(lda, m).At(9).Ld(ldc, m > n ? m : n).At(12).Dim(batch).At(6)
      .Array(a, batch).At(8).Array(c, batch).At(10).NonNull(info);
  if (dev_info != nullptr) ck.At(11).Ints(dev_info, 1, batch);
  return Report(ck, info);
}

}  // namespace

// ---- the entry points ---------------------------------------------------------
//
// FOR_EACH(X) applies X to each precision: its letter, the bytes of an
// element, and the bytes of its real part (the scalar of herk, her, and the
// cosine of rot).

#define FOR_EACH(X) X(S, 4, 4) X(D, 8, 8) X(C, 8, 4) X(Z, 16, 8)
#define FOR_REAL(X) X(S, 4, 4) X(D, 8, 8)
#define FOR_COMPLEX(X) X(C, 8, 4) X(Z, 16, 8)

// Each routine comes as NAME (int sizes) and NAME_64 (int64_t sizes), with
// the same body.
#define BOTH(name, I_PARAMS, body)                 \
  LIB int name I_PARAMS(int) {                     \
    ENTER();                                       \
    body;                                          \
  }                                                \
  LIB int name##_64 I_PARAMS(std::int64_t) {       \
    ENTER();                                       \
    body;                                          \
  }

// level 1
#define XY_PARAMS(I) (P h, I n, P x, I incx, P y, I incy)
#define AXPY_PARAMS(I) (P h, I n, P alpha, P x, I incx, P y, I incy)
#define SCAL_PARAMS(I) (P h, I n, P alpha, P x, I incx)
#define DOT_PARAMS(I) (P h, I n, P x, I incx, P y, I incy, P result)
#define ONE_PARAMS(I) (P h, I n, P x, I incx, P result)
#define ROT_PARAMS(I) (P h, I n, P x, I incx, P y, I incy, P c, P s)

#define LEVEL1(T, E, R)                                                      \
  BOTH(cublas##T##copy_v2, XY_PARAMS, return Xy(h, n, x, incx, y, incy, E)) \
  BOTH(cublas##T##swap_v2, XY_PARAMS, return Xy(h, n, x, incx, y, incy, E)) \
  BOTH(cublas##T##axpy_v2, AXPY_PARAMS,                                      \
       return Axpy(h, n, alpha, x, incx, y, incy, E))                        \
  BOTH(cublas##T##scal_v2, SCAL_PARAMS,                                      \
       return Scal(h, n, alpha, E, x, incx, E))                              \
  BOTH(cublasI##T##amax_v2, ONE_PARAMS,                                      \
       return Reduce(h, n, x, incx, nullptr, decltype(n){0}, result,         \
                     sizeof n, E))                                           \
  BOTH(cublasI##T##amin_v2, ONE_PARAMS,                                      \
       return Reduce(h, n, x, incx, nullptr, decltype(n){0}, result,         \
                     sizeof n, E))
FOR_EACH(LEVEL1)

// The real reductions and rotations, and their complex forms (dotu, dotc;
// the norms of a complex vector are real: Scnrm2, Scasum, Dznrm2,
// Dzasum; Csrot, Zdrot rotate by a real sine, Csscal, Zdscal scale by a
// real factor).
#define REAL1(T, E, R)                                                       \
  BOTH(cublas##T##dot_v2, DOT_PARAMS,                                        \
       return Reduce(h, n, x, incx, y, incy, result, E, E))                  \
  BOTH(cublas##T##nrm2_v2, ONE_PARAMS,                                       \
       return Reduce(h, n, x, incx, nullptr, decltype(n){0}, result, E, E))  \
  BOTH(cublas##T##asum_v2, ONE_PARAMS,                                       \
       return Reduce(h, n, x, incx, nullptr, decltype(n){0}, result, E, E))  \
  BOTH(cublas##T##rot_v2, ROT_PARAMS,                                        \
       return Rot(h, n, x, incx, y, incy, c, s, E, E, E))
FOR_REAL(REAL1)

#define COMPLEX1(T, E, R, RT)                                                \
  BOTH(cublas##T##dotu_v2, DOT_PARAMS,                                       \
       return Reduce(h, n, x, incx, y, incy, result, E, E))                  \
  BOTH(cublas##T##dotc_v2, DOT_PARAMS,                                       \
       return Reduce(h, n, x, incx, y, incy, result, E, E))                  \
  BOTH(cublas##RT##T##nrm2_v2, ONE_PARAMS,                                   \
       return Reduce(h, n, x, incx, nullptr, decltype(n){0}, result, R, E))  \
  BOTH(cublas##RT##T##asum_v2, ONE_PARAMS,                                   \
       return Reduce(h, n, x, incx, nullptr, decltype(n){0}, result, R, E))  \
  BOTH(cublas##T##rot_v2, ROT_PARAMS,                                        \
       return Rot(h, n, x, incx, y, incy, c, s, E, R, E))
COMPLEX1(C, 8, 4, S)
COMPLEX1(Z, 16, 8, D)
BOTH(cublasCsrot_v2, ROT_PARAMS, return Rot(h, n, x, incx, y, incy, c, s, 8, 4, 4))
BOTH(cublasZdrot_v2, ROT_PARAMS,
     return Rot(h, n, x, incx, y, incy, c, s, 16, 8, 8))
BOTH(cublasCsscal_v2, SCAL_PARAMS, return Scal(h, n, alpha, 4, x, incx, 8))
BOTH(cublasZdscal_v2, SCAL_PARAMS, return Scal(h, n, alpha, 8, x, incx, 16))

// level 2
#define GEMV_PARAMS(I) \
  (P h, int trans, I m, I n, P alpha, P a, I lda, P x, I incx, P beta, P y, \
   I incy)
#define GER_PARAMS(I) \
  (P h, I m, I n, P alpha, P x, I incx, P y, I incy, P a, I lda)
#define SYMV_PARAMS(I) \
  (P h, int uplo, I n, P alpha, P a, I lda, P x, I incx, P beta, P y, I incy)
#define SYR_PARAMS(I) (P h, int uplo, I n, P alpha, P x, I incx, P a, I lda)
#define SYR2_PARAMS(I) \
  (P h, int uplo, I n, P alpha, P x, I incx, P y, I incy, P a, I lda)
#define TRMV_PARAMS(I) \
  (P h, int uplo, int trans, int diag, I n, P a, I lda, P x, I incx)

#define LEVEL2(T, E, R)                                                     \
  BOTH(cublas##T##gemv_v2, GEMV_PARAMS,                                     \
       return Gemv(h, trans, m, n, alpha, a, lda, x, incx, beta, y, incy,  \
                   E))                                                      \
  BOTH(cublas##T##symv_v2, SYMV_PARAMS,                                     \
       return Symv(h, uplo, n, alpha, a, lda, x, incx, beta, y, incy, E))   \
  BOTH(cublas##T##syr_v2, SYR_PARAMS,                                       \
       return Syr(h, uplo, n, alpha, E, x, incx, a, lda, E))                \
  BOTH(cublas##T##syr2_v2, SYR2_PARAMS,                                     \
       return Syr2(h, uplo, n, alpha, x, incx, y, incy, a, lda, E))         \
  BOTH(cublas##T##trmv_v2, TRMV_PARAMS,                                     \
       return Trmv(h, uplo, trans, diag, n, a, lda, x, incx, E))            \
  BOTH(cublas##T##trsv_v2, TRMV_PARAMS,                                     \
       return Trmv(h, uplo, trans, diag, n, a, lda, x, incx, E))
FOR_EACH(LEVEL2)

#define REAL2(T, E, R)                                              \
  BOTH(cublas##T##ger_v2, GER_PARAMS,                               \
       return Ger(h, m, n, alpha, x, incx, y, incy, a, lda, E))
FOR_REAL(REAL2)

#define COMPLEX2(T, E, R)                                                   \
  BOTH(cublas##T##geru_v2, GER_PARAMS,                                      \
       return Ger(h, m, n, alpha, x, incx, y, incy, a, lda, E))             \
  BOTH(cublas##T##gerc_v2, GER_PARAMS,                                      \
       return Ger(h, m, n, alpha, x, incx, y, incy, a, lda, E))             \
  BOTH(cublas##T##hemv_v2, SYMV_PARAMS,                                     \
       return Symv(h, uplo, n, alpha, a, lda, x, incx, beta, y, incy, E))   \
  BOTH(cublas##T##her_v2, SYR_PARAMS,                                       \
       return Syr(h, uplo, n, alpha, R, x, incx, a, lda, E))                \
  BOTH(cublas##T##her2_v2, SYR2_PARAMS,                                     \
       return Syr2(h, uplo, n, alpha, x, incx, y, incy, a, lda, E))
FOR_COMPLEX(COMPLEX2)

// level 3
#define GEMM_PARAMS(I)                                                      \
  (P h, int ta, int tb, I m, I n, I k, P alpha, P a, I lda, P b, I ldb,     \
   P beta, P c, I ldc)
#define GEMM_STRIDED_PARAMS(I)                                              \
  (P h, int ta, int tb, I m, I n, I k, P alpha, P a, I lda, long long sa,   \
   P b, I ldb, long long sb, P beta, P c, I ldc, long long sc, I count)
#define GEMM_BATCHED_PARAMS(I)                                              \
  (P h, int ta, int tb, I m, I n, I k, P alpha, P a, I lda, P b, I ldb,     \
   P beta, P c, I ldc, I count)
#define TRSM_PARAMS(I)                                                      \
  (P h, int side, int uplo, int trans, int diag, I m, I n, P alpha, P a,    \
   I lda, P b, I ldb)
#define TRSM_BATCHED_PARAMS(I)                                              \
  (P h, int side, int uplo, int trans, int diag, I m, I n, P alpha, P a,    \
   I lda, P b, I ldb, I count)
#define TRMM_PARAMS(I)                                                      \
  (P h, int side, int uplo, int trans, int diag, I m, I n, P alpha, P a,    \
   I lda, P b, I ldb, P c, I ldc)
#define SYRK_PARAMS(I)                                                      \
  (P h, int uplo, int trans, I n, I k, P alpha, P a, I lda, P beta, P c,    \
   I ldc)
#define SYR2K_PARAMS(I)                                                     \
  (P h, int uplo, int trans, I n, I k, P alpha, P a, I lda, P b, I ldb,     \
   P beta, P c, I ldc)
#define SYMM_PARAMS(I)                                                      \
  (P h, int side, int uplo, I m, I n, P alpha, P a, I lda, P b, I ldb,      \
   P beta, P c, I ldc)
#define GEAM_PARAMS(I)                                                      \
  (P h, int ta, int tb, I m, I n, P alpha, P a, I lda, P beta, P b, I ldb,  \
   P c, I ldc)
#define DGMM_PARAMS(I) \
  (P h, int side, I m, I n, P a, I lda, P x, I incx, P c, I ldc)
#define GEMV_STRIDED_PARAMS(I)                                              \
  (P h, int trans, I m, I n, P alpha, P a, I lda, long long sa, P x,        \
   I incx, long long sx, P beta, P y, I incy, long long sy, I count)
#define GEMV_BATCHED_PARAMS(I)                                              \
  (P h, int trans, I m, I n, P alpha, P a, I lda, P x, I incx, P beta,      \
   P y, I incy, I count)

#define LEVEL3(T, E, R)                                                      \
  BOTH(cublas##T##gemm_v2, GEMM_PARAMS,                                      \
       return Gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, \
                   ldc, 0, E))                                               \
  BOTH(cublas##T##gemmStridedBatched, GEMM_STRIDED_PARAMS,                   \
       return Gemm(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta,  \
                   c, ldc, sc, E, count))                                    \
  BOTH(cublas##T##gemmBatched, GEMM_BATCHED_PARAMS,                          \
       return Gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, \
                   ldc, 0, E, count, true))                                  \
  BOTH(cublas##T##trsm_v2, TRSM_PARAMS,                                      \
       return Trsm(h, side, uplo, trans, diag, m, n, alpha, a, lda, b, ldb,  \
                   nullptr, decltype(m){0}, E))                              \
  BOTH(cublas##T##trsmBatched, TRSM_BATCHED_PARAMS,                          \
       return Trsm(h, side, uplo, trans, diag, m, n, alpha, a, lda, b, ldb,  \
                   nullptr, decltype(m){0}, E, count, true))                 \
  BOTH(cublas##T##trmm_v2, TRMM_PARAMS,                                      \
       return Trsm(h, side, uplo, trans, diag, m, n, alpha, a, lda, b, ldb,  \
                   c, ldc, E))                                               \
  BOTH(cublas##T##syrk_v2, SYRK_PARAMS,                                      \
       return Syrk(h, uplo, trans, n, k, alpha, a, lda, nullptr, lda, beta,  \
                   E, c, ldc, E, false))                                     \
  BOTH(cublas##T##syr2k_v2, SYR2K_PARAMS,                                    \
       return Syrk(h, uplo, trans, n, k, alpha, a, lda, b, ldb, beta, E, c,  \
                   ldc, E, true))                                            \
  BOTH(cublas##T##syrkx, SYR2K_PARAMS,                                       \
       return Syrk(h, uplo, trans, n, k, alpha, a, lda, b, ldb, beta, E, c,  \
                   ldc, E, true))                                            \
  BOTH(cublas##T##symm_v2, SYMM_PARAMS,                                      \
       return Symm(h, side, uplo, m, n, alpha, a, lda, b, ldb, beta, c, ldc, \
                   E))                                                       \
  BOTH(cublas##T##geam, GEAM_PARAMS,                                         \
       return Geam(h, ta, tb, m, n, alpha, a, lda, beta, b, ldb, c, ldc, E)) \
  BOTH(cublas##T##dgmm, DGMM_PARAMS,                                         \
       return Dgmm(h, side, m, n, a, lda, x, incx, c, ldc, E))               \
  BOTH(cublas##T##gemvStridedBatched, GEMV_STRIDED_PARAMS,                   \
       return GemvBatched(h, trans, m, n, alpha, a, lda, sa, x, incx, sx,    \
                          beta, y, incy, sy, count, E, false))               \
  BOTH(cublas##T##gemvBatched, GEMV_BATCHED_PARAMS,                          \
       return GemvBatched(h, trans, m, n, alpha, a, lda, 0, x, incx, 0,      \
                          beta, y, incy, 0, count, E, true))
FOR_EACH(LEVEL3)

#define COMPLEX3(T, E, R)                                                    \
  BOTH(cublas##T##herk_v2, SYRK_PARAMS,                                      \
       return Syrk(h, uplo, trans, n, k, alpha, a, lda, nullptr, lda, beta,  \
                   R, c, ldc, E, false))                                     \
  BOTH(cublas##T##her2k_v2, SYR2K_PARAMS,                                    \
       return Syrk(h, uplo, trans, n, k, alpha, a, lda, b, ldb, beta, R, c,  \
                   ldc, E, true))                                            \
  BOTH(cublas##T##herkx, SYR2K_PARAMS,                                       \
       return Syrk(h, uplo, trans, n, k, alpha, a, lda, b, ldb, beta, R, c,  \
                   ldc, E, true))                                            \
  BOTH(cublas##T##hemm_v2, SYMM_PARAMS,                                      \
       return Symm(h, side, uplo, m, n, alpha, a, lda, b, ldb, beta, c, ldc, \
                   E))
FOR_COMPLEX(COMPLEX3)

// Half precision: Hgemm and its batched forms (2-byte elements).
BOTH(cublasHgemm, GEMM_PARAMS,
     return Gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                 ldc, 0, 2))
BOTH(cublasHgemmStridedBatched, GEMM_STRIDED_PARAMS,
     return Gemm(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c,
                 ldc, sc, 2, count))
BOTH(cublasHgemmBatched, GEMM_BATCHED_PARAMS,
     return Gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                 ldc, 0, 2, count, true))

// The mixed-type products: the element types are cudaDataType_t values, the
// scalars of the compute type (cublasComputeType_t: 16F 64, 32F 68, 64F 70,
// 32I 72 and their _PEDANTIC and fast forms; or, from older callers, a
// cudaDataType_t).
namespace {
std::size_t ScalarBytes(int compute) {
  switch (compute) {
    case 64: case 65: return 2;                     // CUBLAS_COMPUTE_16F
    case 68: case 69: case 74: case 75: case 76:
    case 77: return 4;                              // 32F and its fast forms
    case 70: case 71: return 8;                     // CUBLAS_COMPUTE_64F
    case 72: case 73: return 4;                     // CUBLAS_COMPUTE_32I
    default: return fg::DataTypeBytes(compute);
  }
}

template <typename I>
int GemmEx(P h, int ta, int tb, I m, I n, I k, P alpha, P a, int at, I lda,
           I64 sa, P b, int bt, I ldb, I64 sb, P beta, P c, int ct, I ldc,
           I64 sc, I64 count, int compute, bool arrays) {
  const std::size_t ea = fg::DataTypeBytes(at), eb = fg::DataTypeBytes(bt),
                    ec = fg::DataTypeBytes(ct), es = ScalarBytes(compute);
  if (fg::CublasPointerMode(h) < 0) return kNotInitialized;
  if (ea == 0 || eb == 0 || ec == 0 || es == 0) return kInvalidValue;
  Check ck(h);
  ck.Op(ta).Op(tb).Dim(m).Dim(n).Dim(k).Dim(count).Scalar(alpha, es)
      .Scalar(beta, es);
  if (arrays)
    return ck.Ld(lda, Stored(ta, m, k)).Ld(ldb, Stored(tb, k, n)).Ld(ldc, m)
        .Array(a, count).Array(b, count).Array(c, count).status();
  return ck.Matrix(a, Stored(ta, m, k), StoredCols(ta, m, k), lda, ea, count,
                   sa)
      .Matrix(b, Stored(tb, k, n), StoredCols(tb, k, n), ldb, eb, count, sb)
      .Matrix(c, m, n, ldc, ec, count, sc).status();
}
}  // namespace

#define GEMMEX_PARAMS(I)                                                    \
  (P h, int ta, int tb, I m, I n, I k, P alpha, P a, int at, I lda, P b,    \
   int bt, I ldb, P beta, P c, int ct, I ldc, int compute, int)
#define GEMMEX_BATCHED_PARAMS(I)                                            \
  (P h, int ta, int tb, I m, I n, I k, P alpha, P a, int at, I lda, P b,    \
   int bt, I ldb, P beta, P c, int ct, I ldc, I count, int compute, int)
#define GEMMEX_STRIDED_PARAMS(I)                                            \
  (P h, int ta, int tb, I m, I n, I k, P alpha, P a, int at, I lda,         \
   long long sa, P b, int bt, I ldb, long long sb, P beta, P c, int ct,     \
   I ldc, long long sc, I count, int compute, int)
BOTH(cublasGemmEx, GEMMEX_PARAMS,
     return GemmEx(h, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0,
                   beta, c, ct, ldc, 0, 1, compute, false))
BOTH(cublasGemmBatchedEx, GEMMEX_BATCHED_PARAMS,
     return GemmEx(h, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0,
                   beta, c, ct, ldc, 0, count, compute, true))
BOTH(cublasGemmStridedBatchedEx, GEMMEX_STRIDED_PARAMS,
     return GemmEx(h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb,
                   beta, c, ct, ldc, sc, count, compute, false))

// The batched factorizations and solves.
#define BATCHED(T, E, R)                                                     \
  LIB int cublas##T##getrfBatched(P h, int n, P a, int lda, P pivots,        \
                                  P info, int batch) {                       \
    ENTER();                                                                 \
    return GetrfBatched(h, n, a, lda, pivots, info, batch);                  \
  }                                                                          \
  LIB int cublas##T##getriBatched(P h, int n, P a, int lda, P pivots, P c,   \
                                  int ldc, P info, int batch) {              \
    ENTER();                                                                 \
    return GetriBatched(h, n, a, lda, pivots, c, ldc, info, batch);          \
  }                                                                          \
  LIB int cublas##T##getrsBatched(P h, int trans, int n, int nrhs, P a,      \
                                  int lda, P pivots, P b, int ldb,           \
                                  int* info, int batch) {                    \
    ENTER();                                                                 \
    return GetrsBatched(h, trans, n, nrhs, a, lda, pivots, b, ldb, info,     \
                        batch);                                              \
  }                                                                          \
  LIB int cublas##T##matinvBatched(P h, int n, P a, int lda, P ainv,         \
                                   int lda_inv, P info, int batch) {         \
    ENTER();                                                                 \
    return MatinvBatched(h, n, a, lda, ainv, lda_inv, info, batch);          \
  }                                                                          \
  LIB int cublas##T##geqrfBatched(P h, int m, int n, P a, int lda, P tau,    \
                                  int* info, int batch) {                    \
    ENTER();                                                                 \
    return GeqrfBatched(h, m, n, a, lda, tau, info, batch);                  \
  }                                                                          \
  LIB int cublas##T##gelsBatched(P h, int trans, int m, int n, int nrhs,     \
                                 P a, int lda, P c, int ldc, int* info,      \
                                 P dev_info, int batch) {                    \
    ENTER();                                                                 \
    return GelsBatched(h, trans, m, n, nrhs, a, lda, c, ldc, info, dev_info, \
                       batch);                                               \
  }
FOR_EACH(BATCHED)
