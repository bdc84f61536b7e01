// f16 for the CUDA emulation (cuda_emu.h): the compiler's IEEE binary16, the bits of half::f16.
#pragma once
typedef _Float16 __half;
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return (__half)f; }
