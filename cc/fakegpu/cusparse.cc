// The fake GPU's cuSPARSE, by NVIDIA's names and signatures (cusparse.h):
// handles that keep their stream, the generic API's descriptors (sparse
// COO and CSR matrices, dense matrices and vectors, with their strided
// batches), the buffer-size queries and executions of SpMV, SpMM,
// SparseToDense and DenseToSparse, the tridiagonal solvers gtsv2 and
// gtsv2StridedBatch, and the status strings. The executions are kernels:
// each checks its handle and descriptors, that every array the
// descriptors name is device memory of the fake with the bytes its sizes
// give, and that the external buffer is device memory of the size the
// query answered, then computes nothing. A descriptor may be made with any
// non-null pointers (jaxlib sizes its buffers with descriptors over host
// memory); only an execution asks for device memory.
//
// The buffer rule (what a query answers, in bytes; cuSPARSE's figures
// depend on the algorithm and the GPU): SpMV 8 (rows(A) + 1), a 64-bit
// offset a row; SpMM that plus nnz(A) elements of the compute type (the
// partial products); SparseToDense none; DenseToSparse 8 (rows + 1);
// gtsv2 m (n + 4) elements of the data type, gtsv2_nopivot m n of them,
// gtsv2StridedBatch 4 m batchCount of them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "cc/fakegpu/fakegpu.h"
#include "cc/fakegpu/libs.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

// cusparseStatus_t (cusparse.h).
constexpr int kSuccess = 0, kNotInitialized = 1, kInvalidValue = 3;

// cusparseFormat_t, cusparseOrder_t.
constexpr int kCsr = 1, kCoo = 3;
constexpr int kOrderCol = 1, kOrderRow = 2;

struct Handle {
  void* stream = nullptr;
};

struct SpMat {
  int format = 0;
  std::int64_t rows = 0, cols = 0, nnz = 0;
  const void* row = nullptr;  // CSR row offsets or COO row indices
  const void* col = nullptr;
  const void* values = nullptr;
  int row_type = 0, col_type = 0, base = 0, value_type = 0;
  int batch = 1;
  std::int64_t row_stride = 0;    // elements between batches (offsets, rows)
  std::int64_t value_stride = 0;  // (columns and values)
};

struct DnMat {
  std::int64_t rows = 0, cols = 0, ld = 0;
  const void* values = nullptr;
  int type = 0, order = 0;
  int batch = 1;
  std::int64_t stride = 0;
};

struct DnVec {
  std::int64_t size = 0;
  const void* values = nullptr;
  int type = 0;
};

fg::Registry<Handle>& Handles() {
  static auto* r = new fg::Registry<Handle>;
  return *r;
}
fg::Registry<SpMat>& SpMats() {
  static auto* r = new fg::Registry<SpMat>;
  return *r;
}
fg::Registry<DnMat>& DnMats() {
  static auto* r = new fg::Registry<DnMat>;
  return *r;
}
fg::Registry<DnVec>& DnVecs() {
  static auto* r = new fg::Registry<DnVec>;
  return *r;
}

template <typename T>
int Destroy(fg::Registry<T>& r, const void* h) {
  return r.Remove(h) != nullptr ? kSuccess : kInvalidValue;
}

// A copy of a live object (descriptors are small), or false.
template <typename T>
bool Get(fg::Registry<T>& r, const void* h, T* out) {
  return r.With(h, 0, [&](T& t) {
           *out = t;
           return 1;
         }) == 1;
}

bool Known(void* handle) {
  return Handles().With(handle, 0, [](Handle&) { return 1; }) == 1;
}

// cusparseIndexType_t: 16U, 32I, 64I.
std::int64_t IndexBytes(int type) {
  return type == 1 ? 2 : type == 2 ? 4 : type == 3 ? 8 : 0;
}
std::int64_t ValueBytes(int type) {
  return static_cast<std::int64_t>(fg::DataTypeBytes(type));
}

// The bytes `count` elements of `elem` bytes take in each of `batch`
// batches `stride` elements apart.
std::int64_t Strided(std::int64_t count, std::int64_t elem, int batch,
                     std::int64_t stride) {
  if (count == 0) return 0;
  return ((static_cast<std::int64_t>(batch) - 1) * stride + count) * elem;
}

