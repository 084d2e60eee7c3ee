// The fake GPU's cuDNN: handles, streams, versions and status strings, and
// the backend (graph) API that cudnn-frontend, compiled into XLA, drives:
// descriptors that hold their attributes, finalization that computes the
// read-only ones, engine heuristics, execution plans and their JSON form,
// variant packs, and execution in stream order.
//
// The rules of the fake (cc/fakegpu/README.md, "cuDNN"):
// - A descriptor keeps every attribute as set: its type, its element count
//   and its bytes. cudnnBackendGetAttribute returns them as set, and the
//   attributes finalization computes; a descriptor-valued attribute fills
//   the caller's descriptors with copies of the stored ones, as cuDNN does.
// - Every operation graph has two engines: engine 0 needs no workspace,
//   engine 1 needs the workspace rule's; heuristics, in every mode, return
//   one engine config, of engine 1. (XLA with autotuning off runs engine 0
//   of a convolution with a scratch buffer of no bytes, so engine 0 must
//   need none.)
// - The workspace rule: the size in bytes of the largest non-virtual
//   tensor the operation graph reads or writes (a tensor's bytes: (1 + sum
//   over dimensions of (dim - 1) * stride) elements of its data type;
//   by-value tensors excluded). It is the fake's rule, not cuDNN's, whose
//   workspace depends on the engine and its knobs.
// - cudnnBackendExecute checks the variant pack against the plan (every
//   non-virtual tensor's pointer is device memory of the tensor's bytes,
//   the workspace is device memory of the plan's size) and enqueues, on the
//   handle's stream, work that does nothing to the data: it is a kernel.
// - The engines carry no behavior note: in particular not
//   SUPPORTS_CUDA_GRAPH_NATIVE_API, so cudnnBackendPopulateCudaGraph and
//   cudnnBackendUpdateCudaGraph refuse, and a CUDA graph gets a plan by
//   capturing cudnnBackendExecute.
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

bool Cuda13() { return fg::Opts().cuda_major == 13; }

constexpr int kCudnnMajor = 9, kCudnnMinor = 19, kCudnnPatch = 0;

