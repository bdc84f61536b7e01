// src/swiglu.cu under the CUDA emulation (include/cuda_emu.h).
#include "cuda_emu.h"
#include "emu_register.h"
#include "../src/swiglu.cu"

extern "C" mtrl_emu::Invoke mtrl_emu_find_swiglu(const char* name) {
  static const mtrl_emu::Entry table[] = {
      MTRL_EMU_ENTRY(swiglu_fwd_bf16), MTRL_EMU_ENTRY(swiglu_fwd_f16), MTRL_EMU_ENTRY(swiglu_fwd_f32),
      MTRL_EMU_ENTRY(swiglu_bwd_bf16), MTRL_EMU_ENTRY(swiglu_bwd_f16), MTRL_EMU_ENTRY(swiglu_bwd_f32)};
  return mtrl_emu::pick(name, table);
}
