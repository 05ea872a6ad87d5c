// Convolutions through cuDNN 9's backend API (src/cuda/conv.h). libcudnn.so.9 is opened at the first call
// (dlopen), so that kiln neither needs cuDNN to build against at link time nor fails to load where it is
// missing: then every convolution takes ops/conv.cpp's im2col path.
//
// Per case (the operation, dtype, shapes, geometry and the pointers' alignment) an operation graph of one
// convolution node goes to cuDNN's heuristics (mode A). Of the engine configurations that finalise into an
// execution plan, and whose numerical notes the dtype allows, the first kCandidates are timed on the call's own
// tensors (one warm-up and kTimedRuns runs each, cudaEvents on the call's stream) and the fastest is cached with
// its workspace size for the process; the heuristics' first alone with KILN_CONV_TUNE=0, or while the stream is
// capturing a graph (no synchronisation is allowed there; the choice is then made at the next eager call). f32 refuses engines that use tensor cores (TF32) or convert inputs down, so that f32 keeps f32's
// accuracy as kiln's other f32 products do. The workspace comes from kiln's caching allocator, on the stream
// the convolution runs on, so that the three memory figures stay true.
#include <cudnn.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/backend.h"
#include "cuda/conv.h"
#include "cuda/launch.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

// ---- the library, opened at run time -----------------------------------------------------------------------
struct Api {
  void* lib = nullptr;
  std::string where, why;
  size_t version = 0;
  decltype(&::cudnnGetVersion) get_version = nullptr;
  decltype(&::cudnnGetErrorString) error_string = nullptr;
  decltype(&::cudnnCreate) create = nullptr;
  decltype(&::cudnnSetStream) set_stream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) create_desc = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) destroy_desc = nullptr;
  decltype(&::cudnnBackendSetAttribute) set_attr = nullptr;
  decltype(&::cudnnBackendGetAttribute) get_attr = nullptr;
  decltype(&::cudnnBackendFinalize) finalize = nullptr;
  decltype(&::cudnnBackendExecute) execute = nullptr;
};

template <class F>
bool resolve(Api& a, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(a.lib, name));
  if (!f) a.why = str("libcudnn has no ", name);
  return f != nullptr;
}

const Api& api() {
  static const Api* a = [] {
    auto* r = new Api;  // never destroyed: used until the process ends
    const char* off = std::getenv("KILN_CUDNN");
    if (off && std::strcmp(off, "0") == 0) {
      r->why = "turned off (KILN_CUDNN=0)";
      return r;
    }
    std::vector<std::string> names;
    if (const char* p = std::getenv("KILN_CUDNN_LIBRARY")) names.push_back(p);
    names.push_back("libcudnn.so.9");
#ifdef KILN_CUDNN_LIBDIR
    names.push_back(std::string(KILN_CUDNN_LIBDIR) + "/libcudnn.so.9");
#endif
    for (const std::string& n : names) {
      r->lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (r->lib) {
        r->where = n;
        break;
      }
    }
    if (!r->lib) {
      r->why = "libcudnn.so.9 not found (install cuDNN 9 for CUDA, or set KILN_CUDNN_LIBRARY)";
      return r;
    }
    const bool ok = resolve(*r, r->get_version, "cudnnGetVersion") && resolve(*r, r->error_string, "cudnnGetErrorString") &&
                    resolve(*r, r->create, "cudnnCreate") && resolve(*r, r->set_stream, "cudnnSetStream") &&
                    resolve(*r, r->create_desc, "cudnnBackendCreateDescriptor") &&
                    resolve(*r, r->destroy_desc, "cudnnBackendDestroyDescriptor") &&
                    resolve(*r, r->set_attr, "cudnnBackendSetAttribute") &&
                    resolve(*r, r->get_attr, "cudnnBackendGetAttribute") && resolve(*r, r->finalize, "cudnnBackendFinalize") &&
                    resolve(*r, r->execute, "cudnnBackendExecute");
    if (ok) {
      r->version = r->get_version();
      if (r->version < 90000) r->why = str("cuDNN ", r->version, " is older than 9.0");
    }
    if (!r->why.empty()) {
      dlclose(r->lib);
      r->lib = nullptr;
    }
    return r;
  }();
  return *a;
}

