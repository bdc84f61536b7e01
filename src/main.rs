//! `mtrl`: the command-line front end. Thin by design: each subcommand parses its arguments, loads
//! and validates the config, calls into the library crates and prints. Errors are printed with
//! their whole cause chain and exit code 1 (ripgrep style); nothing here holds domain logic.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "mtrl",
    version,
    about = "Multi-turn RL for LLM search agents",
    long_about = None,
    after_help = cmd::examples::MTRL
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the default job on the embedded demo config (what `mtrl` with no command does).
    #[command(after_help = cmd::examples::DEMO)]
    Demo(cmd::demo::DemoArgs),
    /// The default job's results over seeds and collections (mean ± sd, pooled bootstrap
    /// intervals) from `mtrl demo --run-dir` folders.
    #[command(after_help = cmd::examples::DEMO_TABLE)]
    DemoTable(cmd::demo::DemoTableArgs),
    /// Build (or reuse) the BM25 and vector indexes of the corpus named in the config.
    #[command(after_help = cmd::examples::INDEX)]
    Index(cmd::index::IndexArgs),
    /// Query one of the search tools and print ranked hits.
    #[command(after_help = cmd::examples::SEARCH)]
    Search(cmd::search::SearchArgs),
    /// Score both search tools on a query set with relevance judgments (nDCG@10, recall@100, MRR@10).
    #[command(after_help = cmd::examples::SEARCH_EVAL)]
    SearchEval(cmd::search_eval::SearchEvalArgs),
    /// Generate text with a policy checkpoint.
    #[command(after_help = cmd::examples::GENERATE)]
    Generate(cmd::generate::GenerateArgs),
    /// Print the per-token log-probs of a token sequence as JSON.
    #[command(after_help = cmd::examples::LOGPROBS)]
    Logprobs(cmd::logprobs::LogprobsArgs),
    /// Task data: turn collections into corpus + train/validation/test task files.
    #[command(subcommand, after_help = cmd::examples::DATA)]
    Data(cmd::data::DataCommand),
    /// Run episodes of a scripted baseline policy in the search environment.
    #[command(after_help = cmd::examples::ROLLOUT)]
    Rollout(cmd::rollout::RolloutArgs),
    /// Train the policy with RL (asynchronous rollouts, checkpoints, automatic resume); without
    /// --config, the default job (warm start, RL, evaluation on the embedded demo config).
    #[command(after_help = cmd::examples::TRAIN)]
    Train(cmd::train::TrainArgs),
    /// Supervised fine-tuning on a trajectory file (warm start / cold start).
    #[command(after_help = cmd::examples::SFT)]
    Sft(cmd::sft::SftArgs),
    /// Serve a policy checkpoint as an OpenAI-compatible endpoint with per-trajectory token capture.
    #[command(after_help = cmd::examples::SERVE)]
    Serve(cmd::serve::ServeArgs),
    /// Serve a config's search tools (bm25_search, vector_search, submit) over HTTP.
    #[command(after_help = cmd::examples::SERVE_TOOLS)]
    ServeTools(cmd::serve::ServeToolsArgs),
    /// Write a LoRA adapter, or with --merge the base with the adapter merged in (an HF checkpoint).
    #[command(after_help = cmd::examples::EXPORT)]
    Export(cmd::export::ExportArgs),
    /// Convert a Qwen2/Qwen3 GGUF file into a Hugging Face checkpoint folder.
    #[command(after_help = cmd::examples::CONVERT)]
    Convert(cmd::convert::ConvertArgs),
    /// Evaluate policies and scripted baselines on the test files (nDCG@10, failures, pass@k).
    #[command(after_help = cmd::examples::EVAL)]
    Eval(cmd::eval::EvalArgs),
    /// Show a run's logged trajectories turn by turn (filter by step, task, failures; compare steps).
    #[command(after_help = cmd::examples::INSPECT)]
    Inspect(cmd::inspect::InspectArgs),
    /// Draw a run's training curves (reward, nDCG@10, failures, turns, staleness) as PNG.
    #[command(after_help = cmd::examples::PLOT)]
    Plot(cmd::plot::PlotArgs),
    /// Benchmarks that print JSON.
    #[command(subcommand, after_help = cmd::examples::BENCH)]
    Bench(BenchCommand),
    /// Golden-fixture checks of the model on a device (f32 and bf16), as JSON lines.
    #[command(after_help = cmd::examples::SELFTEST)]
    Selftest(cmd::selftest::SelftestArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Index build speed, query throughput and latency, and HNSW recall against exact search.
    #[command(after_help = cmd::examples::BENCH_SEARCH)]
    Search(cmd::bench_search::BenchSearchArgs),
    /// Prefill, decode and training throughput of the policy model.
    #[command(after_help = cmd::examples::BENCH_MODEL)]
    Model(cmd::bench_model::BenchModelArgs),
    /// Multi-turn rollout episodes/s of the paged engine against the legacy one, side by side.
    #[command(after_help = cmd::examples::BENCH_ENGINE)]
    Engine(cmd::bench_engine::BenchEngineArgs),
    /// The same short training run with several staleness bounds η, side by side.
    #[command(after_help = cmd::examples::BENCH_TRAIN)]
    Train(cmd::bench_train::BenchTrainArgs),
    /// The learner's stall per checkpoint, written on its thread and in the background.
    #[command(after_help = cmd::examples::BENCH_CHECKPOINT)]
    Checkpoint(cmd::bench_train::BenchCheckpointArgs),
    /// The same episodes in-process and through the user's agent over HTTP, side by side.
    #[command(after_help = cmd::examples::BENCH_AGENT)]
    Agent(cmd::bench_train::BenchAgentArgs),
    /// Bytes and time of the data-parallel gradient all-reduce, full vs LoRA (under mpirun).
    #[command(after_help = cmd::examples::BENCH_ALLREDUCE)]
    Allreduce(cmd::bench_allreduce::BenchAllreduceArgs),
}

