//! The single-GPU configs (`configs/qwen3-0.6b-smoke.toml`, `configs/qwen3-4b.toml`) validate,
//! hold the sizes docs/gpu.md's memory arithmetic assumes, map onto the learner's step config, and
//! `mtrl train` on them fails with a clear error naming what is missing (the device on a CPU
//! build; the user-supplied model folder once the device exists). Also: `mtrl selftest` passes on
//! the CPU (the same command the GPU check runs on cuda:0).

mod common;

use common::{mtrl, repo};
use mtrl_core::config::ModelSource;
use mtrl_core::Config;
use mtrl_learner::{LrSchedule, StepConfig};

fn load(name: &str) -> Config {
    let path = repo().join("configs").join(name);
    Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A single-GPU config: bf16 on cuda:0, the model folder, the documented context and micro-batch,
/// MuSiQue data and corpus, and an algorithm the learner takes.
fn single_gpu(name: &str, model: &str, ctx: usize, mbt: usize) -> Config {
    let c = load(name);
    let m = c.model().unwrap();
    assert_eq!(
        (m.dtype.as_str(), m.device.as_str()),
        ("bf16", "cuda:0"),
        "{name}"
    );
    match &m.source {
        ModelSource::Dir(d) => assert!(d.ends_with(model), "{name}: {}", d.display()),
        other => panic!("{name}: expected a model folder, got {other:?}"),
    }
    let env = c.env_or_default();
    assert_eq!(env.max_context_tokens, ctx, "{name}");
    assert_eq!(c.train.micro_batch_tokens, mbt, "{name}");
    assert!(c
        .data()
        .unwrap()
        .train
        .iter()
        .all(|d| d.path.to_string_lossy().contains("musique")));
    assert!(c
        .search()
        .unwrap()
        .corpus
        .to_string_lossy()
        .contains("musique-hipporag100"));
    StepConfig::from_algorithm(
        &c.algorithm,
        c.rollout.temperature,
        c.train.grad_clip,
        c.train.micro_batch_tokens,
        LrSchedule::constant(c.train.lr),
        env.max_context_tokens,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    c
}

#[test]
fn gpu_configs_validate_with_the_documented_sizes() {
    // (file, model folder, max_context_tokens, micro_batch_tokens)
    for (name, model, ctx, mbt) in [
        ("qwen3-0.6b-smoke.toml", "Qwen3-0.6B", 2048, 2048),
        ("qwen3-4b.toml", "Qwen3-4B", 1024, 1024),
    ] {
        single_gpu(name, model, ctx, mbt);
    }
}

#[test]
fn training_without_the_device_or_the_weights_is_a_clear_error() {
    let cfg = repo().join("configs/qwen3-0.6b-smoke.toml");
    let (ok, _, err) = mtrl(&["train", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("device `cuda:0`"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // The same config on the CPU: the missing model folder is named.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("device = \"cuda:0\"", "device = \"cpu\"");
    let copy = dir.path().join("configs").join("smoke.toml");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::write(&copy, text).unwrap();
    let (ok, _, err) = mtrl(&["train", "--config", copy.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("models/Qwen3-0.6B"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn selftest_passes_on_cpu() {
    let fixtures = repo().join("tests/fixtures");
    let (ok, out, err) = mtrl(&[
        "selftest",
        "--device",
        "cpu",
        "--fixtures",
        fixtures.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["ok"], true, "{out}");
    assert!(last["passed"].as_u64().unwrap() >= 40, "{out}");
    let (ok, out, _) = mtrl(&["selftest", "--build-info"]);
    assert!(ok);
    let info: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(info["cuda"], cfg!(feature = "cuda"));
}

#[test]
fn the_train_smoke_configs_are_twins_on_two_devices() {
    // scripts/gpu-check.sh runs configs/gpu-train-smoke.toml on the GPU and its CPU twin under
    // --cpu-smoke: they must differ only in the model, the turn length, the step count and where
    // checkpoints go, or the CPU run would not check the GPU run's plumbing.
    let (gpu, cpu) = (load("gpu-train-smoke.toml"), load("cpu-train-smoke.toml"));
    let (gm, cm) = (gpu.model().unwrap(), cpu.model().unwrap());
    assert_eq!((gm.dtype.as_str(), gm.device.as_str()), ("bf16", "cuda:0"));
    assert_eq!((cm.dtype.as_str(), cm.device.as_str()), ("f32", "cpu"));
    match &gm.source {
        ModelSource::RandomConfig(p) => assert!(p.ends_with("bench/qwen3-0.6b.json"), "{p:?}"),
        other => panic!("expected random:<config.json>, got {other:?}"),
    }
    assert!(matches!(&cm.source, ModelSource::RandomPreset(p) if p == "tiny"));
    assert_eq!(gpu.rollout, cpu.rollout);
    assert_eq!(gpu.algorithm, cpu.algorithm);
    assert_eq!(gpu.train.max_steps, 5);
    assert_eq!(cpu.train.max_steps, 2);
    let (mut ge, ce) = (gpu.env_or_default(), cpu.env_or_default());
    assert!(ge.max_tokens_per_turn <= 32 && ge.max_turns <= 2);
    ge.max_tokens_per_turn = ce.max_tokens_per_turn;
    ge.max_context_tokens = ce.max_context_tokens;
    assert_eq!(ge, ce);
    assert_eq!(gpu.search().unwrap().corpus, cpu.search().unwrap().corpus);
    assert_eq!(gpu.data().unwrap().train, cpu.data().unwrap().train);
}

#[test]
fn lora_configs_validate_with_the_documented_sizes() {
    // docs/gpu.md "LoRA memory arithmetic" (scripts/lora-memory.py): (file, model folder,
    // max_context_tokens, micro_batch_tokens, kv_cache_tokens = rollout_max_concurrency × context)
    for (name, model, ctx, mbt, kv) in [
        ("qwen3-8b-lora.toml", "Qwen3-8B", 1792, 1792, 32 * 1792),
        ("qwen3-8b-lora-80gb.toml", "Qwen3-8B", 1024, 1024, 16 * 1024),
        ("qwen3-14b-lora.toml", "Qwen3-14B", 1280, 1280, 16 * 1280),
    ] {
        let c = single_gpu(name, model, ctx, mbt);
        assert_eq!(
            c.rollout.kv_cache_tokens,
            Some(c.rollout.rollout_max_concurrency * ctx),
            "{name}"
        );
        assert_eq!(c.rollout.kv_cache_tokens, Some(kv), "{name}");
        let lora = c
            .lora
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no [lora]"));
        assert_eq!((lora.rank, lora.alpha), (32, 64.0), "{name}");
        assert_eq!(lora.target_modules.len(), 7, "{name}");
        assert_eq!(lora.serving, "unmerged", "{name}");
        assert_eq!((lora.dropout, lora.rslora), (0.0, false), "{name}");
        assert_eq!(c.train.lr, 4e-5, "{name}");
    }
}

#[test]
fn the_bf16_cpu_smoke_trains_through_the_gpu_code_path() {
    // configs/cpu-train-smoke-bf16.toml: bf16 on the CPU selects candle's ops, what CUDA runs, for
    // the engine (one ragged pass per step, prompt chunks, the device sampler) and the learner
    // (the chunked head, its gradient formed on the device). Two RL steps, end to end.
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let split = common::prepared_cranfield(d);
    let text = std::fs::read_to_string(repo().join("configs/cpu-train-smoke-bf16.toml")).unwrap();
    let text = text
        .replace(
            "\"../runs/data/cranfield/train.jsonl\"",
            &format!("'{}'", split.join("train.jsonl").display()),
        )
        .replace("\"../runs/", &format!("\"{}/", d.display()))
        .replace("\"../", &format!("\"{}/", repo().display()));
    let cfg = d.join("smoke.toml");
    std::fs::write(&cfg, text).unwrap();
    let (ok, out, err) = mtrl(&["train", "--config", cfg.to_str().unwrap(), "--quiet"]);
    assert!(ok, "{out}\n{err}");
    let run = d.join("cpu-train-smoke-bf16");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(steps.len(), 2, "{metrics}");
    for s in &steps {
        assert!(s["loss"].as_f64().unwrap().is_finite(), "{s}");
        assert_eq!(s["sequences"], 8, "{s}");
        assert_eq!(s["updates"], 1, "{s}");
        assert!(s["tokens"].as_u64().unwrap() > 0, "{s}");
        // The learner's bf16 log-probs of the engine's bf16 samples: mean |ratio − 1|.
        let gap = s["sampler_gap"].as_f64().unwrap();
        assert!(gap < 0.05, "engine and learner disagree in bf16: {s}");
    }
    assert!(steps[0]["prompt_tokens_prefilled"].as_u64().unwrap() > 0);
}

#[test]
fn kv_cache_fraction_bounds_the_store_in_device_memory() {
    // `rollout.kv_cache_fraction`: the store may take that share of the device's memory (here
    // the host's), in positions of the model; the engine's store is bounded by it.
    let text = std::fs::read_to_string(repo().join("configs/cpu-train-smoke-bf16.toml")).unwrap();
    let with = |extra: &str| {
        let t = text.replace("[rollout]\n", &format!("[rollout]\n{extra}"));
        Config::from_toml_str(&t, &repo().join("configs/x.toml")).unwrap()
    };
    let small = with("kv_cache_fraction = 0.001\n");
    let large = with("kv_cache_fraction = 0.002\n");
    let parts = mtrl_train::setup::model_parts(&small).unwrap();
    let policy = mtrl_train::setup::initial_policy(&small, &parts).unwrap();
    // `[train] activation_checkpointing` reaches the policy (the bf16 smoke turns it on).
    assert!(policy.activation_checkpointing());
    let off = Config::from_toml_str(
        &text.replace(
            "activation_checkpointing = true",
            "activation_checkpointing = false",
        ),
        &repo().join("configs/x.toml"),
    )
    .unwrap();
    assert!(!mtrl_train::setup::initial_policy(&off, &parts)
        .unwrap()
        .activation_checkpointing());
    // `[train] attention_kernel` reaches the policy: "auto" (the default) is spelled on the CPU,
    // "fused" runs the CPU twin of FlashAttention-2; a bad value names its key.
    assert_eq!(policy.attention_kernel(), mtrl_model::AttentionKernel::Auto);
    assert!(!policy.attends_fused());
    let with_kernel = |k: &str| {
        Config::from_toml_str(
            &text.replace(
                "[train]\n",
                &format!("[train]\nattention_kernel = \"{k}\"\n"),
            ),
            &repo().join("configs/x.toml"),
        )
    };
    let fused = mtrl_train::setup::initial_policy(&with_kernel("fused").unwrap(), &parts).unwrap();
    assert!(fused.attends_fused());
    let spelled =
        mtrl_train::setup::initial_policy(&with_kernel("spelled").unwrap(), &parts).unwrap();
    assert_eq!(
        spelled.attention_kernel(),
        mtrl_model::AttentionKernel::Spelled
    );
    let e = with_kernel("flash").unwrap_err().to_string();
    assert!(e.contains("train.attention_kernel"), "{e}");
    let c = policy.config();
    let per = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2; // bf16
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let want = (kb as f64 * 1024.0 * 0.001 / per as f64) as usize;
    let opts = mtrl_train::setup::engine_options(&small, &policy).unwrap();
    assert_eq!(opts.kv_cache_tokens, Some(want));
    let twice = mtrl_train::setup::engine_options(&large, &policy).unwrap();
    let t2 = twice.kv_cache_tokens.unwrap();
    assert!(t2.abs_diff(2 * want) <= 1, "{t2} vs 2 × {want}");
    let engine = mtrl_model::Engine::with_options(policy, None, 0, opts).unwrap();
    let bound = engine.options().kv_cache_tokens.unwrap();
    assert_eq!(bound, want);
    assert!(
        engine.resident_tokens().1 >= want,
        "{:?}",
        engine.resident_tokens()
    );
    // `rollout.engine_attention` reaches the engine's options ("auto" by default); a bad value
    // names its key.
    assert_eq!(
        engine.options().attention,
        mtrl_model::EngineAttention::Auto
    );
    for name in mtrl_model::EngineAttention::NAMES {
        let cfg = with(&format!("engine_attention = \"{name}\"\n"));
        let opts = mtrl_train::setup::engine_options(&cfg, engine.policy()).unwrap();
        assert_eq!(opts.attention.name(), name);
    }
    let bad = text.replace("[rollout]\n", "[rollout]\nengine_attention = \"flash\"\n");
    let e = Config::from_toml_str(&bad, &repo().join("configs/x.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout.engine_attention"), "{e}");
}