// cudnnStatus_t (cudnn_graph.h).
enum Status : int {
  kSuccess = 0,
  kNotInitialized = 1001,
  kBadParam = 2000,
  kNullPointer = 2002,
  kNotFinalized = 2004,
  kOutOfBound = 2005,
  kSizeInsufficient = 2006,
  kAttributeType = 2010,
  kDescriptorType = 2012,
  kNotSupported = 3000,
  kNoNativeCudaGraph = 3013,
  kHostAllocationFailed = 4003,
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

// The bytes of one element of an attribute type; 0 for an unknown type.
std::size_t ElementSize(int type) {
  switch (type) {
    case kTypeHandle:
    case kTypeInt64:
    case 5:  // CUDNN_TYPE_DOUBLE
    case kTypeVoidPtr:
    case kTypeBackendDescriptor:
      return 8;
    case kTypeBoolean:
    case kTypeChar:
      return 1;
    case kTypeFraction:  // cudnnFraction_t: two int64_t
      return 16;
    default:  // float, int32 and the enums
      return type >= 0 && type <= kTypeLast ? 4 : 0;
  }
}

// The bytes of one element of a cudnnDataType_t (sub-byte types round up).
std::size_t DataTypeSize(int t) {
  switch (t) {
    case 1: case 10: case 20: return 8;   // double, int64, complex fp32
    case 21: return 16;                   // complex fp64
    case 2: case 9: return 2;             // half, bfloat16
    case 0: case 4: case 5: case 7: case 14: case 19: return 4;
    case 8: return 32;                    // int8x32
    default: return 1;                    // int8, uint8, bool, fp8, fp4...
  }
}

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
Registry& R() {
  static Registry* r = new Registry;  // outlives every static destructor
  return *r;
}

thread_local std::string last_error;

// Returns `status`, keeping `message` for cudnnGetLastErrorString.
int Fail(int status, const std::string& message) {
  last_error = message;
  return status;
}

Ref Find(void* p) {  // with R().mu held
  auto it = R().descriptors.find(static_cast<Descriptor*>(p));
  return it == R().descriptors.end() ? nullptr : it->second;
}

const Attribute* Get(const Descriptor& d, int name) {
  auto it = d.attrs.find(name);
  return it == d.attrs.end() ? nullptr : &it->second;
}

bool GetInt64s(const Descriptor& d, int name, std::vector<std::int64_t>* out) {
  const Attribute* a = Get(d, name);
  if (a == nullptr || a->type != kTypeInt64) return false;
  out->resize(static_cast<std::size_t>(a->count));
  if (a->count > 0) std::memcpy(out->data(), a->bytes.data(), a->bytes.size());
  return true;
}

template <typename T>
bool GetOne(const Descriptor& d, int name, int type, T* out) {
  const Attribute* a = Get(d, name);
  if (a == nullptr || a->type != type || a->count < 1 ||
      a->bytes.size() < sizeof(T))
    return false;
  std::memcpy(out, a->bytes.data(), sizeof(T));
  return true;
}

Ref GetRef(const Descriptor& d, int name) {
  const Attribute* a = Get(d, name);
  return a == nullptr || a->refs.empty() ? nullptr : a->refs[0];
}

void SetComputed(Descriptor* d, int name, int type, const void* data,
                 std::int64_t count) {
  Attribute a;
  a.type = type;
  a.count = count;
  a.bytes.resize(static_cast<std::size_t>(count) * ElementSize(type));
  if (!a.bytes.empty()) std::memcpy(a.bytes.data(), data, a.bytes.size());
  d->attrs[name] = std::move(a);
}

void SetInt64(Descriptor* d, int name, std::int64_t v) {
  SetComputed(d, name, kTypeInt64, &v, 1);
}

// The tensors that the operations of `graph` reach through their
// descriptor-valued attributes (operations, and tensors' own descriptors
// such as ragged offsets), each once.
void CollectTensors(const Ref& d, std::set<const Descriptor*>* seen,
                    std::vector<Ref>* out) {
  if (d == nullptr || !seen->insert(d.get()).second) return;
  if (d->type == kTensor) out->push_back(d);
  for (const auto& [name, a] : d->attrs)
    for (const Ref& r : a.refs) CollectTensors(r, seen, out);
}

// The tensors of an operation graph that execution needs pointers for.
bool GraphTensors(const Descriptor& graph, std::vector<PlanTensor>* out,
                  std::string* why) {
  std::set<const Descriptor*> seen;
  std::vector<Ref> tensors;
  const Attribute* ops = Get(graph, kOperationGraphOps);
  if (ops != nullptr)
    for (const Ref& op : ops->refs) CollectTensors(op, &seen, &tensors);
  for (const Ref& t : tensors) {
    bool is_virtual = false, by_value = false;
    GetOne(*t, kTensorIsVirtual, kTypeBoolean, &is_virtual);
    GetOne(*t, kTensorIsByValue, kTypeBoolean, &by_value);
    if (is_virtual) continue;
    PlanTensor p{0, 0, by_value};
    int dtype = 0;
    std::vector<std::int64_t> dims, strides;
    if (!GetOne(*t, kTensorUniqueId, kTypeInt64, &p.uid) ||
        !GetOne(*t, kTensorDataType, kTypeDataType, &dtype) ||
        !GetInt64s(*t, kTensorDimensions, &dims) ||
        !GetInt64s(*t, kTensorStrides, &strides) ||
        dims.size() != strides.size()) {
      *why = "a tensor of the operation graph lacks its unique id, data "
             "type, dimensions or strides";
      return false;
    }
    std::uint64_t extent = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] <= 0) extent = 0;
      if (extent != 0 && strides[i] > 0)
        extent += static_cast<std::uint64_t>(dims[i] - 1) *
                  static_cast<std::uint64_t>(strides[i]);
    }
    p.bytes = extent * DataTypeSize(dtype);
    out->push_back(p);
  }
  return true;
}

std::uint64_t WorkspaceRule(const std::vector<PlanTensor>& tensors) {
  std::uint64_t w = 0;
  for (const PlanTensor& t : tensors)
    if (!t.by_value && t.bytes > w) w = t.bytes;
  return w;
}

