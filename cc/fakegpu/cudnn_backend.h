// The fake GPU's cuDNN backend API, shared by its two files: the
// statuses and the enum values the fake reads, descriptors with their
// attributes, and the rules of finalization and execution
// (cudnn_backend.cc); the library's entry points are in cudnn.cc. The
// rules are listed at the top of cudnn.cc and in cc/fakegpu/README.md.
#ifndef JAXLAKE_FAKEGPU_CUDNN_BACKEND_H_
#define JAXLAKE_FAKEGPU_CUDNN_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace jaxlake::fakegpu::cudnn {

// cudnnStatus_t (cudnn_graph.h): every status, as X(name, value), the
// name without its CUDNN_STATUS_ prefix.
#define JAXLAKE_CUDNN_STATUSES(X)                     \
  X(SUCCESS, 0)                                       \
  X(NOT_INITIALIZED, 1001)                            \
  X(SUBLIBRARY_VERSION_MISMATCH, 1002)                \
  X(SERIALIZATION_VERSION_MISMATCH, 1003)             \
  X(DEPRECATED, 1004)                                 \
  X(LICENSE_ERROR, 1005)                              \
  X(RUNTIME_IN_PROGRESS, 1006)                        \
  X(RUNTIME_FP_OVERFLOW, 1007)                        \
  X(SUBLIBRARY_LOADING_FAILED, 1008)                  \
  X(BAD_PARAM, 2000)                                  \
  X(INVALID_VALUE, 2001)                              \
  X(BAD_PARAM_NULL_POINTER, 2002)                     \
  X(BAD_PARAM_MISALIGNED_POINTER, 2003)               \
  X(BAD_PARAM_NOT_FINALIZED, 2004)                    \
  X(BAD_PARAM_OUT_OF_BOUND, 2005)                     \
  X(BAD_PARAM_SIZE_INSUFFICIENT, 2006)                \
  X(BAD_PARAM_STREAM_MISMATCH, 2007)                  \
  X(BAD_PARAM_SHAPE_MISMATCH, 2008)                   \
  X(BAD_PARAM_DUPLICATED_ENTRIES, 2009)               \
  X(BAD_PARAM_ATTRIBUTE_TYPE, 2010)                   \
  X(BAD_PARAM_CUDA_GRAPH_MISMATCH, 2011)              \
  X(BAD_PARAM_DESCRIPTOR_TYPE, 2012)                  \
  X(NOT_SUPPORTED, 3000)                              \
  X(NOT_SUPPORTED_GRAPH_PATTERN, 3001)                \
  X(NOT_SUPPORTED_SHAPE, 3002)                        \
  X(NOT_SUPPORTED_DATA_TYPE, 3003)                    \
  X(NOT_SUPPORTED_LAYOUT, 3004)                       \
  X(NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, 3005)     \
  X(NOT_SUPPORTED_INCOMPATIBLE_CUDART, 3006)          \
  X(NOT_SUPPORTED_ARCH_MISMATCH, 3007)                \
  X(NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, 3008) \
  X(NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, 3009)       \
  X(NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, 3010)   \
  X(NOT_SUPPORTED_PADDING, 3011)                      \
  X(NOT_SUPPORTED_BAD_LAUNCH_PARAM, 3012)             \
  X(NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, 3013)        \
  X(NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE, 3014)        \
  X(INTERNAL_ERROR, 4000)                             \
  X(INTERNAL_ERROR_COMPILATION_FAILED, 4001)          \
  X(INTERNAL_ERROR_UNEXPECTED_VALUE, 4002)            \
  X(INTERNAL_ERROR_HOST_ALLOCATION_FAILED, 4003)      \
  X(INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, 4004)    \
  X(INTERNAL_ERROR_BAD_LAUNCH_PARAM, 4005)            \
  X(INTERNAL_ERROR_TEXTURE_CREATION_FAILED, 4006)     \
  X(EXECUTION_FAILED, 5000)                           \
  X(EXECUTION_FAILED_CUDA_DRIVER, 5001)               \
  X(EXECUTION_FAILED_CUBLAS, 5002)                    \
  X(EXECUTION_FAILED_CUDART, 5003)                    \
  X(EXECUTION_FAILED_CURAND, 5004)

enum Status : int {
#define JAXLAKE_CUDNN_STATUS_ENUM(name, value) CUDNN_STATUS_##name = value,
  JAXLAKE_CUDNN_STATUSES(JAXLAKE_CUDNN_STATUS_ENUM)
#undef JAXLAKE_CUDNN_STATUS_ENUM
};