// Every array of a sparse matrix is device memory of its bytes.
bool OnDevice(const SpMat& a) {
  const std::int64_t ib = IndexBytes(a.row_type), cb = IndexBytes(a.col_type);
  const std::int64_t vb = ValueBytes(a.value_type);
  const std::int64_t rows = a.format == kCsr ? a.rows + 1 : a.nnz;
  return fg::DeviceBytes(a.row, Strided(rows, ib, a.batch, a.row_stride)) &&
         fg::DeviceBytes(a.col,
                         Strided(a.nnz, cb, a.batch, a.value_stride)) &&
         fg::DeviceBytes(a.values,
                         Strided(a.nnz, vb, a.batch, a.value_stride));
}

std::int64_t DenseElements(const DnMat& b) {
  if (b.rows == 0 || b.cols == 0) return 0;
  return b.order == kOrderCol ? b.ld * (b.cols - 1) + b.rows
                              : b.ld * (b.rows - 1) + b.cols;
}
bool OnDevice(const DnMat& b) {
  return fg::DeviceBytes(b.values, Strided(DenseElements(b),
                                           ValueBytes(b.type), b.batch,
                                           b.stride));
}
bool OnDevice(const DnVec& v) {
  return fg::DeviceBytes(v.values, v.size * ValueBytes(v.type));
}

// The buffer rule (the file's comment).
std::size_t SpMVBuffer(const SpMat& a) {
  return static_cast<std::size_t>(8 * (a.rows + 1));
}
std::size_t SpMMBuffer(const SpMat& a, int compute) {
  return static_cast<std::size_t>(8 * (a.rows + 1) +
                                  a.nnz * a.batch * ValueBytes(compute));
}

bool ValidOp(int op) { return op >= 0 && op <= 2; }  // N, T, C

}  // namespace

// ---- handles --------------------------------------------------------------

LIB int cusparseCreate(void** handle) {
  ENTER();
  if (handle == nullptr) return kInvalidValue;
  *handle = Handles().Add(std::make_unique<Handle>());
  return kSuccess;
}
LIB int cusparseDestroy(void* handle) {
  ENTER();
  return Destroy(Handles(), handle);
}
LIB int cusparseSetStream(void* handle, void* stream) {
  ENTER();
  return Handles().With(handle, kNotInitialized, [&](Handle& h) {
    h.stream = stream;
    return kSuccess;
  });
}
LIB int cusparseGetStream(void* handle, void** stream) {
  ENTER();
  if (stream == nullptr) return kInvalidValue;
  return Handles().With(handle, kNotInitialized, [&](Handle& h) {
    *stream = h.stream;
    return kSuccess;
  });
}

// ---- descriptors ------------------------------------------------------------

namespace {
int MakeSparse(void** out, const SpMat& a) {
  if (out == nullptr || a.rows < 0 || a.cols < 0 || a.nnz < 0 ||
      IndexBytes(a.row_type) == 0 || IndexBytes(a.col_type) == 0 ||
      ValueBytes(a.value_type) == 0 || a.base < 0 || a.base > 1)
    return kInvalidValue;
  const bool need_rows = a.format == kCsr ? a.rows > 0 : a.nnz > 0;
  if ((need_rows && a.row == nullptr) ||
      (a.nnz > 0 && (a.col == nullptr || a.values == nullptr)))
    return kInvalidValue;
  *out = SpMats().Add(std::make_unique<SpMat>(a));
  return kSuccess;
}
}  // namespace

LIB int cusparseCreateCoo(void** out, std::int64_t rows, std::int64_t cols,
                          std::int64_t nnz, void* row, void* col, void* values,
                          int index_type, int base, int value_type) {
  ENTER();
  SpMat a;
  a.format = kCoo;
  a.rows = rows;
  a.cols = cols;
  a.nnz = nnz;
  a.row = row;
  a.col = col;
  a.values = values;
  a.row_type = a.col_type = index_type;
  a.base = base;
  a.value_type = value_type;
  return MakeSparse(out, a);
}

LIB int cusparseCreateCsr(void** out, std::int64_t rows, std::int64_t cols,
                          std::int64_t nnz, void* offsets, void* col,
                          void* values, int offsets_type, int col_type,
                          int base, int value_type) {
  ENTER();
  SpMat a;
  a.format = kCsr;
  a.rows = rows;
  a.cols = cols;
  a.nnz = nnz;
  a.row = offsets;
  a.col = col;
  a.values = values;
  a.row_type = offsets_type;
  a.col_type = col_type;
  a.base = base;
  a.value_type = value_type;
  return MakeSparse(out, a);
}