// An engine's workspace on its graph's tensors: none for engine 0, the
// rule's for engine 1.
std::uint64_t EngineWorkspace(const Descriptor& engine,
                              const std::vector<PlanTensor>& tensors) {
  std::int64_t index = 0;
  GetOne(engine, kEngineGlobalIndex, kTypeInt64, &index);
  return index == 0 ? 0 : WorkspaceRule(tensors);
}

// The plan's JSON form (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION):
// what execution checks, so that a deserialized plan checks the same.
std::string PlanJson(const Descriptor& plan) {
  std::string s = "{\"jaxlake_fakegpu_plan\":1,\"engine\":" +
                  std::to_string(plan.engine) + ",\"workspace\":" +
                  std::to_string(plan.workspace) + ",\"tensors\":[";
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlanTensor& t = plan.tensors[i];
    s += (i ? ",[" : "[") + std::to_string(t.uid) + "," +
         std::to_string(t.bytes) + "," + (t.by_value ? "1" : "0") + "]";
  }
  return s + "]}";
}

bool ParsePlanJson(const std::string& s, Descriptor* plan) {
  unsigned long long ws = 0;
  long long engine = -1;
  int n = 0;
  if (std::sscanf(s.c_str(),
                  "{\"jaxlake_fakegpu_plan\":1,\"engine\":%lld,"
                  "\"workspace\":%llu,\"tensors\":[%n",
                  &engine, &ws, &n) != 2 || n == 0 || engine < 0 ||
      engine >= kEngines)
    return false;
  std::vector<PlanTensor> tensors;
  std::size_t at = static_cast<std::size_t>(n);
  while (at < s.size() && s[at] != ']') {
    long long uid = 0;
    unsigned long long bytes = 0;
    int by_value = 0, used = 0;
    if (std::sscanf(s.c_str() + at, "[%lld,%llu,%d]%n", &uid, &bytes,
                    &by_value, &used) != 3 || used == 0)
      return false;
    tensors.push_back({uid, bytes, by_value != 0});
    at += static_cast<std::size_t>(used);
    if (at < s.size() && s[at] == ',') ++at;
  }
  if (s.compare(at, std::string::npos, "]}") != 0) return false;
  plan->engine = engine;
  plan->workspace = ws;
  plan->tensors = std::move(tensors);
  return true;
}

std::string Named(int type) {
  return "descriptor type " + std::to_string(type);
}

// What finalization computes for an engine, and for an engine config of
// `workspace` bytes.
void EngineComputed(Descriptor* d) {
  SetComputed(d, kEngineKnobInfo, kTypeBackendDescriptor, nullptr, 0);
  SetComputed(d, kEngineNumericalNote, kTypeNumericalNote, nullptr, 0);
  SetComputed(d, kEngineBehaviorNote, kTypeBehaviorNote, nullptr, 0);
  SetComputed(d, kEngineLayoutInfo, kTypeBackendDescriptor, nullptr, 0);
}

void EngineCfgComputed(Descriptor* d, std::uint64_t workspace) {
  if (Get(*d, kEngineCfgKnobChoices) == nullptr)
    SetComputed(d, kEngineCfgKnobChoices, kTypeBackendDescriptor, nullptr, 0);
  SetInt64(d, kEngineCfgWorkspaceSize, static_cast<std::int64_t>(workspace));
  const std::int32_t shared_memory = 0;  // no kernel runs
  SetComputed(d, kEngineCfgSharedMemoryUsed, kTypeInt32, &shared_memory, 1);
}

Attribute RefAttribute(Ref r) {
  Attribute a;
  a.type = kTypeBackendDescriptor;
  a.count = 1;
  a.bytes.resize(8);
  const Descriptor* p = r.get();
  std::memcpy(a.bytes.data(), &p, 8);
  a.refs.push_back(std::move(r));
  return a;
}

// A deserialized plan's engine config: the plan's engine of a graph the
// JSON does not carry, with the plan's workspace.
Ref DeserializedEngineCfg(std::int64_t index, std::uint64_t workspace) {
  auto engine = std::make_shared<Descriptor>();
  engine->type = kEngine;
  SetInt64(engine.get(), kEngineGlobalIndex, index);
  EngineComputed(engine.get());
  engine->finalized = true;
  auto cfg = std::make_shared<Descriptor>();
  cfg->type = kEngineCfg;
  cfg->attrs[kEngineCfgEngine] = RefAttribute(engine);
  EngineCfgComputed(cfg.get(), workspace);
  cfg->finalized = true;
  return cfg;
}

