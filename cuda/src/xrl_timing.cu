// xrl GPU timing harness: CUDA-event timing on the caller's stream, L2 flush, CUDA-graph replay.
// The C ABI and its contract are in ../include/xrl_timing.h. Only the CUDA runtime API is used, linked
// statically (-cudart static), so loading the library needs no libcudart and works on a machine
// without a GPU or driver: xrl_timing_device_count then reports 0 devices.

#include "xrl_timing.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <vector>

namespace {

#define XRL_CHECK(expr)                                 \
  do {                                                  \
    cudaError_t xrl_err_ = (expr);                      \
    if (xrl_err_ != cudaSuccess) return (int)xrl_err_;  \
  } while (0)

// One flush buffer per device, allocated on first use and kept: cudaMalloc inside a timing loop
// would synchronise the device.
struct FlushBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};
std::mutex g_flush_mutex;
std::vector<FlushBuffer> g_flush;

int flush_buffer(int device, FlushBuffer* out) {
  std::lock_guard<std::mutex> lock(g_flush_mutex);
  if ((int)g_flush.size() <= device) g_flush.resize(device + 1);
  FlushBuffer& buf = g_flush[device];
  if (buf.ptr == nullptr) {
    int l2 = 0;
    XRL_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    // Twice L2 (and at least 8 MiB): a write of it leaves none of the timed work's lines resident.
    size_t bytes = std::max<size_t>(2 * (size_t)l2, (size_t)8 << 20);
    XRL_CHECK(cudaMalloc(&buf.ptr, bytes));
    buf.bytes = bytes;
  }
  *out = buf;
  return 0;
}

// Restores the calling thread's current device on scope exit, so timing never moves the caller.
class DeviceGuard {
 public:
  DeviceGuard() { ok_ = cudaGetDevice(&prev_) == cudaSuccess; }
  ~DeviceGuard() {
    if (ok_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool ok_ = false;
};

// Destroys every event it holds on scope exit, whichever way the timing loop leaves.
class Events {
 public:
  ~Events() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  int create(int n) {
    events_.reserve(n);
    for (int i = 0; i < n; ++i) {
      cudaEvent_t e;
      XRL_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return 0;
  }
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

// The shared loop: warm-up, then per repetition [flush] start-event launch*inner stop-event; one
// host wait at the end. `launch` enqueues the timed work on `stream` and returns a status.
template <class Launch>
int time_loop(int device, cudaStream_t stream, int warmup, int repeats, int inner, int flush_l2, float* times_ms,
              Launch launch) {
  if (device < 0 || warmup < 0 || repeats < 1 || inner < 1 || times_ms == nullptr) return XRL_TIMING_EINVAL;
  DeviceGuard guard;
  XRL_CHECK(cudaSetDevice(device));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  XRL_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return XRL_TIMING_ECAPTURE;
  FlushBuffer flush;
  if (flush_l2) {
    int status = flush_buffer(device, &flush);
    if (status != 0) return status;
  }
  for (int i = 0; i < warmup; ++i) {
    int status = launch();
    if (status != 0) return status;
  }
  Events events;
  int status = events.create(2 * repeats);
  if (status != 0) return status;
  for (int r = 0; r < repeats; ++r) {
    if (flush_l2) XRL_CHECK(cudaMemsetAsync(flush.ptr, r & 0xff, flush.bytes, stream));
    XRL_CHECK(cudaEventRecord(events[2 * r], stream));
    for (int i = 0; i < inner; ++i) {
      status = launch();
      if (status != 0) return status;
    }
    XRL_CHECK(cudaEventRecord(events[2 * r + 1], stream));
  }
  XRL_CHECK(cudaEventSynchronize(events[2 * repeats - 1]));
  for (int r = 0; r < repeats; ++r) {
    float ms = 0.f;
    XRL_CHECK(cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]));
    times_ms[r] = ms / (float)inner;
  }
  return 0;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) {
  }
}

}  // namespace

extern "C" {

int xrl_timing_abi_version(void) { return XRL_TIMING_ABI_VERSION; }

int xrl_timing_runtime_version(void) { return CUDART_VERSION; }

int xrl_timing_device_count(int* count) {
  if (count == nullptr) return XRL_TIMING_EINVAL;
  *count = 0;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  switch (err) {
    case cudaSuccess:
      *count = n;
      return 0;
    case cudaErrorNoDevice:           // a driver, no GPU
    case cudaErrorInsufficientDriver:  // no driver (libcuda.so absent) or one older than the runtime
    case cudaErrorStubLibrary:         // the toolkit's stub libcuda, as on a build machine
      cudaGetLastError();              // clear it: later calls must not see a sticky error
      return 0;
    default:
      return (int)err;
  }
}

int xrl_timing_l2_bytes(int device, int* bytes) {
  if (bytes == nullptr || device < 0) return XRL_TIMING_EINVAL;
  XRL_CHECK(cudaDeviceGetAttribute(bytes, cudaDevAttrL2CacheSize, device));
  return 0;
}

int xrl_timing_time_callback(int device, uintptr_t stream, xrl_timing_callback fn, void* user, int warmup,
                             int repeats, int inner, int flush_l2, float* times_ms) {
  if (fn == nullptr) return XRL_TIMING_EINVAL;
  return time_loop(device, (cudaStream_t)stream, warmup, repeats, inner, flush_l2, times_ms, [&]() -> int {
    fn(user);
    return 0;
  });
}

int xrl_timing_time_graph(int device, uintptr_t stream, uintptr_t graph_exec, int warmup, int repeats, int inner,
                          int flush_l2, float* times_ms) {
  if (graph_exec == 0) return XRL_TIMING_EINVAL;
  cudaStream_t s = (cudaStream_t)stream;
  cudaGraphExec_t exec = (cudaGraphExec_t)graph_exec;
  return time_loop(device, s, warmup, repeats, inner, flush_l2, times_ms,
                   [&]() -> int { return (int)cudaGraphLaunch(exec, s); });
}

int xrl_timing_time_spin(int device, uintptr_t stream, uint64_t ns, int warmup, int repeats, int flush_l2,
                         float* times_ms) {
  cudaStream_t s = (cudaStream_t)stream;
  return time_loop(device, s, warmup, repeats, 1, flush_l2, times_ms, [&]() -> int {
    spin_kernel<<<1, 1, 0, s>>>((unsigned long long)ns);
    return (int)cudaGetLastError();
  });
}

int xrl_timing_release(void) {
  std::lock_guard<std::mutex> lock(g_flush_mutex);
  int status = 0;
  for (FlushBuffer& buf : g_flush) {
    if (buf.ptr != nullptr) {
      cudaError_t err = cudaFree(buf.ptr);
      if (err != cudaSuccess && status == 0) status = (int)err;
    }
    buf = FlushBuffer();
  }
  return status;
}

const char* xrl_timing_error_string(int status) {
  switch (status) {
    case 0:
      return "success";
    case XRL_TIMING_EINVAL:
      return "invalid argument to the xrl timing harness";
    case XRL_TIMING_ECAPTURE:
      return "the stream is being captured into a CUDA graph; time it after capture ends";
    default:
      return status > 0 ? cudaGetErrorString((cudaError_t)status) : "unknown xrl timing status";
  }
}

}  // extern "C"
