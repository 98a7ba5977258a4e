//! The command line. Every value is checked as it is parsed: a bad one is refused with exit
//! code 2 and a message that says what the flag accepts.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::data::Tokenizer;
use crate::error::BadInput;
use crate::kernels::optim::AdamW;
pub use crate::model::Keep;
use crate::model::{gpt::Shape, Config, GptConfig, MlpConfig};

/// Train a GPT (or an MLP) on the CPU with activation checkpointing, every tensor in
/// ferropool.
///
/// Without a subcommand it trains (as `train`).
#[derive(Parser, Debug, Clone)]
#[command(
    version,
    about,
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The training, when no subcommand is given.
    #[command(flatten)]
    pub train: Args,
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Train on the pool (the default).
    Train(Args),
    /// Run the same training on the pool, on `Vec<f32>` with glibc and on `Vec<f32>` with
    /// mimalloc (each in a child process that gets this command's training flags), and with
    /// `--torch` in PyTorch too; print them side by side.
    Compare(CompareArgs),
    /// The trade-off between memory and speed: the training with each fixed
    /// `--checkpoint-every` and fitted to each of a list of budgets (each in a child process,
    /// alternated run by run), and with `--torch` in PyTorch at each fixed k; one table of
    /// medians, and with `--plot` the frontier.
    Sweep(SweepArgs),
}

/// `sweep`'s flags: the training's (without `--budget` and `--checkpoint-every`, which it
/// chooses; `--plot` draws the frontier, steps/s against peak memory), and its own.
#[derive(clap::Args, Debug, Clone)]
pub struct SweepArgs {
    /// The training every run does.
    #[command(flatten)]
    pub train: Args,
    /// Budgets of the fitted runs, comma-separated (default: 50, 60, 70, 75, 80 and 90% of
    /// the peak live bytes of the run that keeps everything, measured first).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub budgets: Vec<u64>,
    /// The fixed `--checkpoint-every` values, comma-separated (the run that keeps everything,
    /// 0 for the GPT and 1 for the MLP, is always run: the reference).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 3, 6], value_parser = whole)]
    pub every: Vec<usize>,
    /// Runs of each configuration (the table shows medians).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub runs: usize,
    /// A Python interpreter with PyTorch: also runs the same recipe in PyTorch
    /// (`scripts/torch_gpt.py` or `scripts/torch_mlp.py`, with `torch.utils.checkpoint`) at
    /// each fixed k, and for the GPT compiled with `torch.compile` too.
    #[arg(long, value_name = "PYTHON")]
    pub torch: Option<PathBuf>,
}

/// `compare`'s flags: the training's, and its own.
#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// The training every run does.
    #[command(flatten)]
    pub train: Args,
    /// Rounds: each runs every variant once, in turn; the table shows medians (min-max).
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub rounds: usize,
    /// A Python interpreter with PyTorch: also runs the same recipe in PyTorch each round
    /// (`scripts/torch_gpt.py`, eager and compiled, from the job's initial weights, printing
    /// how far its first losses are from the job's; or `scripts/torch_mlp.py`).
    #[arg(long, value_name = "PYTHON")]
    pub torch: Option<PathBuf>,
    /// With --torch: the largest relative difference allowed between the job's first losses
    /// and each PyTorch run's (eager and compiled); past it, or with a NaN anywhere, compare
    /// exits with code 1 after its table.
    #[arg(long, default_value_t = 1e-4, value_parser = positive_finite)]
    pub agree: f64,
}

/// Which model the job trains.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A decoder-only transformer in GPT-2's layout, on the bytes of a text.
    Gpt,
    /// A multi-layer perceptron on random inputs labelled by a random linear teacher.
    Mlp,
}

