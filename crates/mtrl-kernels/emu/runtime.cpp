// The emulation's launch (include/cuda_emu.h): blocks in turn; a block's threads are fibers on
// the calling thread, run round-robin, each until it waits at a barrier or returns.
#include <ucontext.h>

#include <memory>
#include <vector>

#include "cuda_emu.h"
#include "emu_register.h"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
thread_local mtrl_emu::Ctx mtrl_emu::ctx;

extern "C" mtrl_emu::Invoke mtrl_emu_find_kv_write(const char*);
extern "C" mtrl_emu::Invoke mtrl_emu_find_paged_attention(const char*);
extern "C" mtrl_emu::Invoke mtrl_emu_find_logprob_head(const char*);
extern "C" mtrl_emu::Invoke mtrl_emu_find_rms_norm(const char*);
extern "C" mtrl_emu::Invoke mtrl_emu_find_swiglu(const char*);

namespace {

constexpr size_t STACK = 64 * 1024;

struct Fiber {
  ucontext_t uc;
  bool done = false;
  dim3 idx;
  mtrl_emu::Ctx ctx;
};

// One block's run.
struct Sched {
  ucontext_t main;
  Fiber* fibers;
  uint32_t cur = 0;
  uint64_t progress = 0;
  mtrl_emu::Invoke kernel;
  void** args;
};

thread_local Sched* sched = nullptr;

void leave(mtrl_emu::Bar& b) {
  b.live--;
  if (b.live > 0 && b.arrived == b.live) {
    b.arrived = 0;
    b.gen++;
  }
}

void trampoline() {
  Sched* s = sched;
  Fiber& f = s->fibers[s->cur];
  s->kernel(s->args);
  if (f.ctx.warp->arrived > 0) {
    fprintf(stderr, "cuda emulation: lane %u returned while its warp waits in a shuffle\n",
            f.ctx.lane);
    abort();
  }
  leave(*f.ctx.warp);
  leave(*f.ctx.block);
  f.done = true;
  // Returning resumes `main` (uc_link).
}

mtrl_emu::Invoke find(const char* name) {
  for (auto f : {mtrl_emu_find_kv_write, mtrl_emu_find_paged_attention,
                 mtrl_emu_find_logprob_head, mtrl_emu_find_rms_norm, mtrl_emu_find_swiglu}) {
    if (mtrl_emu::Invoke k = f(name)) return k;
  }
  return nullptr;
}

void run_block(Sched& s, char* stacks, dim3 grid, dim3 block, dim3 at) {
  const uint32_t n = block.x * block.y * block.z;
  const uint32_t nw = (n + 31) / 32;
  mtrl_emu::Bar bar;
  bar.live = n;
  std::vector<mtrl_emu::Bar> warps(nw);
  std::vector<uint64_t> bufs(32 * nw);
  std::unique_ptr<Fiber[]> fibers(new Fiber[n]);
  s.fibers = fibers.get();
  for (uint32_t t = 0; t < n; t++) {
    const uint32_t w = t / 32, size = (w + 1 < nw || n % 32 == 0) ? 32 : n % 32;
    warps[w].live = size;
    Fiber& f = fibers[t];
    f.idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    f.ctx = {&bar, &warps[w], &bufs[32 * w], t % 32, size};
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = &stacks[(size_t)t * STACK];
    f.uc.uc_stack.ss_size = STACK;
    f.uc.uc_link = &s.main;
    makecontext(&f.uc, trampoline, 0);
  }
  blockIdx = at;
  blockDim = block;
  gridDim = grid;
  uint32_t live = n;
  while (live > 0) {
    const uint64_t before = s.progress;
    for (uint32_t t = 0; t < n; t++) {
      Fiber& f = fibers[t];
      if (f.done) continue;
      s.cur = t;
      threadIdx = f.idx;
      mtrl_emu::ctx = f.ctx;
      swapcontext(&s.main, &f.uc);
      if (f.done) {
        live--;
        s.progress++;
      }
    }
    if (live > 0 && s.progress == before) {
      fprintf(stderr, "cuda emulation: block (%u, %u, %u): every live thread waits at a barrier "
              "that cannot complete (divergence)\n", at.x, at.y, at.z);
      abort();
    }
  }
}

}  // namespace

void mtrl_emu::wait(Bar& b, const char* what) {
  (void)what;
  Sched* s = sched;
  s->progress++;
  const uint64_t g = b.gen;
  if (++b.arrived == b.live) {
    b.arrived = 0;
    b.gen++;
    return;
  }
  Fiber& f = s->fibers[s->cur];
  while (b.gen == g) swapcontext(&f.uc, &s->main);
  // Back on this thread: its place again (the scheduler set it before resuming).
}

// Runs kernel `name` over `grid` × `block` with `args` as cuLaunchKernel takes them. Returns 0, or
// 1 when no kernel has that name.
extern "C" int mtrl_emu_launch(const char* name, uint32_t gx, uint32_t gy, uint32_t gz,
                               uint32_t bx, uint32_t by, uint32_t bz, void** args) {
  mtrl_emu::Invoke k = find(name);
  if (!k) return 1;
  const dim3 grid{gx, gy, gz}, block{bx, by, bz};
  // Untouched until a fiber runs on it (no zeroing of up to 64 MiB per launch).
  std::unique_ptr<char[]> stacks(new char[(size_t)bx * by * bz * STACK]);
  Sched s;
  s.kernel = k;
  s.args = args;
  Sched* outer = sched;
  sched = &s;
  for (uint32_t z = 0; z < gz; z++)
    for (uint32_t y = 0; y < gy; y++)
      for (uint32_t x = 0; x < gx; x++) run_block(s, stacks.get(), grid, block, {x, y, z});
  sched = outer;
  return 0;
}
