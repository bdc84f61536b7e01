// src/paged_attention.cu under the CUDA emulation (include/cuda_emu.h).
#include "cuda_emu.h"
#include "emu_register.h"
#include "../src/paged_attention.cu"

extern "C" mtrl_emu::Invoke mtrl_emu_find_paged_attention(const char* name) {
  static const mtrl_emu::Entry table[] = {MTRL_EMU_ENTRY(paged_attention_bf16),
                                          MTRL_EMU_ENTRY(paged_attention_f16),
                                          MTRL_EMU_ENTRY(paged_attention_f32)};
  return mtrl_emu::pick(name, table);
}