/// The training's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The model: a GPT on the bytes of a text, or the MLP.
    #[arg(long, value_enum, default_value_t = ModelKind::Gpt)]
    pub model: ModelKind,
    /// Training steps (at least 1; default 300 for the GPT, 60 for the MLP).
    #[arg(long, default_value_t = 300, default_value_if("model", "mlp", "60"), value_parser = at_least_one)]
    pub steps: usize,
    /// Sequences (GPT) or examples (MLP) per batch (at least 1; default 16 or 512).
    #[arg(long, default_value_t = 16, default_value_if("model", "mlp", "512"), value_parser = at_least_one)]
    pub batch: usize,
    /// Transformer blocks (GPT) or hidden layers (MLP) (at least 1; default 4 or 6).
    #[arg(long, default_value_t = 4, default_value_if("model", "mlp", "6"), value_parser = at_least_one)]
    pub layers: usize,
    /// GPT: tokens per sequence, the context (1 to 4096).
    #[arg(long, default_value_t = 64, value_parser = context)]
    pub context: usize,
    /// GPT: the width of the residual stream (at least 1, a multiple of --heads, at most
    /// 16384).
    #[arg(long, default_value_t = 128, value_parser = width)]
    pub width: usize,
    /// GPT: attention heads (at least 1; --width must be a multiple of it).
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub heads: usize,
    /// GPT: tokens in the vocabulary (1 to 65536; default: the tokenizer's, 256 for bytes
    /// and 50257 for gpt2; at least that).
    #[arg(long, value_parser = vocab)]
    pub vocab: Option<usize>,
    /// GPT: how the text becomes tokens: its bytes, or GPT-2's byte-pair encoding
    /// (`r50k_base`, 50,257 tokens, shipped with the job).
    #[arg(long, value_enum, default_value_t = Tokenizer::Bytes)]
    pub tokenizer: Tokenizer,
    /// GPT: a model of a known size; a flag given beside it overrides it.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// GPT: the text to train on (default: the first MiB of Shakespeare's plays, shipped
    /// with the job), cut into tokens by --tokenizer. Its last tenth of tokens is the
    /// validation part.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// GPT: write the initial weights to FILE (safetensors, nanoGPT's names and layouts).
    #[arg(long, value_name = "FILE")]
    pub save_init: Option<PathBuf>,
    /// GPT: start from the weights in FILE (safetensors, nanoGPT's names and layouts).
    #[arg(long, value_name = "FILE")]
    pub load: Option<PathBuf>,
    /// GPT: print the validation loss every N steps (and after the last; 0: never).
    #[arg(long, default_value_t = 50, value_parser = whole)]
    pub eval_every: usize,
    /// GPT: tokens of text to sample from the model at the end (bytes with --tokenizer
    /// bytes; 0: none).
    #[arg(long, default_value_t = 200, value_parser = whole)]
    pub sample: usize,
    /// GPT: rows of logits the head computes at once; each chunk's logits become its share
    /// of the gradients before the next chunk's are computed, so the head holds one chunk
    /// (default: as many rows as 64 MiB of logits hold, a multiple of 64; 0: every row, the
    /// logits whole).
    #[arg(long, value_name = "ROWS", value_parser = whole)]
    pub head_rows: Option<usize>,
    /// GPT: keep each attention's softmax weights for the backward pass instead of
    /// computing them again (the same bits either way; more memory).
    #[arg(long, hide = true)]
    pub keep_scores: bool,
    /// MLP: width of the hidden layers (at least 1).
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub hidden: usize,
    /// Keep the input of every N-th block (GPT) or layer (MLP) and recompute the rest in the
    /// backward pass; 0 keeps every tensor the backward pass reads (default: 1 for the GPT, 2
    /// for the MLP). With --budget and without this flag the job chooses instead: it keeps
    /// what fits under the budget, and the pool evicts the rest and recomputes it when the
    /// backward pass reads it.
    #[arg(long, value_parser = whole)]
    pub checkpoint_every: Option<usize>,
    /// Threads for the forward pass and the replay (at least 1, at most the 65,535 a thread
    /// pool may have; default: all cores).
    #[arg(long, value_parser = thread_count)]
    pub threads: Option<usize>,
    /// Byte budget of the training's pool, e.g. 256MiB, 1.5GiB, 10MB or 1000000 (default:
    /// none).
    ///
    /// It caps what the training's own pool reserves from the system: the model's
    /// parameters and optimiser state, and the step's tensors (activations, checkpoints,
    /// gradients) come from it and must fit in it. Without --checkpoint-every the job fits
    /// them by eviction and recomputation, and a budget below the least the run needs stops
    /// it with an error (exit code 1) that names that least, the whole MiB at which the run
    /// completes and below which it does not; with --checkpoint-every, a run whose tensors do
    /// not fit stops with an error that says what it needed.
    /// What stays outside the training's pool counts against the budget too: the products'
    /// packed panel (one, shared by the threads), each thread's product tile, the attention's
    /// scratch of each task that runs at once, and the process's small allocations. A share bounded from the
    /// shapes and the threads is set aside for them, the training's pool gets the rest, and
    /// the least named includes the share (so it grows with the threads). The binary and the
    /// stacks stay outside.
    /// Units, in any case: B; k, M, G, T, P, E or kB, MB, ... (powers of 1000); Ki, Mi, Gi,
    /// Ti, Pi, Ei or KiB, MiB, ... (powers of 1024). A fraction such as 1.5GiB is rounded to
    /// the nearest byte; `1e9` is 10^9 bytes.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub budget: Option<u64>,
    /// Learning rate (a finite number above 0; default 1e-3 for the GPT's AdamW, 2e-3 for
    /// the MLP's Adam).
    #[arg(long, default_value_t = 1e-3, default_value_if("model", "mlp", "2e-3"), value_parser = positive_finite)]
    pub lr: f64,
    /// GPT: AdamW's weight decay on the matrices and embeddings (a finite number, at least
    /// 0).
    #[arg(long, default_value_t = 0.1, value_parser = decay)]
    pub weight_decay: f64,
    /// GPT: AdamW's first moment's decay, `beta1` (0 to below 1; nanoGPT's 0.9).
    #[arg(long, default_value_t = 0.9, value_parser = beta)]
    pub beta1: f64,
    /// GPT: AdamW's second moment's decay, `beta2` (0 to below 1; nanoGPT's 0.95).
    #[arg(long, default_value_t = 0.95, value_parser = beta)]
    pub beta2: f64,
    /// GPT: AdamW's `eps`, added to the root of the second moment (a finite number above 0;
    /// PyTorch's 1e-8).
    #[arg(long, default_value_t = 1e-8, value_parser = positive_finite)]
    pub eps: f64,
    /// Seed of the data and the initial weights.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Write the pool's event trace in the Chrome Trace Event format (opens in Perfetto).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Draw the pool's memory timeline as SVG (the path must end in .svg).
    #[arg(long, value_parser = svg_path)]
    pub plot: Option<PathBuf>,
    /// Print the run's figures as one JSON line only (what `compare` reads from its
    /// children).
    #[arg(long)]
    pub json: bool,
}