// cudnnBackendAttributeType_t values the fake reads.
enum AttrType : int {
  kTypeHandle = 0,
  kTypeDataType = 1,
  kTypeBoolean = 2,
  kTypeInt64 = 3,
  kTypeVoidPtr = 6,
  kTypeHeurMode = 8,
  kTypeNumericalNote = 11,
  kTypeLayoutType = 12,
  kTypeBackendDescriptor = 15,
  kTypeBehaviorNote = 19,
  kTypeInt32 = 23,
  kTypeChar = 24,
  kTypeFraction = 26,
  kTypeLast = 33,  // CUDNN_TYPE_CUDA_GRAPH_RETENTION
};

// cudnnBackendDescriptorType_t values the fake treats specially.
enum DescType : int {
  kEngine = 2,
  kEngineCfg = 3,
  kEngineHeur = 4,
  kExecutionPlan = 5,
  kIntermediateInfo = 6,
  kKnobChoice = 7,
  kKnobInfo = 8,
  kLayoutInfo = 9,
  kOperationGraph = 15,
  kVariantPack = 16,
  kTensor = 17,
  kDeviceProp = 38,
  kDescLast = 50,  // CUDNN_BACKEND_OPERATION_ROPE_BWD_DESCRIPTOR
};

// cudnnBackendAttributeName_t values the fake reads or computes.
enum Attr : int {
  kEngineHeurMode = 200,
  kEngineHeurOperationGraph = 201,
  kEngineHeurResults = 202,
  kEngineCfgEngine = 300,
  kEngineCfgKnobChoices = 302,
  kEngineCfgWorkspaceSize = 303,
  kEngineCfgSharedMemoryUsed = 304,
  kPlanEngineConfig = 401,
  kPlanWorkspaceSize = 402,
  kPlanJson = 405,
  kOperationGraphHandle = 800,
  kOperationGraphOps = 801,
  kOperationGraphEngineGlobalCount = 802,
  kTensorDataType = 901,
  kTensorDimensions = 902,
  kTensorStrides = 903,
  kTensorUniqueId = 906,
  kTensorIsVirtual = 907,
  kTensorIsByValue = 908,
  kVariantPackUniqueIds = 1000,
  kVariantPackDataPointers = 1001,
  kVariantPackWorkspace = 1003,
  kEngineOperationGraph = 1300,
  kEngineGlobalIndex = 1301,
  kEngineKnobInfo = 1302,
  kEngineNumericalNote = 1303,
  kEngineLayoutInfo = 1304,
  kEngineBehaviorNote = 1305,
};

struct Descriptor;
using Ref = std::shared_ptr<Descriptor>;

struct Attribute {
  int type = 0;
  std::int64_t count = 0;
  std::vector<unsigned char> bytes;
  std::vector<Ref> refs;  // the descriptors of a descriptor-valued one
};

// A tensor the plan's graph reads or writes, as execution checks it.
struct PlanTensor {
  std::int64_t uid;
  std::uint64_t bytes;
  bool by_value;
};

// The engines of every operation graph, and the one heuristics return.
constexpr std::int64_t kEngines = 2;
constexpr std::int64_t kHeuristicsEngine = 1;

struct Descriptor {
  int type = 0;
  bool finalized = false;
  std::map<int, Attribute> attrs;
  // Execution plans: their engine's global index, and what execution
  // checks.
  std::int64_t engine = 0;
  std::uint64_t workspace = 0;
  std::vector<PlanTensor> tensors;
};

struct Handle {
  void* stream = nullptr;
};

struct Registry {
  std::mutex mu;
  std::unordered_map<Descriptor*, Ref> descriptors;
  std::set<Handle*> handles;
};
inline Registry& R() {
  static Registry* r = new Registry;  // outlives every static destructor
  return *r;
}

// The calling thread's last error message (cudnnGetLastErrorString).
extern thread_local std::string last_error;

// Returns `status`, keeping `message` for cudnnGetLastErrorString.
int Fail(int status, const std::string& message);

// The descriptor a handle names, or null (with R().mu held).
Ref Find(void* p);

const Attribute* Get(const Descriptor& d, int name);

template <typename T>
bool GetOne(const Descriptor& d, int name, int type, T* out) {
  const Attribute* a = Get(d, name);
  if (a == nullptr || a->type != type || a->count < 1 ||
      a->bytes.size() < sizeof(T))
    return false;
  std::memcpy(out, a->bytes.data(), sizeof(T));
  return true;
}

// The bytes of one element of an attribute type; 0 for an unknown type.
std::size_t ElementSize(int type);

// "descriptor type N", for messages.
std::string Named(int type);

// The attributes finalization requires and computes, by descriptor type.
int Finalize(Descriptor* d);

// Checks the variant pack against the plan before the plan "runs".
int CheckVariantPack(const Descriptor& plan, const Descriptor& pack);

const char* StatusName(int status);

}  // namespace jaxlake::fakegpu::cudnn

#endif  // JAXLAKE_FAKEGPU_CUDNN_BACKEND_H_
