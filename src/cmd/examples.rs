//! The `Example:` paragraphs of `mtrl <command> --help`, one per subcommand. Every command here
//! parses: `tests/docs.rs` runs each with `MTRL_PARSE_ONLY=1`, as it does the README's and the
//! guide's.

/// After `mtrl --help`.
pub const MTRL: &str = r#"Without a command, mtrl runs the default job (`mtrl demo`): a small search agent learned from
scratch on the CPU and compared with its warm start and every scripted baseline.

Examples:
  mtrl                                          # the default job
  mtrl train --config configs/tiny-train.toml   # RL training (resumes automatically)
  mtrl eval --config configs/demo.toml --model best --baseline runs/demo/sft

Each command explains itself: mtrl <command> --help. Guide: docs/README.md. Set
MTRL_PARSE_ONLY=1 to check a command line without running it."#;

/// `mtrl demo --help`.
pub const DEMO: &str = r#"Examples:
  mtrl demo --seed 1 --run-dir runs/demo-s1
  mtrl demo --config configs/demo-vaswani.toml --split validation

See docs/default-job.md."#;

/// `mtrl demo-table --help`.
pub const DEMO_TABLE: &str = r#"Example:
  mtrl demo-table runs/table-test/cranfield-s0 runs/table-test/cranfield-s1

See docs/default-job.md."#;

/// `mtrl index --help`.
pub const INDEX: &str = r#"Example:
  mtrl index --config configs/vaswani-hash.toml

See docs/search-tools.md."#;

/// `mtrl search --help`.
pub const SEARCH: &str = r#"Example:
  mtrl search --config configs/vaswani-hash.toml --tool vector -k 5 "microwave dielectric measurement"

See docs/search-tools.md."#;

/// `mtrl search-eval --help`.
pub const SEARCH_EVAL: &str = r#"Example:
  mtrl search-eval --config configs/cranfield-hash.toml --json

See docs/search-tools.md."#;

/// `mtrl generate --help`.
pub const GENERATE: &str = r#"Examples:
  mtrl generate --model tests/fixtures/tiny-qwen3 --prompt-ids 1,2,3 --json
  mtrl generate --model DIR --chat --max-new-tokens 64 "What is 12 + 35?"

See docs/model.md."#;

/// `mtrl logprobs --help`.
pub const LOGPROBS: &str = r#"Example:
  mtrl logprobs --model tests/fixtures/tiny-qwen3 --ids 1,2,3,4

See docs/model.md."#;

/// `mtrl data --help`.
pub const DATA: &str = r#"Example:
  mtrl data prepare --config configs/cranfield-hash.toml --out runs/data

See docs/environment.md."#;

/// `mtrl data prepare --help`.
pub const DATA_PREPARE: &str = r#"Examples:
  mtrl data prepare
  mtrl data prepare --config configs/cranfield-hash.toml --out runs/data --format parquet

See docs/environment.md."#;

/// `mtrl rollout --help`.
pub const ROLLOUT: &str = r#"Example:
  mtrl rollout --policy hybrid-rrf --config configs/musique-hash.toml --trajectories t.jsonl

See docs/environment.md."#;

/// `mtrl train --help`.
pub const TRAIN: &str = r#"Examples:
  mtrl train --config configs/tiny-train.toml
  mtrl train --config configs/tiny-train.toml --fresh
  mpirun -np 2 mtrl train --config configs/tiny-train.toml   # a build with --features mpi

See docs/training.md, docs/distributed.md."#;

/// `mtrl sft --help`.
pub const SFT: &str = r#"Example:
  mtrl sft --config configs/demo.toml --trajectories runs/demo/teacher.jsonl --out runs/sft

See docs/training.md."#;

/// `mtrl serve --help`.
pub const SERVE: &str = r#"Example:
  mtrl serve --model runs/demo/sft --addr 127.0.0.1:8000

Routes and errors: docs/agents.md."#;

/// `mtrl serve-tools --help`.
pub const SERVE_TOOLS: &str = r#"Example:
  mtrl serve-tools --config configs/demo.toml --addr 127.0.0.1:8001

Routes and errors: docs/agents.md."#;

/// `mtrl export --help`.
pub const EXPORT: &str = r#"Example:
  mtrl export --model models/Qwen3-8B --adapter runs/qwen3-8b-lora/step-100/policy --out runs/merged --merge

See docs/lora.md."#;

/// `mtrl convert --help`.
pub const CONVERT: &str = r#"Example:
  mtrl convert --gguf models/qwen2.5-coder-0.5b-instruct/model.gguf --out models/qwen2.5-0.5b

See docs/model.md."#;

/// `mtrl eval --help`.
pub const EVAL: &str = r#"Examples:
  mtrl eval --config configs/demo.toml --model best --baseline runs/demo/sft --policy bm25-once
  mtrl eval --config configs/cranfield-hash.toml --policy bm25-once --policy hybrid-rrf

See docs/evaluation.md."#;

/// `mtrl inspect --help`.
pub const INSPECT: &str = r#"Examples:
  mtrl inspect runs/demo/rl
  mtrl inspect runs/demo/rl --failed --limit 5
  mtrl inspect runs/demo/rl --compare 10 80

See docs/observability.md."#;

/// `mtrl plot --help`.
pub const PLOT: &str = r#"Example:
  mtrl plot runs/demo/rl

See docs/observability.md."#;

/// `mtrl bench --help`.
pub const BENCH: &str = r#"Example:
  mtrl bench model --config bench/bench-small.json

Figures so far: docs/results/README.md."#;

/// `mtrl selftest --help`.
pub const SELFTEST: &str = r#"Examples:
  mtrl selftest
  mtrl selftest --device cuda:0

See docs/gpu.md."#;

/// `mtrl bench search --help`.
pub const BENCH_SEARCH: &str = r#"Example:
  mtrl bench search --config configs/vaswani.toml --peer peer.json

See docs/search-tools.md."#;

/// `mtrl bench model --help`.
pub const BENCH_MODEL: &str = r#"Example:
  mtrl bench model --config bench/bench-small.json --phases decode --batch-sizes 1,8,32

See docs/model.md."#;

/// `mtrl bench engine --help`.
pub const BENCH_ENGINE: &str = r#"Example:
  mtrl bench engine --config bench/bench-small.json

See docs/model.md."#;

/// `mtrl bench train --help`.
pub const BENCH_TRAIN: &str = r#"Examples:
  mtrl bench train --config configs/tiny-train.toml --steps 40 --staleness 0,2
  mtrl bench train --lora --config bench/bench-small.json

See docs/training.md, docs/lora.md."#;

/// `mtrl bench checkpoint --help`.
pub const BENCH_CHECKPOINT: &str = r#"Example:
  mtrl bench checkpoint --config configs/tiny-train.toml --every 1

See docs/training.md."#;

/// `mtrl bench agent --help`.
pub const BENCH_AGENT: &str = r#"Example:
  mtrl bench agent --config C --model runs/demo/sft --per-task 1 --concurrency 1

See docs/agents.md."#;

/// `mtrl bench allreduce --help`.
pub const BENCH_ALLREDUCE: &str = r#"Example:
  mpirun -np 2 mtrl bench allreduce --accumulation f64   # a build with --features mpi

See docs/distributed.md."#;