/// A GPT of a known size (GPT-2's tokenizer), for `--preset`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// GPT-2 small: 12 blocks of width 768, 12 heads, context 1024, GPT-2's tokenizer
    /// (124.4M parameters).
    #[value(name = "gpt2-small")]
    Gpt2Small,
    /// A smaller GPT-2: 6 blocks of width 384, 6 heads, context 256, GPT-2's tokenizer
    /// (30.0M parameters).
    #[value(name = "gpt2-mini")]
    Gpt2Mini,
}

impl Preset {
    /// `(layers, width, heads, context)`; the tokenizer is GPT-2's.
    pub fn shape(self) -> (usize, usize, usize, usize) {
        match self {
            Self::Gpt2Small => (12, 768, 12, 1024),
            Self::Gpt2Mini => (6, 384, 6, 256),
        }
    }

    /// The parameters of the model, GPT-2's vocabulary: the token and position tables, 12
    /// matrices' worth and 13 vectors' of width per block, and the final layer norm.
    pub fn parameters(self) -> usize {
        let (layers, c, _, context) = self.shape();
        (Tokenizer::Gpt2.vocab() + context) * c + layers * (12 * c * c + 13 * c) + 2 * c
    }
}

impl Cli {
    /// The command line `matches` holds, with `--preset` applied: each of its values where
    /// the command line gives none.
    ///
    /// # Errors
    ///
    /// clap's, for matches that do not hold a `Cli` (none from `Cli::command()`).
    pub fn from_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        use clap::FromArgMatches;
        let mut cli = Self::from_arg_matches(matches)?;
        let (args, training) = match (&mut cli.command, matches.subcommand()) {
            (Some(Command::Train(args)), Some((_, sub))) => (args, sub),
            (Some(Command::Compare(compare)), Some((_, sub))) => (&mut compare.train, sub),
            (Some(Command::Sweep(sweep)), Some((_, sub))) => (&mut sweep.train, sub),
            _ => (&mut cli.train, matches),
        };
        args.apply_preset(|id| given(training, id));
        Ok(cli)
    }
}

