// mtrl's C entry points to FlashAttention-2 (Tri Dao, BSD-3-Clause: LICENSE-flash-attention),
// built from the flash-attn 2.8.3 sources on PyPI (scripts/setup-cuda.sh) in place of its
// torch-bound flash_api.cpp. The parameter set-up follows that file's mha_varlen_fwd and
// mha_varlen_bwd for the cases mtrl runs: packed rows (cu_seqlens), causal, no dropout, no
// window, no ALiBi, no softcap; bf16, head dims 64 and 128, GQA (heads % heads_k == 0). Training
// attends rows to themselves (mtrl_flash_varlen_fwd/bwd); the engine's prefill attends each
// chunk of queries to its whole sequence so far (mtrl_flash_prefix_fwd: the queries are the last
// positions of their key row, the causal mask aligned to the bottom right, as FA2 does when
// seqlen_q < seqlen_k).
//
// Layouts (contiguous, element strides): q, out, dout, dq [total, heads, d]; k, v [total,
// heads_k, d]; dk_expanded, dv_expanded [total, heads, d] (one slice per query head: the caller
// sums each group of heads / heads_k into dk, dv); lse [heads, total] f32 (natural log of the
// softmax denominator of the scaled scores); cu_seqlens [batch + 1] int32 on the device. The
// prefix forward: q, out [total_q, heads, d]; k, v [total_k, heads_k, d]; cu_seqlens_q,
// cu_seqlens_k [batch + 1]; lse [heads, total_q].
// Scratch the caller allocates: rng_state 2 × u64; for the backward dq_accum, zeroed,
// [nsplits, total + 128 · batch, heads, d_rounded] f32 with nsplits from mtrl_flash_dq_splits
// (the deterministic backward: run to run the same bits), softmax_d [heads, total + 128 · batch].
//
// Return value: 0, or 1 for a shape or dtype this build does not take, or 2 for a CUDA error;
// mtrl_flash_last_error() describes the last non-zero return of this thread.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "c10/cuda/CUDAException.h"
#include "cutlass/numeric_types.h"
#include "namespace_config.h"
#include "flash.h"

