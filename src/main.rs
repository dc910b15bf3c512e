//! `tessera`: list, inspect, run and check the kernel library from the command line.
//!
//! Exit codes: 0 ok, 1 wrong result or runtime failure, 2 bad usage or bad input.

mod commands;
mod elementwise;
mod in_place;
mod plot;
mod tune;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Pallas-style block kernels in Rust"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Kernel parameters: `--shape m=256,n=128` (any parameter, repeatable).
#[derive(clap::Args, Clone, Debug, Default)]
struct ParamArgs {
    /// Kernel parameters as `name=value[,name=value...]` (see `tessera list --long`).
    #[arg(
        long = "shape",
        alias = "param",
        short = 's',
        value_name = "NAME=VALUE,..."
    )]
    shape: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the library's kernel names, one per line.
    List {
        /// Also print each kernel's summary and parameters with their defaults.
        #[arg(long)]
        long: bool,
    },
    /// Print a kernel's block IR, or check an IR file with `--parse FILE`.
    Ir {
        /// Library kernel name.
        kernel: Option<String>,
        #[command(flatten)]
        params: ParamArgs,
        /// Parse and verify an IR text file instead.
        #[arg(long, value_name = "FILE", conflicts_with = "kernel")]
        parse: Option<std::path::PathBuf>,
    },
    /// Run a kernel on random inputs and compare it with its plain reference.
    Run {
        /// Library kernel name.
        kernel: String,
        /// interp, xla, native or auto (default: $TESSERA_BACKEND, else auto).
        #[arg(long)]
        backend: Option<String>,
        #[command(flatten)]
        params: ParamArgs,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Interpreter only: fill scratch and outputs with NaN first, so reads of
        /// never-written data show up (same as TESSERA_INTERP_POISON=1).
        #[arg(long)]
        poison: bool,
    },
    /// Run every library kernel on every backend and print errors and timings.
    Demo,
    /// Print a kernel lowered for a target.
    Lower {
        /// Library kernel name.
        kernel: String,
        /// stablehlo (XLA fallback), mosaic (StableHLO + tpu_custom_call), mosaic-body or
        /// cpu-mlir (upstream MLIR for the native backend).
        #[arg(long)]
        target: String,
        /// VMEM budget in bytes for the TPU rule check (default 16 MiB, v5e's scoped limit).
        #[arg(long, value_name = "BYTES")]
        vmem_limit: Option<u64>,
        #[command(flatten)]
        params: ParamArgs,
        /// Write the module(s) to FILE instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
    },
    /// Print every TESSERA_* environment variable: its value, default and what it does.
    Config,
    /// Inspect or empty the on-disk compilation cache.
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Time a kernel: median, GFLOP/s, GB/s and shares of this machine's measured peaks;
    /// `tessera bench elementwise` times every element-wise math op against a copy and
    /// PyTorch.
    Bench {
        /// Library kernel name, or `elementwise` for the element-wise op sweep (takes
        /// `--shape rows=R,cols=C`, default 4096 x 4096, and `--runs`).
        kernel: String,
        /// interp, xla, native or auto (default: $TESSERA_BACKEND, else auto).
        #[arg(long)]
        backend: Option<String>,
        #[command(flatten)]
        params: ParamArgs,
        /// Also time a baseline in the same run: torch or xla.
        #[arg(long, value_name = "BASELINE")]
        vs: Option<String>,
        /// Timed runs after one warm-up run.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Print one JSON object instead of text.
        #[arg(long, conflicts_with = "sweep")]
        json: bool,
        /// Time one run per value of a parameter: `NAME=v1,v2,...` (a table of times,
        /// GFLOP/s, GB/s, the baseline and the roofline).
        #[arg(long, value_name = "NAME=V1,V2,...")]
        sweep: Option<String>,
        /// With --sweep: draw time against the swept value (Tessera, the baseline, the
        /// roofline) into this SVG file.
        #[arg(long, value_name = "FILE", requires = "sweep")]
        plot: Option<PathBuf>,
    },
    /// Search a kernel's block sizes for one problem and store the fastest correct ones,
    /// which `run`, `bench`, `lower`, the torch ops and graph mode then use.
    Tune {
        /// Library kernel name (optional with --list and --clear).
        #[arg(required_unless_present_any = ["list", "clear"])]
        kernel: Option<String>,
        /// native or xla (measured), or mosaic (TPU rules, then a cost model).
        #[arg(long, default_value = "native")]
        backend: String,
        #[command(flatten)]
        params: ParamArgs,
        /// Seconds the search may take (the current blocks are always measured).
        #[arg(long, default_value_t = 60.0, value_name = "SECS")]
        budget: f64,
        /// Timed runs per candidate, after one checked run.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Measure again even if a tuned configuration is stored.
        #[arg(long)]
        force: bool,
        /// Print every stored configuration.
        #[arg(long, conflicts_with_all = ["clear", "force"])]
        list: bool,
        /// Remove the stored configurations (of KERNEL only, if given).
        #[arg(long, conflicts_with = "force")]
        clear: bool,
    },
}