/// Whether the flag `id` was given on the command line `matches` holds.
fn given(matches: &clap::ArgMatches, id: &str) -> bool {
    matches!(
        matches
            .try_contains_id(id)
            .ok()
            .and_then(|_| matches.value_source(id)),
        Some(clap::parser::ValueSource::CommandLine)
    )
}

impl Args {
    /// Sets what `--preset` names wherever `given(id)` says the command line gave nothing.
    pub fn apply_preset(&mut self, given: impl Fn(&str) -> bool) {
        let Some(preset) = self.preset else { return };
        let (layers, width, heads, context) = preset.shape();
        for (id, field, value) in [
            ("layers", &mut self.layers, layers),
            ("width", &mut self.width, width),
            ("heads", &mut self.heads, heads),
            ("context", &mut self.context, context),
        ] {
            if !given(id) {
                *field = value;
            }
        }
        if !given("tokenizer") {
            self.tokenizer = Tokenizer::Gpt2;
        }
    }

    /// The vocabulary: `--vocab`, or the tokenizer's.
    pub fn vocab(&self) -> usize {
        self.vocab.unwrap_or(self.tokenizer.vocab())
    }

    /// What the forward pass keeps: the job fits it to the budget when there is one and no
    /// `--checkpoint-every`.
    pub fn keep(&self) -> Keep {
        match (self.checkpoint_every, self.budget) {
            (Some(every), _) => Keep::Every(every),
            (None, Some(_)) => Keep::Fitted,
            (None, None) => Keep::Every(self.default_checkpoint_every()),
        }
    }

    /// `--checkpoint-every`'s default: 1 for the GPT (each block's input), 2 for the MLP.
    pub fn default_checkpoint_every(&self) -> usize {
        match self.model {
            ModelKind::Gpt => 1,
            ModelKind::Mlp => 2,
        }
    }

