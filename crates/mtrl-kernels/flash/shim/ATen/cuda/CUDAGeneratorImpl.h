// Stand-in for PyTorch's ATen/cuda/CUDAGeneratorImpl.h: FlashAttention-2's parameter struct holds
// an at::PhiloxCudaState for dropout. mtrl never uses dropout in attention (p = 0), so only the
// layout PyTorch gives it matters here.
#pragma once
#include <cstdint>
namespace at {
struct PhiloxCudaState {
  PhiloxCudaState() = default;
  PhiloxCudaState(uint64_t seed, uint64_t offset) {
    seed_.val = seed;
    offset_.val = offset;
  }
  union Payload {
    uint64_t val;
    int64_t* ptr;
  };
  Payload seed_{};
  Payload offset_{};
  uint32_t offset_intragraph_ = 0;
  bool captured_ = false;
};
}  // namespace at
