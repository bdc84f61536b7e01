// src/logprob_head.cu under the CUDA emulation (include/cuda_emu.h).
#include "cuda_emu.h"
#include "emu_register.h"
#include "../src/logprob_head.cu"

extern "C" mtrl_emu::Invoke mtrl_emu_find_logprob_head(const char* name) {
  static const mtrl_emu::Entry table[] = {
      MTRL_EMU_ENTRY(lse_pick_entropy_bf16), MTRL_EMU_ENTRY(lse_pick_entropy_f16),
      MTRL_EMU_ENTRY(lse_pick_entropy_f32),  MTRL_EMU_ENTRY(dlogits_bf16),
      MTRL_EMU_ENTRY(dlogits_f16),           MTRL_EMU_ENTRY(dlogits_f32)};
  return mtrl_emu::pick(name, table);
}