    /// The threads to use.
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1)
    }

    /// The flags of the training itself, spelled out for a child process: the model and its
    /// data, the steps, the threads and the optimiser (not the budget, the checkpoints, the
    /// outputs or the weights files).
    pub fn training_flags(&self) -> Vec<String> {
        let mut flags = vec![
            ("--model", format!("{:?}", self.model).to_lowercase()),
            ("--steps", self.steps.to_string()),
            ("--batch", self.batch.to_string()),
            ("--layers", self.layers.to_string()),
            ("--threads", self.threads().to_string()),
            ("--lr", self.lr.to_string()),
            ("--seed", self.seed.to_string()),
        ];
        match self.model {
            ModelKind::Mlp => flags.push(("--hidden", self.hidden.to_string())),
            ModelKind::Gpt => flags.extend([
                ("--context", self.context.to_string()),
                ("--width", self.width.to_string()),
                ("--heads", self.heads.to_string()),
                ("--vocab", self.vocab().to_string()),
                ("--tokenizer", self.tokenizer.name().to_owned()),
                ("--weight-decay", self.weight_decay.to_string()),
                ("--beta1", self.beta1.to_string()),
                ("--beta2", self.beta2.to_string()),
                ("--eps", self.eps.to_string()),
            ]),
        }
        if let Some(data) = &self.data {
            flags.push(("--data", data.display().to_string()));
        }
        let mut out: Vec<String> = flags
            .into_iter()
            .flat_map(|(flag, value)| [flag.to_owned(), value])
            .collect();
        if self.keep_scores {
            out.push("--keep-scores".into());
        }
        if let (Some(rows), ModelKind::Gpt) = (self.head_rows, self.model) {
            out.extend(["--head-rows".into(), rows.to_string()]);
        }
        out
    }

    /// The model these flags describe, for [`model::build`](crate::model::build): an error
    /// naming the flags if they ask what no model can be ([`check`](Self::check)), or a
    /// GPT whose step would be more than this machine can address.
    pub fn config(&self) -> Result<Config, BadInput> {
        self.check()?;
        Ok(match self.model {
            ModelKind::Mlp => Config::Mlp(MlpConfig {
                layers: self.layers,
                hidden: self.hidden,
                batch: self.batch,
                lr: self.lr as f32,
                seed: self.seed,
                keep: self.keep(),
            }),
            ModelKind::Gpt => Config::Gpt(self.gpt_config()?),
        })
    }

    /// The GPT these flags describe (see [`config`](Self::config)).
    pub fn gpt_config(&self) -> Result<GptConfig, BadInput> {
        self.check()?;
        let shape = Shape {
            vocab: self.vocab(),
            context: self.context,
            width: self.width,
            heads: self.heads,
            layers: self.layers,
            batch: self.batch,
        };
        if shape.bytes().is_none_or(|bytes| bytes > isize::MAX as u64) {
            return Err(BadInput(format!(
                "--batch {} x --context {} with --width {}, --vocab {} and --layers {} is more \
                 than this machine can address: lower one of them",
                shape.batch, shape.context, shape.width, shape.vocab, shape.layers
            )));
        }
        Ok(GptConfig {
            shape,
            tokenizer: self.tokenizer,
            data: self.data.clone(),
            keep: self.keep(),
            keep_scores: self.keep_scores,
            head_rows: self.head_rows,
            opt: AdamW {
                lr: self.lr,
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                weight_decay: self.weight_decay,
            },
            seed: self.seed,
            load: self.load.clone(),
            save_init: self.save_init.clone(),
        })
    }

    /// [`check`](Self::check), and for the GPT that the text can be read and split (what
    /// `compare` and `sweep` ask before they start their children).
    pub fn check_all(&self) -> anyhow::Result<()> {
        self.check()?;
        if self.model == ModelKind::Gpt {
            let text = self.data.as_deref();
            crate::data::Text::load(text, self.context, self.vocab(), self.tokenizer)?;
        }
        Ok(())
    }

    /// What the flags ask that no single flag's parser can refuse: an error naming the flags
    /// and what they take.
    pub fn check(&self) -> Result<(), BadInput> {
        // Bytes need only the text's largest byte (`Text::split` checks it); GPT-2's
        // tokenizer may make any of its tokens.
        let needed = self.tokenizer.vocab();
        if self.model == ModelKind::Gpt
            && self.tokenizer != Tokenizer::Bytes
            && self.vocab() < needed
        {
            return Err(BadInput(format!(
                "--vocab {} is below the {needed} tokens of --tokenizer {}: give --vocab {needed} \
                 or more (or leave it out)",
                self.vocab(),
                self.tokenizer.name()
            )));
        }
        if self.model == ModelKind::Gpt && !self.width.is_multiple_of(self.heads) {
            return Err(BadInput(format!(
                "--width {} is not a multiple of --heads {}: each head takes an equal share \
                 of the width (e.g. --width {})",
                self.width,
                self.heads,
                self.width.next_multiple_of(self.heads)
            )));
        }
        Ok(())
    }
}

/// The flags only one model reads: each one's id, its name, and the model.
const MODEL_FLAGS: [(&str, &str, ModelKind); 18] = [
    ("context", "--context", ModelKind::Gpt),
    ("width", "--width", ModelKind::Gpt),
    ("heads", "--heads", ModelKind::Gpt),
    ("vocab", "--vocab", ModelKind::Gpt),
    ("tokenizer", "--tokenizer", ModelKind::Gpt),
    ("preset", "--preset", ModelKind::Gpt),
    ("data", "--data", ModelKind::Gpt),
    ("save_init", "--save-init", ModelKind::Gpt),
    ("load", "--load", ModelKind::Gpt),
    ("eval_every", "--eval-every", ModelKind::Gpt),
    ("sample", "--sample", ModelKind::Gpt),
    ("keep_scores", "--keep-scores", ModelKind::Gpt),
    ("head_rows", "--head-rows", ModelKind::Gpt),
    ("weight_decay", "--weight-decay", ModelKind::Gpt),
    ("beta1", "--beta1", ModelKind::Gpt),
    ("beta2", "--beta2", ModelKind::Gpt),
    ("eps", "--eps", ModelKind::Gpt),
    ("hidden", "--hidden", ModelKind::Mlp),
];