// The attributes finalization requires and computes, by descriptor type.
int Finalize(Descriptor* d) {
  switch (d->type) {
    case kTensor: {
      std::vector<std::int64_t> dims, strides;
      std::int64_t uid = 0;
      int dtype = 0;
      if (!GetInt64s(*d, kTensorDimensions, &dims) ||
          !GetInt64s(*d, kTensorStrides, &strides) ||
          !GetOne(*d, kTensorUniqueId, kTypeInt64, &uid) ||
          !GetOne(*d, kTensorDataType, kTypeDataType, &dtype))
        return Fail(kBadParam,
                    "cudnnBackendFinalize: a tensor needs its data type, "
                    "dimensions, strides and unique id");
      if (dims.empty() || dims.size() != strides.size())
        return Fail(kBadParam,
                    "cudnnBackendFinalize: a tensor's dimensions and strides "
                    "differ in count (or are empty)");
      return kSuccess;
    }
    case kOperationGraph: {
      const Attribute* ops = Get(*d, kOperationGraphOps);
      if (ops == nullptr || ops->refs.empty() ||
          Get(*d, kOperationGraphHandle) == nullptr)
        return Fail(kBadParam,
                    "cudnnBackendFinalize: an operation graph needs its "
                    "handle and at least one operation");
      for (const Ref& op : ops->refs)
        if (op == nullptr || !op->finalized)
          return Fail(kNotFinalized,
                      "cudnnBackendFinalize: an operation of the graph is "
                      "not finalized");
      SetInt64(d, kOperationGraphEngineGlobalCount, kEngines);
      return kSuccess;
    }
    case kEngine: {
      const Ref graph = GetRef(*d, kEngineOperationGraph);
      std::int64_t index = -1;
      if (graph == nullptr || !graph->finalized ||
          !GetOne(*d, kEngineGlobalIndex, kTypeInt64, &index))
        return Fail(kBadParam,
                    "cudnnBackendFinalize: an engine needs a finalized "
                    "operation graph and a global index");
      if (index < 0 || index >= kEngines)
        return Fail(kNotSupported,
                    "cudnnBackendFinalize: the fake GPU's cuDNN has two "
                    "engines a graph (global index 0 or 1), not " +
                        std::to_string(index));
      EngineComputed(d);
      return kSuccess;
    }
    case kEngineCfg: {
      const Ref engine = GetRef(*d, kEngineCfgEngine);
      if (engine == nullptr || !engine->finalized)
        return Fail(kBadParam,
                    "cudnnBackendFinalize: an engine config needs a "
                    "finalized engine");
      const Ref graph = GetRef(*engine, kEngineOperationGraph);
      std::vector<PlanTensor> tensors;
      std::string why;
      if (graph == nullptr || !GraphTensors(*graph, &tensors, &why))
        return Fail(kBadParam, "cudnnBackendFinalize: " + why);
      EngineCfgComputed(d, EngineWorkspace(*engine, tensors));
      return kSuccess;
    }
    case kEngineHeur: {
      const Ref graph = GetRef(*d, kEngineHeurOperationGraph);
      int mode = -1;
      if (graph == nullptr || !graph->finalized ||
          !GetOne(*d, kEngineHeurMode, kTypeHeurMode, &mode))
        return Fail(kBadParam,
                    "cudnnBackendFinalize: engine heuristics need a "
                    "finalized operation graph and a mode");
      auto engine = std::make_shared<Descriptor>();
      engine->type = kEngine;
      engine->attrs[kEngineOperationGraph] = RefAttribute(graph);
      SetInt64(engine.get(), kEngineGlobalIndex, kHeuristicsEngine);
      if (int r = Finalize(engine.get()); r != kSuccess) return r;
      engine->finalized = true;
      auto cfg = std::make_shared<Descriptor>();
      cfg->type = kEngineCfg;
      cfg->attrs[kEngineCfgEngine] = RefAttribute(engine);
      if (int r = Finalize(cfg.get()); r != kSuccess) return r;
      cfg->finalized = true;
      d->attrs[kEngineHeurResults] = RefAttribute(cfg);
      return kSuccess;
    }
    case kExecutionPlan: {
      const Ref cfg = GetRef(*d, kPlanEngineConfig);
      const Attribute* json = Get(*d, kPlanJson);
      if (cfg == nullptr) {
        if (json == nullptr)
          return Fail(kBadParam,
                      "cudnnBackendFinalize: an execution plan needs an "
                      "engine config or its JSON representation");
        std::string text(json->bytes.begin(), json->bytes.end());
        text = text.c_str();  // up to the terminating null
        if (!ParsePlanJson(text, d))
          return Fail(kBadParam,
                      "cudnnBackendFinalize: the JSON representation is not "
                      "a plan of the fake GPU's cuDNN");
        d->attrs[kPlanEngineConfig] =
            RefAttribute(DeserializedEngineCfg(d->engine, d->workspace));
      } else {
        if (!cfg->finalized)
          return Fail(kNotFinalized,
                      "cudnnBackendFinalize: the plan's engine config is not "
                      "finalized");
        const Ref engine = GetRef(*cfg, kEngineCfgEngine);
        const Ref graph =
            engine == nullptr ? nullptr : GetRef(*engine, kEngineOperationGraph);
        std::string why;
        d->tensors.clear();
        if (graph == nullptr || !GraphTensors(*graph, &d->tensors, &why))
          return Fail(kBadParam, "cudnnBackendFinalize: " + why);
        d->workspace = EngineWorkspace(*engine, d->tensors);
        GetOne(*engine, kEngineGlobalIndex, kTypeInt64, &d->engine);
        const std::string text = PlanJson(*d);
        SetComputed(d, kPlanJson, kTypeChar, text.c_str(),
                    static_cast<std::int64_t>(text.size() + 1));
      }
      SetInt64(d, kPlanWorkspaceSize, static_cast<std::int64_t>(d->workspace));
      return kSuccess;
    }
    case kVariantPack: {
      const Attribute* ids = Get(*d, kVariantPackUniqueIds);
      const Attribute* ptrs = Get(*d, kVariantPackDataPointers);
      const std::int64_t nids = ids == nullptr ? 0 : ids->count;
      const std::int64_t nptrs = ptrs == nullptr ? 0 : ptrs->count;
      if (nids != nptrs)
        return Fail(kBadParam,
                    "cudnnBackendFinalize: a variant pack has " +
                        std::to_string(nids) + " unique ids and " +
                        std::to_string(nptrs) + " data pointers");
      return kSuccess;
    }
    default:  // operations and their parameters: they hold their attributes
      return kSuccess;
  }
}

