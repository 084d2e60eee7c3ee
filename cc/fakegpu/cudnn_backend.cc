// The fake GPU's cuDNN backend: descriptors that hold their attributes,
// finalization that computes the read-only ones (engines, their
// workspaces, execution plans and their JSON form), and the check of a
// variant pack against its plan (the rules: cudnn.cc's top, and
// cc/fakegpu/README.md, "cuDNN").
#include "cc/fakegpu/cudnn_backend.h"

#include <cinttypes>
#include <cstdio>

#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;

namespace jaxlake::fakegpu::cudnn {

thread_local std::string last_error;

namespace {

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

bool GetInt64s(const Descriptor& d, int name, std::vector<std::int64_t>* out) {
  const Attribute* a = Get(d, name);
  if (a == nullptr || a->type != kTypeInt64) return false;
  out->resize(static_cast<std::size_t>(a->count));
  if (a->count > 0) std::memcpy(out->data(), a->bytes.data(), a->bytes.size());
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

}  // namespace

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

std::string Named(int type) {
  return "descriptor type " + std::to_string(type);
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
        return Fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendFinalize: a tensor needs its data type, "
                    "dimensions, strides and unique id");
      if (dims.empty() || dims.size() != strides.size())
        return Fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendFinalize: a tensor's dimensions and strides "
                    "differ in count (or are empty)");
      return CUDNN_STATUS_SUCCESS;
    }
    case kOperationGraph: {
      const Attribute* ops = Get(*d, kOperationGraphOps);
      if (ops == nullptr || ops->refs.empty() ||
          Get(*d, kOperationGraphHandle) == nullptr)
        return Fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendFinalize: an operation graph needs its "
                    "handle and at least one operation");
      for (const Ref& op : ops->refs)
        if (op == nullptr || !op->finalized)
          return Fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                      "cudnnBackendFinalize: an operation of the graph is "
                      "not finalized");
      SetInt64(d, kOperationGraphEngineGlobalCount, kEngines);
      return CUDNN_STATUS_SUCCESS;
    }
    case kEngine: {
      const Ref graph = GetRef(*d, kEngineOperationGraph);
      std::int64_t index = -1;
      if (graph == nullptr || !graph->finalized ||
          !GetOne(*d, kEngineGlobalIndex, kTypeInt64, &index))
        return Fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendFinalize: an engine needs a finalized "
                    "operation graph and a global index");
      if (index < 0 || index >= kEngines)
        return Fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "cudnnBackendFinalize: the fake GPU's cuDNN has two "
                    "engines a graph (global index 0 or 1), not " +
                        std::to_string(index));
      EngineComputed(d);
      return CUDNN_STATUS_SUCCESS;
    }
    case kEngineCfg: {
      const Ref engine = GetRef(*d, kEngineCfgEngine);
      if (engine == nullptr || !engine->finalized)
        return Fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendFinalize: an engine config needs a "
                    "finalized engine");
      const Ref graph = GetRef(*engine, kEngineOperationGraph);
      std::vector<PlanTensor> tensors;
      std::string why;
      if (graph == nullptr || !GraphTensors(*graph, &tensors, &why))
        return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: " + why);
      EngineCfgComputed(d, EngineWorkspace(*engine, tensors));
      return CUDNN_STATUS_SUCCESS;
    }
    case kEngineHeur: {
      const Ref graph = GetRef(*d, kEngineHeurOperationGraph);
      int mode = -1;
      if (graph == nullptr || !graph->finalized ||
          !GetOne(*d, kEngineHeurMode, kTypeHeurMode, &mode))
        return Fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendFinalize: engine heuristics need a "
                    "finalized operation graph and a mode");
      auto engine = std::make_shared<Descriptor>();
      engine->type = kEngine;
      engine->attrs[kEngineOperationGraph] = RefAttribute(graph);
      SetInt64(engine.get(), kEngineGlobalIndex, kHeuristicsEngine);
      if (int r = Finalize(engine.get()); r != CUDNN_STATUS_SUCCESS) return r;
      engine->finalized = true;
      auto cfg = std::make_shared<Descriptor>();
      cfg->type = kEngineCfg;
      cfg->attrs[kEngineCfgEngine] = RefAttribute(engine);
      if (int r = Finalize(cfg.get()); r != CUDNN_STATUS_SUCCESS) return r;
      cfg->finalized = true;
      d->attrs[kEngineHeurResults] = RefAttribute(cfg);
      return CUDNN_STATUS_SUCCESS;
    }
    case kExecutionPlan: {
      const Ref cfg = GetRef(*d, kPlanEngineConfig);
      const Attribute* json = Get(*d, kPlanJson);
      if (cfg == nullptr) {
        if (json == nullptr)
          return Fail(CUDNN_STATUS_BAD_PARAM,
                      "cudnnBackendFinalize: an execution plan needs an "
                      "engine config or its JSON representation");
        std::string text(json->bytes.begin(), json->bytes.end());
        text = text.c_str();  // up to the terminating null
        if (!ParsePlanJson(text, d))
          return Fail(CUDNN_STATUS_BAD_PARAM,
                      "cudnnBackendFinalize: the JSON representation is not "
                      "a plan of the fake GPU's cuDNN");
        d->attrs[kPlanEngineConfig] =
            RefAttribute(DeserializedEngineCfg(d->engine, d->workspace));
      } else {
        if (!cfg->finalized)
          return Fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                      "cudnnBackendFinalize: the plan's engine config is not "
                      "finalized");
        const Ref engine = GetRef(*cfg, kEngineCfgEngine);
        const Ref graph =
            engine == nullptr ? nullptr : GetRef(*engine, kEngineOperationGraph);
        std::string why;
        d->tensors.clear();
        if (graph == nullptr || !GraphTensors(*graph, &d->tensors, &why))
          return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: " + why);
        d->workspace = EngineWorkspace(*engine, d->tensors);
        GetOne(*engine, kEngineGlobalIndex, kTypeInt64, &d->engine);
        const std::string text = PlanJson(*d);
        SetComputed(d, kPlanJson, kTypeChar, text.c_str(),
                    static_cast<std::int64_t>(text.size() + 1));
      }
      SetInt64(d, kPlanWorkspaceSize, static_cast<std::int64_t>(d->workspace));
      return CUDNN_STATUS_SUCCESS;
    }
    case kVariantPack: {
      const Attribute* ids = Get(*d, kVariantPackUniqueIds);
      const Attribute* ptrs = Get(*d, kVariantPackDataPointers);
      const std::int64_t nids = ids == nullptr ? 0 : ids->count;
      const std::int64_t nptrs = ptrs == nullptr ? 0 : ptrs->count;
      if (nids != nptrs)
        return Fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendFinalize: a variant pack has " +
                        std::to_string(nids) + " unique ids and " +
                        std::to_string(nptrs) + " data pointers");
      return CUDNN_STATUS_SUCCESS;
    }
    default:  // operations and their parameters: they hold their attributes
      return CUDNN_STATUS_SUCCESS;
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
      return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the variant pack has no "
                             "pointer for tensor " + std::to_string(t.uid));
    if (!t.by_value && !device_bytes(it->second, t.bytes)) {
      char msg[200];
      std::snprintf(msg, sizeof msg,
                    "cudnnBackendExecute: tensor %" PRId64 "'s pointer %p is "
                    "not device memory of %" PRIu64 " bytes",
                    t.uid, reinterpret_cast<void*>(it->second), t.bytes);
      return Fail(CUDNN_STATUS_BAD_PARAM, msg);
    }
  }
  if (plan.workspace > 0) {
    std::uintptr_t ws = 0;
    GetOne(pack, kVariantPackWorkspace, kTypeVoidPtr, &ws);
    if (!device_bytes(ws, plan.workspace))
      return Fail(CUDNN_STATUS_BAD_PARAM,
                  "cudnnBackendExecute: the workspace is not device memory of "
                  "the plan's " + std::to_string(plan.workspace) + " bytes");
  }
  return CUDNN_STATUS_SUCCESS;
}

const char* StatusName(int status) {
  switch (status) {
#define JAXLAKE_CUDNN_STATUS_CASE(name, value) \
  case value:                                  \
    return "CUDNN_STATUS_" #name;
    JAXLAKE_CUDNN_STATUSES(JAXLAKE_CUDNN_STATUS_CASE)
#undef JAXLAKE_CUDNN_STATUS_CASE
    default:
      return "CUDNN_STATUS_UNKNOWN";
  }
}

}  // namespace jaxlake::fakegpu::cudnn