// A status other than success: the graph could not be built for this case (the caller falls back).
struct NotTaken {
  cudnnStatus_t status;
};

void ok(cudnnStatus_t s) {
  if (s != CUDNN_STATUS_SUCCESS) throw NotTaken{s};
}

// A backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) { ok(api().create_desc(type, &d_)); }
  ~Desc() {
    if (d_) api().destroy_desc(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const T* values) {
    ok(api().set_attr(d_, name, type, count, values));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void finalize() { ok(api().finalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// ---- plans, cached per case -------------------------------------------------------------------------------
struct Plan {
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
};

struct DeviceState {
  std::mutex mu;  // one convolution at a time per device: the handle and the cache
  cudnnHandle_t handle = nullptr;
  std::map<std::string, std::shared_ptr<Plan>> plans;  // a null plan: no engine takes the case
  // Plans built while a stream captured a graph (not the timed choice): kept, as the graph may refer to them.
  std::vector<std::shared_ptr<Plan>> captured;
};

constexpr int kMaxDevices = 64;
DeviceState& state(Device d) {
  static DeviceState* s = new DeviceState[kMaxDevices];  // never destroyed
  KILN_CHECK(d.index >= 0 && d.index < kMaxDevices, "conv: device index ", d.index, " out of range");
  return s[d.index];
}

cudnnDataType_t data_type(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_DOUBLE;  // not reached: the caller checks
  }
}

int64_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 16;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

// [N, C, *S] as cuDNN sees it: a 1-D case gains a spatial dim of 1 in front (cuDNN wants at least 2).
std::vector<int64_t> dims_of(const Tensor& t) {
  std::vector<int64_t> d(t.sizes().begin(), t.sizes().end());
  if (d.size() == 3) d.insert(d.begin() + 2, 1);
  return d;
}

std::vector<int64_t> packed_strides(const std::vector<int64_t>& d) {
  std::vector<int64_t> s(d.size());
  int64_t acc = 1;
  for (size_t i = d.size(); i-- > 0;) {
    s[i] = acc;
    acc *= d[i];
  }
  return s;
}

std::unique_ptr<Desc> tensor_desc(const std::vector<int64_t>& dims, cudnnDataType_t type, int64_t uid, int64_t align) {
  auto t = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::vector<int64_t> strides = packed_strides(dims);
  const auto n = static_cast<int64_t>(dims.size());
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  t->finalize();
  return t;
}

enum class Kind { kForward, kTranspose };
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// Whether an engine configuration's numerical notes suit the dtype.
bool allowed(cudnnBackendDescriptor_t cfg, DType dtype) {
  if (dtype != DType::F32) return true;
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t count = 0;
  ok(api().get_attr(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &e));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  ok(api().get_attr(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                    notes));
  for (int64_t i = 0; i < n; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE || notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
  return true;
}

// The plans for one case in the heuristics' order (at most `most`; none when no engine takes it). `a` is the data cuDNN calls X (the forward input; for
// the transpose, its result), `c` the one it calls Y (the forward output; for the transpose, its input).
std::vector<std::shared_ptr<Plan>> build_plans(cudnnHandle_t handle, Kind kind, DType dtype, const std::vector<int64_t>& xd,
                                               const std::vector<int64_t>& wd, const std::vector<int64_t>& yd,
                                               const ConvGeometry& g1, int64_t ax, int64_t aw, int64_t ay, size_t most) {
  const cudnnDataType_t type = data_type(dtype), compute = CUDNN_DATA_FLOAT;
  auto x = tensor_desc(xd, type, kUidX, ax), w = tensor_desc(wd, type, kUidW, aw), y = tensor_desc(yd, type, kUidY, ay);
  const auto nsp = static_cast<int64_t>(g1.stride.size());
  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nsp)
      .set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, nsp, g1.pad_before.data())
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, nsp, g1.pad_after.data())
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, nsp, g1.dilation.data())
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, nsp, g1.stride.data());
  conv.finalize();
  const float alpha = 1.0f, beta = 0.0f;
  std::unique_ptr<Desc> op;
  if (kind == Kind::kForward) {
    op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *x)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *w)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *y)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  } else {
    op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, *x)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, *w)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, *y)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  }
  op->finalize();
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set_desc(CUDNN_ATTR_OPERATIONGRAPH_OPS, *op).set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph.finalize();
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
  heur.finalize();
  int64_t count = 0;
  ok(api().get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<std::shared_ptr<Plan>> plans;
  if (count <= 0) return plans;
  std::vector<std::unique_ptr<Desc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  ok(api().get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
  for (int64_t i = 0; i < got && plans.size() < most; ++i) {
    try {
      if (!allowed(raw[i], dtype)) continue;
      auto plan = std::make_shared<Plan>();
      plan->plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i]);
      plan->plan->finalize();
      int64_t n = 0;
      ok(api().get_attr(plan->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                        &plan->workspace));
      plans.push_back(std::move(plan));
    } catch (const NotTaken&) {
      // this configuration does not finalise for the case: the next one
    }
  }
  return plans;
}