/// Refuses a flag given on the command line that the chosen model does not read (it would be
/// silently ignored): `matches` are the training's (a subcommand's, if one was given).
pub fn refuse_foreign_flags(matches: &clap::ArgMatches) -> Result<(), BadInput> {
    let Ok(Some(model)) = matches.try_get_one::<ModelKind>("model") else {
        return Ok(());
    };
    match MODEL_FLAGS
        .iter()
        .find(|(id, _, owner)| owner != model && given(matches, id))
    {
        Some((_, flag, owner)) => Err(BadInput(format!(
            "{flag} is a flag of --model {}: --model {} does not read it",
            format!("{owner:?}").to_lowercase(),
            format!("{model:?}").to_lowercase(),
        ))),
        None => Ok(()),
    }
}

/// A whole number, 0 included.
fn whole(text: &str) -> Result<usize, String> {
    text.trim()
        .parse::<usize>()
        .map_err(|_| "expected a whole number (0 or more)".into())
}

/// A context: 1 to 4096 tokens.
fn context(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if (1..=4096).contains(&count) => Ok(count),
        _ => Err("expected a context of 1 to 4096 tokens".into()),
    }
}

/// A vocabulary: 1 to 65536 tokens.
fn vocab(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if (1..=65_536).contains(&count) => Ok(count),
        _ => Err("expected a vocabulary of 1 to 65536 tokens (256: every byte)".into()),
    }
}

/// A width: 1 to 16384.
fn width(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if (1..=16_384).contains(&count) => Ok(count),
        _ => Err("expected a width of 1 to 16384, a multiple of --heads".into()),
    }
}

/// A moment's decay: at least 0 and below 1.
fn beta(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if (0.0..1.0).contains(&value) => Ok(value),
        _ => Err("expected a number of at least 0 and below 1, e.g. 0.9".into()),
    }
}

/// A finite number of at least 0.
fn decay(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err("expected a finite number of at least 0, e.g. 0.1".into()),
    }
}

/// A whole number of at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if count >= 1 => Ok(count),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

/// A thread count: at least 1, and no more than a rayon thread pool may have (it caps a
/// larger request silently, and the job sizes its per-thread state by the request).
fn thread_count(text: &str) -> Result<usize, String> {
    let most = rayon::max_num_threads();
    match at_least_one(text)? {
        count if count <= most => Ok(count),
        _ => Err(format!("expected at most {most} threads")),
    }
}

/// A finite number above 0.
fn positive_finite(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err("expected a finite number above 0, e.g. 2e-3".into()),
    }
}

/// A path ending in `.svg`: the timeline is written as SVG only.
fn svg_path(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    match path.extension().and_then(|e| e.to_str()) {
        Some(extension) if extension.eq_ignore_ascii_case("svg") => Ok(path),
        _ => Err("the timeline is written as SVG only: give a path ending in .svg".into()),
    }
}

/// What [`parse_bytes`] accepts, for its errors.
const BYTE_UNITS: &str = "expected a number of bytes above 0 with an optional unit, in any \
     case: B; k, M, G, T, P, E or kB, MB, GB, TB, PB, EB (powers of 1000); Ki, Mi, Gi, Ti, Pi, \
     Ei or KiB, MiB, GiB, TiB, PiB, EiB (powers of 1024); e.g. 256MiB, 1.5GiB, 10MB, 1000000 \
     or 1e9";