// Checks the variant pack against the plan before the plan "runs".
int CheckVariantPack(const Descriptor& plan, const Descriptor& pack) {
  std::map<std::int64_t, std::uintptr_t> pointers;
  const Attribute* ids = Get(pack, kVariantPackUniqueIds);
  const Attribute* ptrs = Get(pack, kVariantPackDataPointers);
  if (ids != nullptr && ptrs != nullptr)
    for (std::int64_t i = 0; i < ids->count && i < ptrs->count; ++i) {
      std::int64_t uid = 0;
      std::uintptr_t p = 0;
      std::memcpy(&uid, ids->bytes.data() + 8 * i, 8);
      std::memcpy(&p, ptrs->bytes.data() + 8 * i, 8);
      pointers[uid] = p;
    }
  auto device_bytes = [](std::uintptr_t p, std::uint64_t n) {
    fg::Range r;
    return p != 0 && fg::FindRange(p, &r) && r.kind != fg::Kind::kHost &&
           p - r.base + n <= r.size;
  };
  for (const PlanTensor& t : plan.tensors) {
    auto it = pointers.find(t.uid);
    if (it == pointers.end() || it->second == 0)
      return Fail(kBadParam, "cudnnBackendExecute: the variant pack has no "
                             "pointer for tensor " + std::to_string(t.uid));
    if (!t.by_value && !device_bytes(it->second, t.bytes)) {
      char msg[200];
      std::snprintf(msg, sizeof msg,
                    "cudnnBackendExecute: tensor %" PRId64 "'s pointer %p is "
                    "not device memory of %" PRIu64 " bytes",
                    t.uid, reinterpret_cast<void*>(it->second), t.bytes);
      return Fail(kBadParam, msg);
    }
  }
  if (plan.workspace > 0) {
    std::uintptr_t ws = 0;
    GetOne(pack, kVariantPackWorkspace, kTypeVoidPtr, &ws);
    if (!device_bytes(ws, plan.workspace))
      return Fail(kBadParam,
                  "cudnnBackendExecute: the workspace is not device memory of "
                  "the plan's " + std::to_string(plan.workspace) + " bytes");
  }
  return kSuccess;
}