// Runs a plan on the three tensors (X, W, Y) with a workspace of at least plan.workspace bytes.
cudnnStatus_t execute(cudnnHandle_t handle, const Plan& plan, void* const ptrs[3], void* workspace) {
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  try {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids)
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs)
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    pack.finalize();
    return api().execute(handle, plan.plan->get(), pack.get());
  } catch (const NotTaken& e) {
    return e.status;
  }
}

constexpr size_t kCandidates = 8;
constexpr int kTimedRuns = 3;
// A candidate whose workspace exceeds both the heuristics' first's and this is not timed (the allocator would
// keep the larger block reserved).
constexpr int64_t kTunedWorkspace = int64_t{32} << 20;

bool tuning_on() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CONV_TUNE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// The fastest of the candidates on this call's tensors (the output is written by every run; the caller runs the
// chosen plan once more). A candidate that fails to run is skipped.
std::shared_ptr<Plan> fastest(cudnnHandle_t handle, const std::vector<std::shared_ptr<Plan>>& cands,
                              void* const ptrs[3], Device device, cudaStream_t stream) {
  std::vector<std::shared_ptr<Plan>> timed;
  int64_t ws_max = 1;
  for (const auto& c : cands)
    if (c->workspace <= std::max(cands[0]->workspace, kTunedWorkspace)) {
      timed.push_back(c);
      ws_max = std::max(ws_max, c->workspace);
    }
  const Tensor ws = empty({ws_max}, DType::U8, device);
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "conv: cudaEventCreate");
  check(cudaEventCreate(&stop), "conv: cudaEventCreate");
  std::shared_ptr<Plan> best = cands[0];
  float best_ms = std::numeric_limits<float>::infinity();
  for (const auto& c : timed) {
    bool ran = execute(handle, *c, ptrs, ws.data_ptr()) == CUDNN_STATUS_SUCCESS;
    check(cudaEventRecord(start, stream), "conv: cudaEventRecord");
    for (int i = 0; ran && i < kTimedRuns; ++i) ran = execute(handle, *c, ptrs, ws.data_ptr()) == CUDNN_STATUS_SUCCESS;
    check(cudaEventRecord(stop, stream), "conv: cudaEventRecord");
    check(cudaEventSynchronize(stop), "conv: cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "conv: cudaEventElapsedTime");
    if (ran && ms < best_ms) {
      best = c;
      best_ms = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

bool run(Kind kind, const Tensor& a, const Tensor& w, Tensor& c, const ConvGeometry& g) {
  // kForward: a = X (input), c = Y (output). kTranspose: a = DY (input), c = DX (output).
  const Api& lib = api();
  if (!lib.lib) return false;
  const DType dt = a.dtype();
  if (dt != DType::F32 && dt != DType::F16 && dt != DType::BF16) return false;
  if (a.numel() == 0 || c.numel() == 0 || w.numel() == 0) return false;
  const auto nsp = static_cast<int64_t>(g.stride.size());
  if (nsp < 1 || nsp > 3 || a.dim() != nsp + 2 || w.dim() != nsp + 2 || c.dim() != nsp + 2) return false;
  KILN_CHECK(a.is_contiguous() && w.is_contiguous() && c.is_contiguous(), "conv: internal error: cuDNN needs contiguous tensors");
  // cuDNN's view: X the forward input, Y the forward output.
  const Tensor& X = kind == Kind::kForward ? a : c;
  const Tensor& Y = kind == Kind::kForward ? c : a;
  ConvGeometry g1 = g;
  if (nsp == 1) {  // a 1-D case as 2-D over [.., 1, L]
    g1.stride.insert(g1.stride.begin(), 1);
    g1.dilation.insert(g1.dilation.begin(), 1);
    g1.pad_before.insert(g1.pad_before.begin(), 0);
    g1.pad_after.insert(g1.pad_after.begin(), 0);
  }
  const std::vector<int64_t> xd = dims_of(X), wd = dims_of(w), yd = dims_of(Y);
  const int64_t ax = alignment(X.data_ptr()), aw = alignment(w.data_ptr()), ay = alignment(Y.data_ptr());
  std::string key = str(kind == Kind::kForward ? "f" : "t", static_cast<int>(dt), "|", ax, aw, ay);
  for (const std::vector<int64_t>* v :
       std::initializer_list<const std::vector<int64_t>*>{&xd, &wd, &yd, &g1.stride, &g1.dilation, &g1.pad_before, &g1.pad_after}) {
    key += '|';
    for (int64_t e : *v) key += str(e, ",");
  }
  DeviceGuard guard(a.device());
  DeviceState& st = state(a.device());
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.handle) {
    if (lib.create(&st.handle) != CUDNN_STATUS_SUCCESS) {
      st.handle = nullptr;
      return false;
    }
  }
  const cudaStream_t stream = stream_of(a.device());
  if (lib.set_stream(st.handle, stream) != CUDNN_STATUS_SUCCESS) return false;
  void* const ptrs[3] = {const_cast<void*>(X.data_ptr()), const_cast<void*>(w.data_ptr()), const_cast<void*>(Y.data_ptr())};
  std::shared_ptr<Plan> plan;
  if (auto it = st.plans.find(key); it != st.plans.end()) {
    plan = it->second;
  } else {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream, &capturing), "conv: cudaStreamIsCapturing");
    const bool tune = tuning_on() && capturing == cudaStreamCaptureStatusNone;
    std::vector<std::shared_ptr<Plan>> cands;
    try {
      cands = build_plans(st.handle, kind, dt, xd, wd, yd, g1, ax, aw, ay, tune ? kCandidates : 1);
    } catch (const NotTaken&) {
      cands.clear();
    }
    plan = cands.empty() ? nullptr : cands.size() == 1 ? cands[0] : fastest(st.handle, cands, ptrs, a.device(), stream);
    // Under capture the heuristics' first serves this call; the timed choice waits for an eager one.
    if (tuning_on() == tune || !plan) st.plans.emplace(key, plan);
    else st.captured.push_back(plan);
  }
  if (!plan) return false;
  const Tensor ws = empty({std::max<int64_t>(plan->workspace, 1)}, DType::U8, a.device());
  const cudnnStatus_t status = execute(st.handle, *plan, ptrs, ws.data_ptr());
  // A plan that finalised but does not run is an error, not a case to fall back from: the output may be partly
  // written.
  if (status != CUDNN_STATUS_SUCCESS)
    throw Error(str(kind == Kind::kForward ? "conv" : "conv_transpose", nsp, "d: cuDNN failed: ", lib.error_string(status)));
  return true;
}

}  // namespace

bool cudnn_conv_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) {
  return run(Kind::kForward, x, w, y, g);
}

bool cudnn_conv_transpose(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) {
  return run(Kind::kTranspose, x, w, y, g);
}

bool cudnn_available() { return api().lib != nullptr; }

std::string cudnn_description() {
  const Api& a = api();
  if (!a.lib) return "off: " + a.why;
  return str("cuDNN ", a.version / 10000, ".", (a.version % 10000) / 100, ".", a.version % 100, " (", a.where, ")");
}

}  // namespace kiln::cuda
