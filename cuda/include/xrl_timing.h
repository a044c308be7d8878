/* xrl GPU timing harness: a small C ABI over the CUDA runtime, loaded from Python with ctypes
 * (xrl/cost/cuda_harness.py).
 *
 * Every function returns a status: 0 on success, otherwise a cudaError_t code (xrl_timing_error_string
 * names it) or one of the XRL_TIMING_E* codes below. Results come back through pointer arguments.
 *
 * Timing. Each repetition is bracketed by two CUDA events recorded on the caller's stream (a
 * cudaStream_t passed as an integer, e.g. torch.cuda.current_stream().cuda_stream), so the time is
 * GPU time of the work enqueued between them. Repetitions are enqueued back to back without a host
 * synchronisation; the host waits once, at the end. With flush_l2 set, a buffer twice the size of
 * the device's L2 cache is overwritten (cudaMemsetAsync, outside the timed interval) before every
 * repetition, so each one starts from a cold L2 as a layer inside a large network would.
 *
 * What is timed: either a CUDA graph (a cudaGraphExec_t, e.g. torch.cuda.CUDAGraph.raw_cuda_graph_exec())
 * launched `inner` times per repetition, or a host callback that enqueues work on the stream (called
 * `inner` times per repetition; its launch gaps are part of the time when the GPU outruns it).
 * The times written are per launch: the repetition's time divided by `inner`.
 */
#ifndef XRL_TIMING_H
#define XRL_TIMING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XRL_TIMING_ABI_VERSION 1

/* The library is built with hidden visibility (and the static CUDA runtime's symbols hidden), so only
 * these functions are exported and the harness cannot interpose on the process's own libcudart. */
#if defined(__GNUC__)
#define XRL_TIMING_API __attribute__((visibility("default")))
#else
#define XRL_TIMING_API
#endif

#define XRL_TIMING_EINVAL -1    /* an argument out of range (repeats < 1, null pointer, ...) */
#define XRL_TIMING_ECAPTURE -2  /* the stream is being captured into a CUDA graph: timing it is meaningless */

typedef void (*xrl_timing_callback)(void* user);

/* XRL_TIMING_ABI_VERSION of the compiled library. */
XRL_TIMING_API int xrl_timing_abi_version(void);

/* The CUDA runtime version the library was built against (e.g. 13000). */
XRL_TIMING_API int xrl_timing_runtime_version(void);

/* Number of CUDA devices. No driver or no device is not an error: *count = 0 and the status is 0. */
XRL_TIMING_API int xrl_timing_device_count(int* count);

/* L2 cache size of `device` in bytes (cudaDevAttrL2CacheSize). */
XRL_TIMING_API int xrl_timing_l2_bytes(int device, int* bytes);

/* Time `repeats` repetitions (after `warmup` untimed ones) of `fn(user)` called `inner` times on `stream`.
 * times_ms[i] receives milliseconds per call for repetition i. */
XRL_TIMING_API int xrl_timing_time_callback(int device, uintptr_t stream, xrl_timing_callback fn, void* user,
                                            int warmup, int repeats, int inner, int flush_l2, float* times_ms);

/* The same for a CUDA graph executable launched `inner` times per repetition. */
XRL_TIMING_API int xrl_timing_time_graph(int device, uintptr_t stream, uintptr_t graph_exec, int warmup,
                                         int repeats, int inner, int flush_l2, float* times_ms);

/* Self-test: time a one-thread kernel that spins for `ns` nanoseconds (by the GPU's global timer).
 * A correct harness reports about ns / 1e6 ms per repetition. */
XRL_TIMING_API int xrl_timing_time_spin(int device, uintptr_t stream, uint64_t ns, int warmup, int repeats,
                                        int flush_l2, float* times_ms);

/* Free the L2 flush buffers (they are kept between calls). */
XRL_TIMING_API int xrl_timing_release(void);

/* A static string naming a status code. */
XRL_TIMING_API const char* xrl_timing_error_string(int status);

#ifdef __cplusplus
}
#endif

#endif /* XRL_TIMING_H */