const char* StatusName(int status) {
  switch (status) {
#define S(name, value) case value: return #name;
    S(CUDNN_STATUS_SUCCESS, 0)
    S(CUDNN_STATUS_NOT_INITIALIZED, 1001)
    S(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, 1002)
    S(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, 1003)
    S(CUDNN_STATUS_DEPRECATED, 1004)
    S(CUDNN_STATUS_LICENSE_ERROR, 1005)
    S(CUDNN_STATUS_RUNTIME_IN_PROGRESS, 1006)
    S(CUDNN_STATUS_RUNTIME_FP_OVERFLOW, 1007)
    S(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, 1008)
    S(CUDNN_STATUS_BAD_PARAM, 2000)
    S(CUDNN_STATUS_INVALID_VALUE, 2001)
    S(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, 2002)
    S(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, 2003)
    S(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, 2004)
    S(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, 2005)
    S(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT, 2006)
    S(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH, 2007)
    S(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, 2008)
    S(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, 2009)
    S(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, 2010)
    S(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH, 2011)
    S(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, 2012)
    S(CUDNN_STATUS_NOT_SUPPORTED, 3000)
    S(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, 3001)
    S(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, 3002)
    S(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, 3003)
    S(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, 3004)
    S(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, 3005)
    S(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART, 3006)
    S(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, 3007)
    S(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, 3008)
    S(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, 3009)
    S(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, 3010)
    S(CUDNN_STATUS_NOT_SUPPORTED_PADDING, 3011)
    S(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM, 3012)
    S(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, 3013)
    S(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE, 3014)
    S(CUDNN_STATUS_INTERNAL_ERROR, 4000)
    S(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, 4001)
    S(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE, 4002)
    S(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, 4003)
    S(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, 4004)
    S(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM, 4005)
    S(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED, 4006)
    S(CUDNN_STATUS_EXECUTION_FAILED, 5000)
    S(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, 5001)
    S(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS, 5002)
    S(CUDNN_STATUS_EXECUTION_FAILED_CUDART, 5003)
    S(CUDNN_STATUS_EXECUTION_FAILED_CURAND, 5004)
#undef S
    default:
      return "CUDNN_STATUS_UNKNOWN";
  }
}

}  // namespace

// ---- library, handles and streams -------------------------------------------

LIB std::size_t cudnnGetVersion() {
  return kCudnnMajor * 10000 + kCudnnMinor * 100 + kCudnnPatch;
}
LIB std::size_t cudnnGetCudartVersion() { return Cuda13() ? 13000 : 12090; }
LIB std::size_t cudnnGetMaxDeviceVersion() { return 1200; }

// cuDNN 9's sub-libraries (graph, ops, cnn, adv) check that their versions
// agree; XLA calls these when it starts cuDNN. The fake is one library, so
// they always agree.
LIB int cudnnGraphVersionCheck() { return kSuccess; }
LIB int cudnnOpsVersionCheck() { return kSuccess; }
LIB int cudnnCnnVersionCheck() { return kSuccess; }
LIB int cudnnAdvVersionCheck() { return kSuccess; }

LIB int cudnnGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return kNullPointer;
  *value = type == 0 ? kCudnnMajor : type == 1 ? kCudnnMinor : kCudnnPatch;
  return kSuccess;
}

LIB const char* cudnnGetErrorString(int status) { return StatusName(status); }

// The message of the calling thread's last error, then cleared.
LIB void cudnnGetLastErrorString(char* message, std::size_t n) {
  if (message == nullptr || n == 0) return;
  std::snprintf(message, n, "%s", last_error.c_str());
  last_error.clear();
}