LIB int cusparseCreateDnMat(void** out, std::int64_t rows, std::int64_t cols,
                            std::int64_t ld, void* values, int type,
                            int order) {
  ENTER();
  if (out == nullptr || rows < 0 || cols < 0 || ValueBytes(type) == 0 ||
      (order != kOrderCol && order != kOrderRow))
    return kInvalidValue;
  const std::int64_t need = order == kOrderCol ? rows : cols;
  if (ld < std::max<std::int64_t>(need, 1) ||
      (rows > 0 && cols > 0 && values == nullptr))
    return kInvalidValue;
  DnMat b;
  b.rows = rows;
  b.cols = cols;
  b.ld = ld;
  b.values = values;
  b.type = type;
  b.order = order;
  *out = DnMats().Add(std::make_unique<DnMat>(b));
  return kSuccess;
}

LIB int cusparseCreateDnVec(void** out, std::int64_t size, void* values,
                            int type) {
  ENTER();
  if (out == nullptr || size < 0 || ValueBytes(type) == 0 ||
      (size > 0 && values == nullptr))
    return kInvalidValue;
  DnVec v;
  v.size = size;
  v.values = values;
  v.type = type;
  *out = DnVecs().Add(std::make_unique<DnVec>(v));
  return kSuccess;
}

LIB int cusparseDestroySpMat(const void* d) {
  ENTER();
  return Destroy(SpMats(), d);
}
LIB int cusparseDestroyDnMat(const void* d) {
  ENTER();
  return Destroy(DnMats(), d);
}
LIB int cusparseDestroyDnVec(const void* d) {
  ENTER();
  return Destroy(DnVecs(), d);
}

LIB int cusparseCooSetStridedBatch(void* d, int batch, std::int64_t stride) {
  ENTER();
  return SpMats().With(d, kInvalidValue, [&](SpMat& a) {
    if (a.format != kCoo || batch < 1 || (batch > 1 && stride < a.nnz))
      return kInvalidValue;
    a.batch = batch;
    a.row_stride = a.value_stride = stride;
    return kSuccess;
  });
}

LIB int cusparseCsrSetStridedBatch(void* d, int batch,
                                   std::int64_t offsets_stride,
                                   std::int64_t values_stride) {
  ENTER();
  return SpMats().With(d, kInvalidValue, [&](SpMat& a) {
    if (a.format != kCsr || batch < 1 ||
        (batch > 1 && (offsets_stride < a.rows + 1 || values_stride < a.nnz)))
      return kInvalidValue;
    a.batch = batch;
    a.row_stride = offsets_stride;
    a.value_stride = values_stride;
    return kSuccess;
  });
}

LIB int cusparseDnMatSetStridedBatch(void* d, int batch, std::int64_t stride) {
  ENTER();
  return DnMats().With(d, kInvalidValue, [&](DnMat& b) {
    if (batch < 1 || (batch > 1 && stride < DenseElements(b)))
      return kInvalidValue;
    b.batch = batch;
    b.stride = stride;
    return kSuccess;
  });
}

LIB int cusparseSpMatGetSize(const void* d, std::int64_t* rows,
                             std::int64_t* cols, std::int64_t* nnz) {
  ENTER();
  if (rows == nullptr || cols == nullptr || nnz == nullptr)
    return kInvalidValue;
  return SpMats().With(d, kInvalidValue, [&](SpMat& a) {
    *rows = a.rows;
    *cols = a.cols;
    *nnz = a.nnz;
    return kSuccess;
  });
}

// ---- products and conversions ---------------------------------------------

