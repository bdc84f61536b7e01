// src/rms_norm.cu under the CUDA emulation (include/cuda_emu.h).
#include "cuda_emu.h"
#include "emu_register.h"
#include "../src/rms_norm.cu"

extern "C" mtrl_emu::Invoke mtrl_emu_find_rms_norm(const char* name) {
  static const mtrl_emu::Entry table[] = {
      MTRL_EMU_ENTRY(rms_norm_fwd_bf16),    MTRL_EMU_ENTRY(rms_norm_fwd_f16),
      MTRL_EMU_ENTRY(rms_norm_fwd_f32),     MTRL_EMU_ENTRY(rms_norm_bwd_dx_bf16),
      MTRL_EMU_ENTRY(rms_norm_bwd_dx_f16),  MTRL_EMU_ENTRY(rms_norm_bwd_dx_f32),
      MTRL_EMU_ENTRY(rms_norm_bwd_dw_bf16), MTRL_EMU_ENTRY(rms_norm_bwd_dw_f16),
      MTRL_EMU_ENTRY(rms_norm_bwd_dw_f32)};
  return mtrl_emu::pick(name, table);
}