namespace mtrl_flash {
static thread_local char g_msg[512] = {0};
static thread_local bool g_failed = false;

void record_error(cudaError_t e, const char* file, int line) {
  if (!g_failed) {
    g_failed = true;
    snprintf(g_msg, sizeof g_msg, "%s (%s:%d)", cudaGetErrorString(e), file, line);
  }
}

static int fail(int code, const char* msg) {
  snprintf(g_msg, sizeof g_msg, "%s", msg);
  return code;
}

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

// The head dims and dtypes compiled in (the TUs build.rs takes).
static bool supported(int head_dim, int is_bf16) {
  return is_bf16 && (head_dim == 64 || head_dim == 128);
}

// Rows of queries and of keys: offsets [batch + 1], the longest, the total of queries.
struct Rows {
  const int* cu_q;
  const int* cu_k;
  int batch, max_q, max_k, total_q;
};

static Rows self_rows(const int* cu_seqlens, int batch, int max_seqlen, int total) {
  return {cu_seqlens, cu_seqlens, batch, max_seqlen, max_seqlen, total};
}

static void set_fwd(FLASH_NAMESPACE::Flash_fwd_params& p, const void* q, const void* k,
                    const void* v, void* out, float* lse, const Rows& r, int heads, int heads_k,
                    int d, float scale, uint64_t* rng_state) {
  p = {};
  p.is_bf16 = true;
  p.q_ptr = const_cast<void*>(q);
  p.k_ptr = const_cast<void*>(k);
  p.v_ptr = const_cast<void*>(v);
  p.q_row_stride = (int64_t)heads * d;
  p.k_row_stride = (int64_t)heads_k * d;
  p.v_row_stride = (int64_t)heads_k * d;
  p.q_head_stride = d;
  p.k_head_stride = d;
  p.v_head_stride = d;
  p.o_ptr = out;
  p.o_row_stride = (int64_t)heads * d;
  p.o_head_stride = d;
  p.cu_seqlens_q = const_cast<int*>(r.cu_q);
  p.cu_seqlens_k = const_cast<int*>(r.cu_k);
  p.seqused_k = nullptr;
  p.p_ptr = nullptr;
  p.softmax_lse_ptr = lse;
  p.b = r.batch;
  p.h = heads;
  p.h_k = heads_k;
  p.h_h_k_ratio = heads / heads_k;
  p.seqlen_q = r.max_q;
  p.seqlen_k = r.max_k;
  p.seqlen_q_rounded = round_up(r.max_q, 128);
  p.seqlen_k_rounded = round_up(r.max_k, 128);
  p.d = d;
  p.d_rounded = round_up(d, 32);
  p.total_q = r.total_q;
  p.softcap = 0.f;
  p.scale_softmax = scale;
  p.scale_softmax_log2 = scale * float(M_LOG2E);
  // No dropout: the probability of keeping is 1.
  p.p_dropout = 1.f;
  p.p_dropout_in_uint8_t = 255;
  p.rp_dropout = 1.f;
  p.scale_softmax_rp_dropout = scale;
  // Causal: window (seqlen_k, 0), as set_params_fprop turns (-1, 0) into. With seqlen_q <
  // seqlen_k the kernels align the mask to the bottom right: query i of a row of lq queries and
  // lk keys sees keys 0..=lk - lq + i.
  p.is_causal = true;
  p.window_size_left = r.max_k;
  p.window_size_right = 0;
  p.is_seqlens_k_cumulative = true;
  p.unpadded_lse = true;
  p.seqlenq_ngroups_swapped = false;
  p.alibi_slopes_ptr = nullptr;
  p.block_table = nullptr;
  p.page_block_size = 1;
  p.num_splits = 0;
  p.rng_state = rng_state;
}

static int check(int batch, int max_seqlen, int total, int heads, int heads_k, int d,
                 int is_bf16, int max_seqlen_k = 1) {
  g_failed = false;
  g_msg[0] = 0;
  if (!supported(d, is_bf16)) {
    return fail(1, "flash attention: this build takes bf16 with head dim 64 or 128");
  }
  if (batch <= 0 || max_seqlen <= 0 || max_seqlen_k <= 0 || total <= 0 || heads_k <= 0 ||
      heads % heads_k != 0) {
    return fail(1, "flash attention: empty batch or heads not a multiple of the KV heads");
  }
  return 0;
}

static int status() { return g_failed ? 2 : 0; }
}  // namespace mtrl_flash

using namespace mtrl_flash;

extern "C" const char* mtrl_flash_last_error() { return g_msg; }

// Splits of the deterministic backward's dq accumulator (as FA2's mha_varlen_bwd sizes it).
extern "C" int mtrl_flash_dq_splits(int batch, int heads) {
  int dev = 0, sms = 1;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    return 1;
  }
  int bh = batch * heads;
  return bh <= 0 ? 1 : (sms + bh - 1) / bh;
}