/// A byte count above 0, as the `parse-size` crate reads it: a decimal number (with an
/// optional exponent, `1e9`) and an optional unit, decimal prefixes powers of 1000 and binary
/// ones powers of 1024, a fraction rounded to the nearest byte, a count past 2^64 refused
/// rather than clamped. Space is allowed between the number and the unit only (parse-size
/// would read `1 2 MiB` as 12 MiB).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let number_ends = text.find(char::is_whitespace).unwrap_or(text.len());
    if text[number_ends..].contains(|c: char| c.is_ascii_digit()) {
        return Err(format!("a space inside the number; {BYTE_UNITS}"));
    }
    match parse_size::parse_size(text) {
        Ok(0) => Err(format!("0 bytes; {BYTE_UNITS}")),
        Ok(bytes) => Ok(bytes),
        Err(parse_size::Error::Empty) => Err(format!("no number; {BYTE_UNITS}")),
        Err(parse_size::Error::PosOverflow) => Err(format!("more than 2^64 bytes; {BYTE_UNITS}")),
        Err(_) => Err(format!("not a byte count; {BYTE_UNITS}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, Cli, Preset};
    use clap::CommandFactory;

    /// The help lists each preset with its parameter count, the one the model has.
    #[test]
    fn presets_list_their_parameters_and_flags_override_them() {
        let help = Cli::command().render_long_help().to_string();
        for (preset, name) in [
            (Preset::Gpt2Small, "gpt2-small"),
            (Preset::Gpt2Mini, "gpt2-mini"),
        ] {
            let count = format!("({:.1}M parameters)", preset.parameters() as f64 / 1e6);
            let line = help.lines().find(|l| l.contains(&format!("- {name}:")));
            assert!(
                line.is_some_and(|l| l.contains(&count)),
                "{name} {count}: {help}"
            );
        }
        assert_eq!(Preset::Gpt2Small.parameters(), 124_439_808);
        let parse = |line: &str| {
            let matches = Cli::command().get_matches_from(line.split_whitespace());
            Cli::from_matches(&matches).unwrap()
        };
        let mini = parse("train-replay --preset gpt2-mini --layers 2").train;
        assert_eq!(
            (mini.layers, mini.width, mini.heads, mini.context),
            (2, 384, 6, 256)
        );
        assert_eq!((mini.tokenizer.name(), mini.vocab()), ("gpt2", 50_257));
        let Some(super::Command::Compare(compare)) =
            parse("train-replay compare --preset gpt2-small --tokenizer bytes").command
        else {
            panic!("compare");
        };
        let small = compare.train;
        assert_eq!((small.layers, small.width, small.context), (12, 768, 1024));
        assert_eq!((small.tokenizer.name(), small.vocab()), ("bytes", 256));
    }

    #[test]
    fn byte_counts_with_binary_and_si_units() {
        for (text, bytes) in [
            ("1000000", 1_000_000),
            ("4096B", 4096),
            ("10MiB", 10 << 20),
            ("10 MiB", 10 << 20),
            ("256m", 256_000_000),
            ("256Mi", 256 << 20),
            ("1.5GiB", 3 << 29),
            ("1.5 gib", 3 << 29),
            ("10MB", 10_000_000),
            ("10mb", 10_000_000),
            ("2kB", 2_000),
            ("2KB", 2_000),
            ("2KiB", 2_048),
            ("0.5K", 500),
            ("0.5KiB", 512),
            ("1e6", 1_000_000),
            ("  64 MiB ", 64 << 20),
            ("1PiB", 1 << 50),
            ("0.5B", 1),
            ("18446744073709551615", u64::MAX),
            ("3.GB", 3_000_000_000),
            ("1TiB", 1 << 40),
            ("1.0000001B", 1),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn garbage_and_zero_are_refused_with_the_units() {
        for text in [
            "",
            "lots",
            "MiB",
            "10 XB",
            "1.2.3MiB",
            "-5MiB",
            "0",
            "0.1B",
            ".5KiB",
            " ",
            "1 2 MiB",
            "1 2",
            "1 MiB 5",
            "18446744073709551616",
            "19EB",
            "20EiB",
            "99999999999999999999",
        ] {
            let error = parse_bytes(text).expect_err(text);
            assert!(
                error.contains("MiB") && error.contains("MB"),
                "{text}: {error}"
            );
        }
    }
}
