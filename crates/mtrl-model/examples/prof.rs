// TEMPORARY profiling harness (to be deleted).
use candle_core::{DType, Device, Tensor};
use mtrl_model::{token_logprobs, Config, Policy};
use std::time::Instant;

fn main() {
    let cfg = Config::from_file(std::path::Path::new("/work/shared/bench/bench-small.json")).unwrap();
    let dev = Device::Cpu;
    let vocab = cfg.vocab_size;
    let p = Policy::random(cfg, DType::F32, &dev).unwrap();
    let (b, t) = (8usize, 256usize);
    let ids: Vec<u32> = (0..b * t).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let ids = Tensor::from_vec(ids, (b, t), &dev).unwrap();
    let what = std::env::args().nth(1).unwrap_or_default();
    let reps: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    for _ in 0..reps {
        if what == "fwd" || what.is_empty() {
            let s = Instant::now();
            let _ = token_logprobs(&p, &ids, None, 1.0, true, 1 << 25).unwrap();
            eprintln!("fwd(train view) {:.3}s", s.elapsed().as_secs_f64());
        }
        if what == "fwdi" || what.is_empty() {
            let s = Instant::now();
            let _ = token_logprobs(&p, &ids, None, 1.0, false, 1 << 25).unwrap();
            eprintln!("fwd(infer view) {:.3}s", s.elapsed().as_secs_f64());
        }
        if what == "train" || what.is_empty() {
            let s = Instant::now();
            let fwd = token_logprobs(&p, &ids, None, 1.0, true, 1 << 25).unwrap();
            let f = s.elapsed().as_secs_f64();
            let g = fwd.logprobs.ones_like().unwrap();
            let _ = fwd.backward(&g).unwrap();
            eprintln!("train fwd {:.3}s total {:.3}s", f, s.elapsed().as_secs_f64());
        }
    }
}
