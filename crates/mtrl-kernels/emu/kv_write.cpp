// src/kv_write.cu under the CUDA emulation (include/cuda_emu.h).
#include "cuda_emu.h"
#include "emu_register.h"
#include "../src/kv_write.cu"

extern "C" mtrl_emu::Invoke mtrl_emu_find_kv_write(const char* name) {
  static const mtrl_emu::Entry table[] = {
      MTRL_EMU_ENTRY(kv_write_u16), MTRL_EMU_ENTRY(kv_write_u32), MTRL_EMU_ENTRY(kv_write_u64)};
  return mtrl_emu::pick(name, table);
}