#[derive(Subcommand)]
enum CacheAction {
    /// Where the cache is, how many entries it holds and their size.
    Stats,
    /// Remove every entry.
    Clear,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::List { long } => commands::list(long),
        Command::Ir {
            kernel,
            params,
            parse,
        } => commands::ir(kernel.as_deref(), &params.shape, parse.as_deref()),
        Command::Run {
            kernel,
            backend,
            params,
            seed,
            poison,
        } => {
            if poison {
                // Before any thread starts: the runtime reads it when it interprets.
                std::env::set_var("TESSERA_INTERP_POISON", "1");
            }
            commands::run(&kernel, backend.as_deref(), &params.shape, seed)
        }
        Command::Demo => commands::demo(),
        Command::Config => {
            print!("{}", runtime::config::describe());
            Ok(())
        }
        Command::Lower {
            kernel,
            target,
            vmem_limit,
            params,
            out,
        } => commands::lower(&kernel, &target, vmem_limit, &params.shape, out.as_deref()),
        Command::Cache { action } => match action {
            CacheAction::Stats => commands::cache_stats(),
            CacheAction::Clear => commands::cache_clear(),
        },
        Command::Tune {
            kernel,
            backend,
            params,
            budget,
            runs,
            force,
            list,
            clear,
        } => match (list, clear, kernel.as_deref()) {
            (true, _, None) => tune::list(),
            (true, _, Some(_)) => Err(commands::usage("--list takes no kernel name")),
            (_, true, kernel) => tune::clear(kernel),
            (_, _, Some(kernel)) => tune::tune(
                kernel,
                &tune::TuneArgs {
                    target: &backend,
                    overrides: &params.shape,
                    budget,
                    runs,
                    force,
                },
            ),
            (_, _, None) => Err(commands::usage("`tessera tune` needs a kernel name")),
        },
        Command::Bench {
            kernel,
            backend,
            params,
            vs,
            runs,
            json,
            sweep,
            plot,
        } => {
            let (backend, shape, vs) = (backend.as_deref(), &params.shape, vs.as_deref());
            if kernel == "elementwise" {
                return finish(
                    if backend.is_some() || vs.is_some() || json || sweep.is_some() {
                        Err(commands::usage(
                            "`tessera bench elementwise` takes --shape rows=R,cols=C and --runs only",
                        ))
                    } else {
                        elementwise::bench(shape, runs)
                    },
                );
            }
            match sweep {
                Some(sweep) => commands::bench_sweep(
                    &kernel,
                    backend,
                    shape,
                    &sweep,
                    vs,
                    runs,
                    plot.as_deref(),
                ),
                None => commands::bench(&kernel, backend, shape, vs, runs, json),
            }
        }
    };
    finish(result)
}

/// The exit code of a command's result, with its error printed.
fn finish(result: Result<(), commands::Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