LIB int cudnnCreate(void** handle) {
  ENTER();
  if (handle == nullptr) return kNullPointer;
  auto* h = new Handle;
  std::lock_guard<std::mutex> lock(R().mu);
  R().handles.insert(h);
  *handle = h;
  return kSuccess;
}

LIB int cudnnDestroy(void* handle) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  auto* h = static_cast<Handle*>(handle);
  if (R().handles.erase(h) == 0)
    return Fail(kBadParam, "cudnnDestroy: not a cuDNN handle");
  delete h;
  return kSuccess;
}

LIB int cudnnSetStream(void* handle, void* stream) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  auto* h = static_cast<Handle*>(handle);
  if (R().handles.count(h) == 0)
    return Fail(kBadParam, "cudnnSetStream: not a cuDNN handle");
  h->stream = stream;
  return kSuccess;
}

LIB int cudnnGetStream(void* handle, void** stream) {
  ENTER();
  if (stream == nullptr) return kNullPointer;
  std::lock_guard<std::mutex> lock(R().mu);
  auto* h = static_cast<Handle*>(handle);
  if (R().handles.count(h) == 0)
    return Fail(kBadParam, "cudnnGetStream: not a cuDNN handle");
  *stream = h->stream;
  return kSuccess;
}

// ---- the backend API --------------------------------------------------------

LIB int cudnnBackendCreateDescriptor(int type, void** descriptor) {
  ENTER();
  if (descriptor == nullptr) return kNullPointer;
  if (type < 0 || type > kDescLast)
    return Fail(kNotSupported, "cudnnBackendCreateDescriptor: unknown " +
                                   Named(type));
  auto d = std::make_shared<Descriptor>();
  d->type = type;
  std::lock_guard<std::mutex> lock(R().mu);
  R().descriptors[d.get()] = d;
  *descriptor = d.get();
  return kSuccess;
}

LIB int cudnnBackendDestroyDescriptor(void* descriptor) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  if (R().descriptors.erase(static_cast<Descriptor*>(descriptor)) == 0)
    return Fail(kBadParam,
                "cudnnBackendDestroyDescriptor: not a backend descriptor");
  return kSuccess;
}

LIB int cudnnBackendInitialize(void* descriptor) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(kBadParam, "cudnnBackendInitialize: not a backend descriptor");
  const int type = d->type;
  *d = Descriptor();
  d->type = type;
  return kSuccess;
}

LIB int cudnnBackendSetAttribute(void* descriptor, int name, int type,
                                 std::int64_t count, const void* elements) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(kBadParam,
                "cudnnBackendSetAttribute: not a backend descriptor");
  if (d->finalized)
    return Fail(kBadParam, "cudnnBackendSetAttribute: attribute " +
                               std::to_string(name) + " of a finalized " +
                               Named(d->type));
  const std::size_t size = ElementSize(type);
  if (size == 0 || count < 0 || (count > 0 && elements == nullptr))
    return Fail(kBadParam, "cudnnBackendSetAttribute: attribute " +
                               std::to_string(name) + ": bad type " +
                               std::to_string(type) + " or count " +
                               std::to_string(count));
  Attribute a;
  a.type = type;
  a.count = count;
  a.bytes.resize(static_cast<std::size_t>(count) * size);
  if (count > 0) std::memcpy(a.bytes.data(), elements, a.bytes.size());
  if (type == kTypeBackendDescriptor) {
    for (std::int64_t i = 0; i < count; ++i) {
      void* p = static_cast<void* const*>(elements)[i];
      Ref r = Find(p);
      if (r == nullptr)
        return Fail(kBadParam, "cudnnBackendSetAttribute: element " +
                                   std::to_string(i) + " of attribute " +
                                   std::to_string(name) +
                                   " is not a backend descriptor");
      a.refs.push_back(std::move(r));
    }
  }
  d->attrs[name] = std::move(a);
  return kSuccess;
}