namespace {
// The operands of SpMV (y = op(A) x): their shapes agree.
int SpMVOperands(void* handle, int op, const void* alpha, const void* beta,
                 const void* ma, const void* vx, const void* vy, SpMat* a,
                 DnVec* x, DnVec* y) {
  if (!Known(handle)) return kNotInitialized;
  if (!ValidOp(op) || alpha == nullptr || beta == nullptr ||
      !Get(SpMats(), ma, a) || !Get(DnVecs(), vx, x) || !Get(DnVecs(), vy, y))
    return kInvalidValue;
  const bool t = op != 0;
  if (x->size != (t ? a->rows : a->cols) || y->size != (t ? a->cols : a->rows))
    return kInvalidValue;
  return kSuccess;
}

// The operands of SpMM (C = op(A) op(B)).
int SpMMOperands(void* handle, int op_a, int op_b, const void* alpha,
                 const void* beta, const void* ma, const void* mb,
                 const void* mc, SpMat* a, DnMat* b, DnMat* c) {
  if (!Known(handle)) return kNotInitialized;
  if (!ValidOp(op_a) || !ValidOp(op_b) || alpha == nullptr ||
      beta == nullptr || !Get(SpMats(), ma, a) || !Get(DnMats(), mb, b) ||
      !Get(DnMats(), mc, c))
    return kInvalidValue;
  const std::int64_t am = op_a != 0 ? a->cols : a->rows;
  const std::int64_t ak = op_a != 0 ? a->rows : a->cols;
  const std::int64_t bk = op_b != 0 ? b->cols : b->rows;
  const std::int64_t bn = op_b != 0 ? b->rows : b->cols;
  if (ak != bk || c->rows != am || c->cols != bn) return kInvalidValue;
  return kSuccess;
}

// A matrix converted to the other form: the shapes agree.
int ConversionOperands(void* handle, const void* sparse, const void* dense,
                       SpMat* a, DnMat* b) {
  if (!Known(handle)) return kNotInitialized;
  if (!Get(SpMats(), sparse, a) || !Get(DnMats(), dense, b) ||
      a->rows != b->rows || a->cols != b->cols)
    return kInvalidValue;
  return kSuccess;
}

std::size_t ConversionBuffer(const SpMat& a) {
  return static_cast<std::size_t>(8 * (a.rows + 1));
}
}  // namespace

LIB int cusparseSpMV_bufferSize(void* handle, int op, const void* alpha,
                                const void* ma, const void* vx,
                                const void* beta, void* vy, int compute, int,
                                std::size_t* size) {
  ENTER();
  SpMat a;
  DnVec x, y;
  const int r = SpMVOperands(handle, op, alpha, beta, ma, vx, vy, &a, &x, &y);
  if (r != kSuccess) return r;
  if (size == nullptr || ValueBytes(compute) == 0) return kInvalidValue;
  *size = SpMVBuffer(a);
  return kSuccess;
}

LIB int cusparseSpMV(void* handle, int op, const void* alpha, const void* ma,
                     const void* vx, const void* beta, void* vy, int compute,
                     int, void* buffer) {
  ENTER();
  SpMat a;
  DnVec x, y;
  const int r = SpMVOperands(handle, op, alpha, beta, ma, vx, vy, &a, &x, &y);
  if (r != kSuccess) return r;
  if (ValueBytes(compute) == 0 || !OnDevice(a) || !OnDevice(x) ||
      !OnDevice(y) || !fg::DeviceBytes(buffer, SpMVBuffer(a)))
    return kInvalidValue;
  return kSuccess;
}

LIB int cusparseSpMM_bufferSize(void* handle, int op_a, int op_b,
                                const void* alpha, const void* ma,
                                const void* mb, const void* beta, void* mc,
                                int compute, int, std::size_t* size) {
  ENTER();
  SpMat a;
  DnMat b, c;
  const int r =
      SpMMOperands(handle, op_a, op_b, alpha, beta, ma, mb, mc, &a, &b, &c);
  if (r != kSuccess) return r;
  if (size == nullptr || ValueBytes(compute) == 0) return kInvalidValue;
  *size = SpMMBuffer(a, compute);
  return kSuccess;
}

namespace {
int SpMMRun(void* handle, int op_a, int op_b, const void* alpha,
            const void* ma, const void* mb, const void* beta, void* mc,
            int compute, void* buffer) {
  SpMat a;
  DnMat b, c;
  const int r =
      SpMMOperands(handle, op_a, op_b, alpha, beta, ma, mb, mc, &a, &b, &c);
  if (r != kSuccess) return r;
  if (ValueBytes(compute) == 0 || !OnDevice(a) || !OnDevice(b) ||
      !OnDevice(c) || !fg::DeviceBytes(buffer, SpMMBuffer(a, compute)))
    return kInvalidValue;
  return kSuccess;
}
}  // namespace

LIB int cusparseSpMM_preprocess(void* handle, int op_a, int op_b,
                                const void* alpha, const void* ma,
                                const void* mb, const void* beta, void* mc,
                                int compute, int, void* buffer) {
  ENTER();
  return SpMMRun(handle, op_a, op_b, alpha, ma, mb, beta, mc, compute, buffer);
}

LIB int cusparseSpMM(void* handle, int op_a, int op_b, const void* alpha,
                     const void* ma, const void* mb, const void* beta,
                     void* mc, int compute, int, void* buffer) {
  ENTER();
  return SpMMRun(handle, op_a, op_b, alpha, ma, mb, beta, mc, compute, buffer);
}

