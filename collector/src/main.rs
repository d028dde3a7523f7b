//! `junction`: the GPU node telemetry agent.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use junction::{Format, InventoryFormat, cli, config, model, sinks};

/// GPU node telemetry agent.
#[derive(Debug, Parser)]
#[command(name = "junction", version, about)]
struct Args {
    /// Configuration file (TOML). Without one, the defaults apply.
    #[arg(long, short = 'c', global = true, env = "JUNCTION_CONFIG")]
    config: Option<PathBuf>,
    /// Log filter (tracing syntax), e.g. "info" or "junction=debug". Overrides RUST_LOG.
    #[arg(long, global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (the default).
    Run,
    /// Collect once and print the result.
    Once {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// List the GPUs, what each supports, and what is disabled and why.
    Inventory {
        /// Output format.
        #[arg(long, value_enum, default_value_t = InventoryFormat::Table)]
        format: InventoryFormat,
    },
    /// What happened to each GPU across boots (XIDs, SXids, kernel-log signatures, health
    /// transitions), from the state directory's event history; works whether the agent runs
    /// or not.
    History {
        /// Only this GPU (its UUID, or `PCI-…` for one NVML did not list).
        #[arg(long)]
        gpu: Option<String>,
        /// Only what is younger than this (e.g. "3d", "12h", "30m").
        #[arg(long, default_value = "14d")]
        since: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = InventoryFormat::Table)]
        format: InventoryFormat,
    },
    /// Check the configuration and report every problem (exit code 2 if any).
    Validate,
    /// Ask a running agent's `/healthz` (the container HEALTHCHECK): exit 0 when every source
    /// is up, 1 otherwise, with the answer on stdout.
    Healthcheck {
        /// The URL to ask. Default: `/healthz` on the configured Prometheus listen address
        /// (an unspecified address such as 0.0.0.0 is asked on loopback).
        #[arg(long)]
        url: Option<String>,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 5)]
        timeout: u64,
    },
    /// Print generated documentation (used by `cargo xtask docs`).
    #[command(hide = true)]
    Docs {
        /// Which document.
        #[arg(value_enum)]
        which: Doc,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Doc {
    Metrics,
    Config,
    Example,
}

/// Logs go to stderr. The OpenTelemetry crates' own diagnostics are left out unless the
/// filter names them (they would repeat every failed export, and at debug level describe
/// exporter settings); the OTLP sink logs its failures itself, rate-limited, and reads the
/// receiver's gRPC message from those diagnostics through its own layer.
fn init_logging(filter: &str) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let mut directives = filter.to_string();
    if !filter.contains("opentelemetry") {
        directives.push_str(",opentelemetry=off,opentelemetry_sdk=off,opentelemetry-otlp=off,opentelemetry-http=off");
    }
    let env_filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_filter(env_filter);
    tracing_subscriber::registry()
        .with(fmt)
        .with(sinks::otlp::diagnostics_layer())
        .init();
}

/// jemalloc, for a daemon that runs for months: see `junction::allocator`.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`; `_RJEM_MALLOC_CONF` in the environment adds to
/// them.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: junction::allocator::ConfPtr =
    junction::allocator::ConfPtr(junction::allocator::JEMALLOC_CONF.as_ptr());

fn main() -> ExitCode {
    junction::allocator::tune();
    let args = Args::parse();
    // One-shot commands print their result on stdout; keep stderr to warnings by default.
    let quiet = matches!(
        args.command,
        Some(
            Command::Once { .. }
                | Command::Inventory { .. }
                | Command::History { .. }
                | Command::Validate
                | Command::Healthcheck { .. }
        )
    );
    let filter = args
        .log_level
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| if quiet { "warn" } else { "info" }.into());
    init_logging(&filter);
    // One TLS provider for every rustls user (the OTLP and BMC clients).
    junction::install_tls_provider();

    if let Some(Command::Docs { which }) = &args.command {
        print!(
            "{}",
            match which {
                Doc::Metrics => model::registry::metrics_markdown(),
                Doc::Config => config::docs::reference(),
                Doc::Example => config::docs::example_config(),
            }
        );
        return ExitCode::SUCCESS;
    }

    let config = match &args.config {
        Some(path) => match config::load_file(path) {
            Ok(c) => c,
            Err(errors) => {
                eprintln!("junction: invalid configuration:\n{errors}");
                return ExitCode::from(2);
            }
        },
        None => config::Config::default(),
    };

    let result = match args.command.unwrap_or(Command::Run) {
        Command::Validate => {
            println!("configuration is valid");
            Ok(())
        }
        Command::Run => cli::run(config),
        Command::Once { format } => cli::once(config, format),
        Command::Inventory { format } => cli::inventory(config, format),
        Command::History { gpu, since, format } => {
            cli::history(&config, gpu.as_deref(), &since, format)
        }
        Command::Healthcheck { url, timeout } => {
            return match cli::healthcheck(&config, url, std::time::Duration::from_secs(timeout)) {
                Ok(answer) => {
                    print!("{answer}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    println!("unhealthy: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Docs { .. } => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("junction: {e:#}");
            ExitCode::FAILURE
        }
    }
}