extern "C" int mtrl_flash_varlen_fwd(const void* q, const void* k, const void* v, void* out,
                                     float* lse, const int* cu_seqlens, int batch,
                                     int max_seqlen, int total, int heads, int heads_k,
                                     int head_dim, float scale, int is_bf16,
                                     uint64_t* rng_state, cudaStream_t stream) {
  int c = check(batch, max_seqlen, total, heads, heads_k, head_dim, is_bf16);
  if (c != 0) return c;
  FLASH_NAMESPACE::Flash_fwd_params p = {};
  set_fwd(p, q, k, v, out, lse, self_rows(cu_seqlens, batch, max_seqlen, total), heads, heads_k,
          head_dim, scale, rng_state);
  if (head_dim == 64) {
    FLASH_NAMESPACE::run_mha_fwd_<cutlass::bfloat16_t, 64, true>(p, stream);
  } else {
    FLASH_NAMESPACE::run_mha_fwd_<cutlass::bfloat16_t, 128, true>(p, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return status();
}

// The engine's prefill: each row's queries are the last positions of its key row (a prompt
// chunk after the sequence's stored positions), causal from the bottom right. No backward.
extern "C" int mtrl_flash_prefix_fwd(const void* q, const void* k, const void* v, void* out,
                                     float* lse, const int* cu_seqlens_q,
                                     const int* cu_seqlens_k, int batch, int max_seqlen_q,
                                     int max_seqlen_k, int total_q, int heads, int heads_k,
                                     int head_dim, float scale, int is_bf16,
                                     uint64_t* rng_state, cudaStream_t stream) {
  int c = check(batch, max_seqlen_q, total_q, heads, heads_k, head_dim, is_bf16, max_seqlen_k);
  if (c != 0) return c;
  if (max_seqlen_q > max_seqlen_k) {
    return fail(1, "flash attention: a row has more queries than keys");
  }
  FLASH_NAMESPACE::Flash_fwd_params p = {};
  const Rows r = {cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, total_q};
  set_fwd(p, q, k, v, out, lse, r, heads, heads_k, head_dim, scale, rng_state);
  if (head_dim == 64) {
    FLASH_NAMESPACE::run_mha_fwd_<cutlass::bfloat16_t, 64, true>(p, stream);
  } else {
    FLASH_NAMESPACE::run_mha_fwd_<cutlass::bfloat16_t, 128, true>(p, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return status();
}

extern "C" int mtrl_flash_varlen_bwd(const void* dout, const void* q, const void* k,
                                     const void* v, const void* out, const float* lse,
                                     void* dq, void* dk_expanded, void* dv_expanded,
                                     float* dq_accum, int dq_splits, float* softmax_d,
                                     const int* cu_seqlens, int batch, int max_seqlen,
                                     int total, int heads, int heads_k, int head_dim,
                                     float scale, int is_bf16, uint64_t* rng_state,
                                     cudaStream_t stream) {
  int c = check(batch, max_seqlen, total, heads, heads_k, head_dim, is_bf16);
  if (c != 0) return c;
  if (dq_splits <= 0) return fail(1, "flash attention: dq_splits must be at least 1");
  // Value-initialised: set_fwd resets only the forward part, and every field of the backward's
  // own part not set below (the batch strides: unused with cu_seqlens) must be zero.
  FLASH_NAMESPACE::Flash_bwd_params p = {};
  set_fwd(p, q, k, v, const_cast<void*>(out), const_cast<float*>(lse),
          self_rows(cu_seqlens, batch, max_seqlen, total), heads, heads_k, head_dim, scale,
          rng_state);
  const int64_t hd = (int64_t)heads * head_dim;
  p.do_ptr = const_cast<void*>(dout);
  p.do_row_stride = hd;
  p.do_head_stride = head_dim;
  p.dq_ptr = dq;
  p.dk_ptr = dk_expanded;
  p.dv_ptr = dv_expanded;
  // dk, dv are written per query head ([total, heads, d]) and summed by the caller.
  p.dq_row_stride = hd;
  p.dk_row_stride = hd;
  p.dv_row_stride = hd;
  p.dq_head_stride = head_dim;
  p.dk_head_stride = head_dim;
  p.dv_head_stride = head_dim;
  p.dq_accum_ptr = dq_accum;
  p.dk_accum_ptr = nullptr;
  p.dv_accum_ptr = nullptr;
  p.dsoftmax_sum = softmax_d;
  p.deterministic = true;
  p.dq_accum_split_stride =
      (int64_t)(total + 128 * batch) * heads * round_up(head_dim, 32);
  if (head_dim == 64) {
    FLASH_NAMESPACE::run_mha_bwd_<cutlass::bfloat16_t, 64, true>(p, stream);
  } else {
    FLASH_NAMESPACE::run_mha_bwd_<cutlass::bfloat16_t, 128, true>(p, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return status();
}