fn main() {
    let cli = Cli::parse();
    // `MTRL_PARSE_ONLY=1 mtrl …` checks a command line without running it: tests/docs.rs parses
    // every `mtrl` command of the README, the guide and these help texts this way.
    if std::env::var_os("MTRL_PARSE_ONLY").is_some() {
        println!("{:?}", cli.command);
        return;
    }
    let result = match cli.command {
        None => cmd::demo::run(&cmd::demo::DemoArgs::default()),
        Some(Command::Demo(a)) => cmd::demo::run(&a),
        Some(Command::DemoTable(a)) => cmd::demo::table(&a),
        Some(Command::Index(a)) => cmd::index::run(&a),
        Some(Command::Search(a)) => cmd::search::run(&a),
        Some(Command::SearchEval(a)) => cmd::search_eval::run(&a),
        Some(Command::Generate(a)) => cmd::generate::run(&a),
        Some(Command::Logprobs(a)) => cmd::logprobs::run(&a),
        Some(Command::Data(c)) => cmd::data::run(&c),
        Some(Command::Rollout(a)) => cmd::rollout::run(&a),
        Some(Command::Train(a)) => cmd::train::run(&a),
        Some(Command::Sft(a)) => cmd::sft::run(&a),
        Some(Command::Selftest(a)) => cmd::selftest::run(&a),
        Some(Command::Eval(a)) => cmd::eval::run(&a),
        Some(Command::Export(a)) => cmd::export::run(&a),
        Some(Command::Convert(a)) => cmd::convert::run(&a),
        Some(Command::Serve(a)) => cmd::serve::run(&a),
        Some(Command::ServeTools(a)) => cmd::serve::run_tools(&a),
        Some(Command::Inspect(a)) => cmd::inspect::run(&a),
        Some(Command::Plot(a)) => cmd::plot::run(&a),
        Some(Command::Bench(BenchCommand::Search(a))) => cmd::bench_search::run(&a),
        Some(Command::Bench(BenchCommand::Model(a))) => cmd::bench_model::run(&a),
        Some(Command::Bench(BenchCommand::Engine(a))) => cmd::bench_engine::run(&a),
        Some(Command::Bench(BenchCommand::Train(a))) => cmd::bench_train::run(&a),
        Some(Command::Bench(BenchCommand::Checkpoint(a))) => cmd::bench_train::run_checkpoint(&a),
        Some(Command::Bench(BenchCommand::Agent(a))) => cmd::bench_train::run_agent(&a),
        Some(Command::Bench(BenchCommand::Allreduce(a))) => cmd::bench_allreduce::run(&a),
    };
    if let Err(err) = result {
        eprintln!("error: {err}");
        for cause in err.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        std::process::exit(1);
    }
}
