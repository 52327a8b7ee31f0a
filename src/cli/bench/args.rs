//! The command line of `xinf bench`.

use clap::Args;
use clap::builder::RangedU64ValueParser;

use crate::cli::launch::EndpointArgs;

/// `xinf bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// The model's uid (see `xinf list`). Repeat it to compare several models in one run: they
    /// are measured one after another, with the same prompts.
    #[arg(short = 'u', long, required = true)]
    pub(super) model_uid: Vec<String>,
    /// Concurrency levels, comma-separated: the number of requests in flight at once. Each level
    /// sends --requests requests.
    #[arg(long, value_delimiter = ',', default_value = "1,16", value_parser = at_least_one())]
    pub(super) concurrency: Vec<usize>,
    /// Requests measured at each concurrency level, for each model.
    #[arg(long, default_value_t = 128, value_parser = at_least_one())]
    pub(super) requests: usize,
    /// Tokens every request generates: the end-of-sequence token is ignored, so each answer has
    /// exactly this length and the decode work is the same for every model.
    #[arg(long, default_value_t = 32, value_parser = at_least_one())]
    pub(super) output_tokens: usize,
    /// Prompt lengths in tokens, comma-separated; requests take them in turn. Each is capped to
    /// the model's context (less the output tokens) when the server reports it.
    #[arg(long, value_delimiter = ',', default_value = "40,173,733,2833", value_parser = at_least_one())]
    pub(super) prompt_tokens: Vec<usize>,
    /// Requests sent to each model before measuring, one at a time and not counted, so that
    /// first-use costs (allocations, compilation, cold caches) stay out of the numbers.
    #[arg(long, default_value_t = 4)]
    pub(super) warmup: usize,
    /// Also write the report as JSON to PATH; `-` writes it to stdout (the table then goes to
    /// stderr).
    #[arg(long, value_name = "PATH")]
    pub(super) json: Option<String>,
    /// Seed of the prompt text: the same seed gives the same prompts, run after run.
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    /// Tokens of text every prompt begins with, before its request number: a system prompt
    /// that all requests share, which a server with a prefix cache computes once. Counted in
    /// the prompt lengths; 0 (the default) shares nothing.
    #[arg(long, default_value_t = 0)]
    pub(super) shared_prefix_tokens: usize,
}

/// A parser of counts that must be at least one (zero requests or tokens measure nothing).
fn at_least_one() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(1..)
}