LIB int cusparseSparseToDense_bufferSize(void* handle, const void* ma,
                                         void* mb, int, std::size_t* size) {
  ENTER();
  SpMat a;
  DnMat b;
  const int r = ConversionOperands(handle, ma, mb, &a, &b);
  if (r != kSuccess) return r;
  if (size == nullptr) return kInvalidValue;
  *size = 0;
  return kSuccess;
}

LIB int cusparseSparseToDense(void* handle, const void* ma, void* mb, int,
                              void*) {
  ENTER();
  SpMat a;
  DnMat b;
  const int r = ConversionOperands(handle, ma, mb, &a, &b);
  if (r != kSuccess) return r;
  return OnDevice(a) && OnDevice(b) ? kSuccess : kInvalidValue;
}

LIB int cusparseDenseToSparse_bufferSize(void* handle, const void* ma,
                                         void* mb, int, std::size_t* size) {
  ENTER();
  SpMat a;
  DnMat b;
  const int r = ConversionOperands(handle, mb, ma, &a, &b);
  if (r != kSuccess) return r;
  if (size == nullptr) return kInvalidValue;
  *size = ConversionBuffer(a);
  return kSuccess;
}

LIB int cusparseDenseToSparse_analysis(void* handle, const void* ma, void* mb,
                                       int, void* buffer) {
  ENTER();
  SpMat a;
  DnMat b;
  const int r = ConversionOperands(handle, mb, ma, &a, &b);
  if (r != kSuccess) return r;
  return OnDevice(b) && fg::DeviceBytes(buffer, ConversionBuffer(a))
             ? kSuccess
             : kInvalidValue;
}

LIB int cusparseDenseToSparse_convert(void* handle, const void* ma, void* mb,
                                      int, void* buffer) {
  ENTER();
  SpMat a;
  DnMat b;
  const int r = ConversionOperands(handle, mb, ma, &a, &b);
  if (r != kSuccess) return r;
  return OnDevice(a) && OnDevice(b) &&
                 fg::DeviceBytes(buffer, ConversionBuffer(a))
             ? kSuccess
             : kInvalidValue;
}

// ---- tridiagonal solvers, for S, D, C and Z ---------------------------------
//
// gtsv2 solves with pivoting and needs m >= 3; the diagonals are m elements
// each and B is ldb x n.

namespace {
int GtsvSize(void* handle, int m, int n, int ldb, std::int64_t elements,
             std::size_t* size) {
  if (!Known(handle)) return kNotInitialized;
  if (m < 3 || n < 0 || ldb < std::max(1, m) || size == nullptr)
    return kInvalidValue;
  *size = static_cast<std::size_t>(elements);
  return kSuccess;
}
int GtsvRun(void* handle, int m, int n, const void* dl, const void* d,
            const void* du, const void* b, int ldb, const void* buffer,
            std::int64_t elem, std::int64_t buffer_bytes) {
  if (!Known(handle)) return kNotInitialized;
  if (m < 3 || n < 0 || ldb < std::max(1, m)) return kInvalidValue;
  const std::int64_t diag = std::int64_t{m} * elem;
  const std::int64_t rhs =
      n == 0 ? 0 : (std::int64_t{ldb} * (n - 1) + m) * elem;
  return fg::DeviceBytes(dl, diag) && fg::DeviceBytes(d, diag) &&
                 fg::DeviceBytes(du, diag) && fg::DeviceBytes(b, rhs) &&
                 fg::DeviceBytes(buffer, buffer_bytes)
             ? kSuccess
             : kInvalidValue;
}
std::int64_t Gtsv2Bytes(int m, int n, std::int64_t e) {
  return std::int64_t{m} * (n + 4) * e;
}
std::int64_t NopivotBytes(int m, int n, std::int64_t e) {
  return std::int64_t{m} * n * e;
}
std::int64_t BatchBytes(int m, int batch, std::int64_t e) {
  return 4 * std::int64_t{m} * batch * e;
}
}  // namespace