LIB int cudnnBackendGetAttribute(void* descriptor, int name, int type,
                                 std::int64_t requested, std::int64_t* count,
                                 void* elements) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(kBadParam,
                "cudnnBackendGetAttribute: not a backend descriptor");
  if (requested < 0)
    return Fail(kBadParam, "cudnnBackendGetAttribute: bad requested count " +
                               std::to_string(requested));
  if (elements == nullptr) requested = 0;  // a query of the count
  const Attribute* a = Get(*d, name);
  if (a == nullptr) {
    if (!d->finalized)
      return Fail(kNotFinalized, "cudnnBackendGetAttribute: attribute " +
                                     std::to_string(name) + " of an "
                                     "unfinalized " + Named(d->type));
    fg::Unsupported("cudnn",
                    ("cudnnBackendGetAttribute(attribute " +
                     std::to_string(name) + ", " + Named(d->type) + ")")
                        .c_str(),
                    kBadParam);
    return Fail(kBadParam, "cudnnBackendGetAttribute: attribute " +
                               std::to_string(name) + " of " +
                               Named(d->type) + " was not set");
  }
  if (a->type != type)
    return Fail(kAttributeType, "cudnnBackendGetAttribute: attribute " +
                                    std::to_string(name) + " has type " +
                                    std::to_string(a->type) + ", not " +
                                    std::to_string(type));
  if (count != nullptr) *count = a->count;
  const std::int64_t n = requested < a->count ? requested : a->count;
  if (type == kTypeBackendDescriptor) {
    for (std::int64_t i = 0; i < n; ++i) {
      const Ref dst = Find(static_cast<void**>(elements)[i]);
      if (dst == nullptr)
        return Fail(kBadParam, "cudnnBackendGetAttribute: element " +
                                   std::to_string(i) +
                                   " is not a backend descriptor");
      const Ref& src = a->refs[static_cast<std::size_t>(i)];
      if (dst->type != src->type)
        return Fail(kDescriptorType, "cudnnBackendGetAttribute: element " +
                                         std::to_string(i) + " is a " +
                                         Named(dst->type) + ", not a " +
                                         Named(src->type));
      if (dst != src) *dst = *src;
    }
  } else if (n > 0) {
    std::memcpy(elements, a->bytes.data(),
                static_cast<std::size_t>(n) * ElementSize(type));
  }
  return kSuccess;
}

LIB int cudnnBackendFinalize(void* descriptor) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(kBadParam, "cudnnBackendFinalize: not a backend descriptor");
  if (d->finalized)
    return Fail(kBadParam, "cudnnBackendFinalize: already finalized");
  const int r = Finalize(d.get());
  if (r == kSuccess) d->finalized = true;
  return r;
}

LIB int cudnnBackendExecute(void* handle, void* plan, void* pack) {
  ENTER();
  fg::Stream* stream = nullptr;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    auto* h = static_cast<Handle*>(handle);
    if (R().handles.count(h) == 0)
      return Fail(kBadParam, "cudnnBackendExecute: not a cuDNN handle");
    const Ref p = Find(plan), v = Find(pack);
    if (p == nullptr || p->type != kExecutionPlan || v == nullptr ||
        v->type != kVariantPack)
      return Fail(kBadParam, "cudnnBackendExecute: needs an execution plan "
                             "and a variant pack");
    if (!p->finalized || !v->finalized)
      return Fail(kNotFinalized, "cudnnBackendExecute: the plan or the "
                                 "variant pack is not finalized");
    if (int r = CheckVariantPack(*p, *v); r != kSuccess) return r;
    stream = fg::StreamOf(h->stream, fg::CurrentDevice());
  }
  if (stream == nullptr)
    return Fail(kBadParam, "cudnnBackendExecute: the handle's stream is not "
                           "a stream");
  stream->Enqueue([] {});  // the plan's kernels, which do not run
  return kSuccess;
}

// The fake's engines carry no CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API
// note, so a plan is put in a CUDA graph by capturing cudnnBackendExecute,
// as cuDNN requires of such plans; the native calls refuse it.
LIB int cudnnBackendPopulateCudaGraph(void*, void*, void*, void*) {
  ENTER();
  return Fail(kNoNativeCudaGraph, "cudnnBackendPopulateCudaGraph: the plan's engine does "
                    "not support the native CUDA graph API (capture "
                    "cudnnBackendExecute instead)");
}

LIB int cudnnBackendUpdateCudaGraph(void*, void*, void*, void*) {
  ENTER();
  return Fail(kNoNativeCudaGraph, "cudnnBackendUpdateCudaGraph: the plan's engine does "
                    "not support the native CUDA graph API");
}