#define JAXLAKE_CUSPARSE_GTSV(P, E)                                           \
  LIB int cusparse##P##gtsv2_bufferSizeExt(                                   \
      void* h, int m, int n, const void*, const void*, const void*,           \
      const void*, int ldb, std::size_t* size) {                              \
    ENTER();                                                                  \
    return GtsvSize(h, m, n, ldb, Gtsv2Bytes(m, n, E), size);                 \
  }                                                                           \
  LIB int cusparse##P##gtsv2(void* h, int m, int n, const void* dl,           \
                             const void* d, const void* du, void* b, int ldb, \
                             void* buffer) {                                  \
    ENTER();                                                                  \
    return GtsvRun(h, m, n, dl, d, du, b, ldb, buffer, E,                     \
                   Gtsv2Bytes(m, n, E));                                      \
  }                                                                           \
  LIB int cusparse##P##gtsv2_nopivot_bufferSizeExt(                           \
      void* h, int m, int n, const void*, const void*, const void*,           \
      const void*, int ldb, std::size_t* size) {                              \
    ENTER();                                                                  \
    return GtsvSize(h, m, n, ldb, NopivotBytes(m, n, E), size);               \
  }                                                                           \
  LIB int cusparse##P##gtsv2_nopivot(void* h, int m, int n, const void* dl,   \
                                     const void* d, const void* du, void* b,  \
                                     int ldb, void* buffer) {                 \
    ENTER();                                                                  \
    return GtsvRun(h, m, n, dl, d, du, b, ldb, buffer, E,                     \
                   NopivotBytes(m, n, E));                                    \
  }                                                                           \
  LIB int cusparse##P##gtsv2StridedBatch_bufferSizeExt(                       \
      void* h, int m, const void*, const void*, const void*, const void*,     \
      int batch, int stride, std::size_t* size) {                             \
    ENTER();                                                                  \
    if (batch < 0 || stride < m) return Known(h) ? kInvalidValue              \
                                                 : kNotInitialized;           \
    return GtsvSize(h, m, 1, m, BatchBytes(m, batch, E), size);               \
  }                                                                           \
  LIB int cusparse##P##gtsv2StridedBatch(void* h, int m, const void* dl,      \
                                         const void* d, const void* du,       \
                                         void* x, int batch, int stride,      \
                                         void* buffer) {                      \
    ENTER();                                                                  \
    if (!Known(h)) return kNotInitialized;                                    \
    if (m < 3 || batch < 0 || stride < m) return kInvalidValue;               \
    const std::int64_t span =                                                 \
        batch == 0 ? 0 : (std::int64_t{stride} * (batch - 1) + m) * (E);      \
    return fg::DeviceBytes(dl, span) && fg::DeviceBytes(d, span) &&           \
                   fg::DeviceBytes(du, span) && fg::DeviceBytes(x, span) &&   \
                   fg::DeviceBytes(buffer, BatchBytes(m, batch, E))           \
               ? kSuccess                                                     \
               : kInvalidValue;                                               \
  }

JAXLAKE_CUSPARSE_GTSV(S, 4)
JAXLAKE_CUSPARSE_GTSV(D, 8)
JAXLAKE_CUSPARSE_GTSV(C, 8)
JAXLAKE_CUSPARSE_GTSV(Z, 16)

// ---- status strings ---------------------------------------------------------

namespace {
const char* StatusName(int status) {
  switch (status) {
    case 0: return "CUSPARSE_STATUS_SUCCESS";
    case 1: return "CUSPARSE_STATUS_NOT_INITIALIZED";
    case 2: return "CUSPARSE_STATUS_ALLOC_FAILED";
    case 3: return "CUSPARSE_STATUS_INVALID_VALUE";
    case 4: return "CUSPARSE_STATUS_ARCH_MISMATCH";
    case 5: return "CUSPARSE_STATUS_MAPPING_ERROR";
    case 6: return "CUSPARSE_STATUS_EXECUTION_FAILED";
    case 7: return "CUSPARSE_STATUS_INTERNAL_ERROR";
    case 8: return "CUSPARSE_STATUS_MATRIX_TYPE_NOT_SUPPORTED";
    case 9: return "CUSPARSE_STATUS_ZERO_PIVOT";
    case 10: return "CUSPARSE_STATUS_NOT_SUPPORTED";
    case 11: return "CUSPARSE_STATUS_INSUFFICIENT_RESOURCES";
    default: return "CUSPARSE_STATUS_UNKNOWN";
  }
}
}  // namespace

LIB const char* cusparseGetErrorName(int status) {
  return StatusName(status);
}

LIB const char* cusparseGetErrorString(int status) {
  switch (status) {
    case 0: return "success";
    case 1: return "initialization error";
    case 2: return "out of memory";
    case 3: return "invalid value";
    case 4: return "architecture mismatch";
    case 5: return "mapping error";
    case 6: return "execution failed";
    case 7: return "internal error";
    case 8: return "matrix type not supported";
    case 9: return "zero pivot";
    case 10: return "operation not supported";
    case 11: return "insufficient resources";
    default: return "unknown error";
  }
}
