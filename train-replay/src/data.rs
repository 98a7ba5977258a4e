//! The GPT's text and its tokens: a file (by default the one that ships with the job,
//! `data/shakespeare.txt`: the first MiB of Shakespeare's plays, public domain) cut into
//! tokens by a [`Tokenizer`] (its bytes, or GPT-2's byte-pair encoding), its first nine
//! tenths of tokens for training and the last tenth for validation. Batches are windows of
//! `context + 1` tokens at offsets drawn from the seed with SplitMix64's mixer ([`offsets`]),
//! a function simple enough that `scripts/torch_gpt.py` draws the same ones.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::anyhow;
use tiktoken_rs::CoreBPE;

use crate::error::BadInput;

/// The text that ships with the job.
const SHIPPED: &[u8] = include_bytes!("../data/shakespeare.txt");

/// What `--data` names, for messages: the file, or the shipped text.
fn source(path: Option<&Path>) -> String {
    path.map_or_else(
        || "the shipped text".to_owned(),
        |p| format!("--data {}", p.display()),
    )
}

/// How a text becomes tokens.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tokenizer {
    /// Each byte is a token (256 tokens).
    #[default]
    Bytes,
    /// GPT-2's byte-pair encoding, `r50k_base` (50,257 tokens).
    Gpt2,
}

impl Tokenizer {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Gpt2 => "gpt2",
        }
    }

    /// The tokens it makes: every token is below this.
    pub fn vocab(self) -> usize {
        match self {
            Self::Bytes => 256,
            Self::Gpt2 => 50_257,
        }
    }

    /// GPT-2's encoder, made once (from the ranks the crate ships).
    fn gpt2() -> anyhow::Result<&'static CoreBPE> {
        static BPE: OnceLock<Result<CoreBPE, String>> = OnceLock::new();
        BPE.get_or_init(|| tiktoken_rs::r50k_base().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| anyhow!("GPT-2's tokenizer: {e}"))
    }

    /// The tokens of `bytes`. GPT-2's tokenizer reads text: bytes that are not UTF-8 are read
    /// as U+FFFD.
    pub fn encode(self, bytes: &[u8]) -> anyhow::Result<Vec<u32>> {
        Ok(match self {
            Self::Bytes => bytes.iter().map(|&b| u32::from(b)).collect(),
            Self::Gpt2 => Self::gpt2()?.encode_ordinary(&String::from_utf8_lossy(bytes)),
        })
    }

    /// The text of `tokens` (each below [`vocab`](Self::vocab)); bytes that do not make
    /// UTF-8 (a token may end inside a character) are shown as U+FFFD.
    pub fn decode(self, tokens: &[u32]) -> anyhow::Result<String> {
        let bytes = match self {
            Self::Bytes => tokens.iter().map(|&t| t.min(255) as u8).collect(),
            Self::Gpt2 => Self::gpt2()?
                .decode_bytes(tokens)
                .map_err(|e| anyhow!("decoding a sample: {e}"))?,
        };
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The token of a line break, which a sample starts from.
    pub fn newline(self) -> u32 {
        match self {
            Self::Bytes => u32::from(b'\n'),
            Self::Gpt2 => 198, // "\n" in r50k_base
        }
    }
}

/// A text's tokens, split into training and validation parts.
#[derive(Debug, Clone)]
pub struct Text {
    /// The first nine tenths.
    pub train: Vec<u32>,
    /// The last tenth.
    pub val: Vec<u32>,
    /// Where it came from (`None`: the shipped text).
    pub path: Option<PathBuf>,
    /// What made the tokens.
    pub tokenizer: Tokenizer,
}

/// Which of a text's parts a batch comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Training.
    Train = 0,
    /// Validation.
    Val = 1,
}

impl Text {
    /// The file at `path` (the shipped text if `None`) in `tokenizer`'s tokens, split; an
    /// error naming `--data` if the file cannot be read, is empty, has a part shorter than
    /// `context + 1` tokens, or holds a token that is not below `vocab`.
    pub fn load(
        path: Option<&Path>,
        context: usize,
        vocab: usize,
        tokenizer: Tokenizer,
    ) -> anyhow::Result<Self> {
        let bytes = match path {
            Some(path) => std::fs::read(path).map_err(|e| {
                BadInput(format!(
                    "--data {}: {e}: give a readable text file",
                    path.display()
                ))
            })?,
            None => SHIPPED.to_vec(),
        };
        let tokens = tokenizer.encode(&bytes)?;
        Ok(Self::split(tokens, path, context, vocab, tokenizer)?)
    }

    /// Splits `tokens` (see [`load`](Self::load)).
    pub fn split(
        mut tokens: Vec<u32>,
        path: Option<&Path>,
        context: usize,
        vocab: usize,
        tokenizer: Tokenizer,
    ) -> Result<Self, BadInput> {
        let name = source(path);
        let (unit, by) = match tokenizer {
            Tokenizer::Bytes => ("bytes", ""),
            Tokenizer::Gpt2 => ("tokens", " of --tokenizer gpt2"),
        };
        if tokens.is_empty() {
            return Err(BadInput(format!(
                "{name} is empty: give a text of at least 10 x (--context + 1) {unit}{by}"
            )));
        }
        let cut = tokens.len() / 10 * 9 + tokens.len() % 10 * 9 / 10;
        let val = tokens.split_off(cut);
        let need = context.saturating_add(1);
        if tokens.len() < need || val.len() < need {
            return Err(BadInput(format!(
                "{name} has {} {unit}{by}: its training part ({} {unit}) and validation part \
                 ({} {unit}, the last tenth) must each hold one context and the token after \
                 it, {need} {unit} (--context {context}): give a longer text or a shorter \
                 --context",
                tokens.len() + val.len(),
                tokens.len(),
                val.len(),
            )));
        }
        if let Some(&largest) = tokens
            .iter()
            .chain(&val)
            .max()
            .filter(|&&t| t as usize >= vocab)
        {
            let what = match tokenizer {
                Tokenizer::Bytes => format!("the byte {largest}"),
                Tokenizer::Gpt2 => format!("the token {largest}"),
            };
            return Err(BadInput(format!(
                "{name} holds {what}, but --vocab {vocab} has tokens 0 to {}: give a --vocab \
                 above {largest} ({} holds every token of --tokenizer {})",
                vocab.saturating_sub(1),
                tokenizer.vocab(),
                tokenizer.name(),
            )));
        }
        Ok(Self {
            train: tokens,
            val,
            path: path.map(Path::to_path_buf),
            tokenizer,
        })
    }

    /// The tokens of `part`.
    pub fn part(&self, part: Part) -> &[u32] {
        match part {
            Part::Train => &self.train,
            Part::Val => &self.val,
        }
    }

    /// Writes every token, training part then validation part, as little-endian `u32`s:
    /// what `scripts/torch_gpt.py --tokens` reads (and splits as [`split`](Self::split)
    /// does).
    pub fn write_tokens(&self, path: &Path) -> anyhow::Result<()> {
        let bytes: Vec<u8> = self
            .train
            .iter()
            .chain(&self.val)
            .flat_map(|t| t.to_le_bytes())
            .collect();
        std::fs::write(path, bytes).map_err(|e| anyhow!("writing {}: {e}", path.display()))
    }

    /// Batch `index` of `part`: `rows` windows of `context` input tokens into `inputs` and the
    /// tokens that follow each into `targets` (both cleared first); `shape` is `(rows,
    /// context)`.
    pub fn batch(
        &self,
        part: Part,
        seed: u64,
        index: u64,
        (rows, context): (usize, usize),
        inputs: &mut Vec<u32>,
        targets: &mut Vec<u32>,
    ) {
        let tokens = self.part(part);
        let span = (tokens.len() - context) as u64; // `split` keeps it above 0
        inputs.clear();
        targets.clear();
        for start in offsets(seed, part, index, rows, span) {
            let window = &tokens[start as usize..][..context + 1];
            inputs.extend_from_slice(&window[..context]);
            targets.extend_from_slice(&window[1..]);
        }
    }
}

/// SplitMix64's output function: a bijection of 64-bit words whose outputs look random.
pub fn mix(x: u64) -> u64 {
    let x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The first token of each of the `rows` windows of batch `index` of `part`, each below
/// `span`: `mix(base ^ row) % span` with `base = mix(mix(mix(seed) ^ part) ^ index)`.
pub fn offsets(
    seed: u64,
    part: Part,
    index: u64,
    rows: usize,
    span: u64,
) -> impl Iterator<Item = u64> {
    let base = mix(mix(mix(seed) ^ part as u64) ^ index);
    (0..rows as u64).map(move |row| mix(base ^ row) % span.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_the_scripts() {
        // What scripts/torch_gpt.py's `offsets(7, 0, 3, 4, 1000)` prints.
        let got: Vec<u64> = offsets(7, Part::Train, 3, 4, 1000).collect();
        assert_eq!(
            got,
            [
                mix(mix(mix(mix(7)) ^ 3)) % 1000,
                mix(mix(mix(mix(7)) ^ 3) ^ 1) % 1000,
                mix(mix(mix(mix(7)) ^ 3) ^ 2) % 1000,
                mix(mix(mix(mix(7)) ^ 3) ^ 3) % 1000,
            ]
        );
        assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn a_text_is_split_nine_to_one_and_checked() {
        let bytes = Tokenizer::Bytes;
        let text = Text::split((0..100).collect(), None, 8, 256, bytes).unwrap();
        assert_eq!((text.train.len(), text.val.len()), (90, 10));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        text.batch(Part::Val, 1, 0, (3, 8), &mut x, &mut y);
        assert_eq!((x.len(), y.len()), (24, 24));
        assert!(x.iter().zip(&y).all(|(a, b)| b == &(a + 1)));
        assert!(x.iter().all(|&t| (90..100).contains(&t)));
        for (tokens, context, vocab, words) in [
            (vec![], 8, 256, "empty"),
            (vec![1; 50], 8, 256, "validation part (5"),
            (vec![200; 100], 8, 128, "the byte 200"),
        ] {
            let error = Text::split(tokens, None, context, vocab, bytes)
                .unwrap_err()
                .0;
            assert!(error.contains(words), "{error}");
        }
        let gpt2 = Text::split(vec![50_000; 100], None, 8, 256, Tokenizer::Gpt2);
        let error = gpt2.unwrap_err().0;
        assert!(
            error.contains("the token 50000") && error.contains("50257"),
            "{error}"
        );
        let missing = Text::load(Some(Path::new("/no/such/file")), 8, 256, bytes)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("--data /no/such/file"), "{missing}");
    }

    #[test]
    fn the_shipped_text_is_bytes_below_128_and_at_most_a_mib() {
        assert!(SHIPPED.len() <= 1 << 20 && SHIPPED.len() > 1 << 19);
        let text = Text::load(None, 256, 128, Tokenizer::Bytes).unwrap();
        assert_eq!(text.train.len() + text.val.len(), SHIPPED.len());
    }

    #[test]
    fn gpt2_tokens_round_trip_and_fit_its_vocabulary() {
        let gpt2 = Tokenizer::Gpt2;
        let text = "First Citizen:\nBefore we proceed any further, hear me speak.";
        let tokens = gpt2.encode(text.as_bytes()).unwrap();
        // r50k_base's ids for the first words, as tiktoken gives them.
        assert_eq!(&tokens[..4], &[5962, 22307, 25, 198]);
        assert_eq!(gpt2.decode(&tokens).unwrap(), text);
        assert_eq!(gpt2.encode(b"\n").unwrap(), [gpt2.newline()]);
        let all = Text::load(None, 1024, gpt2.vocab(), gpt2).unwrap();
        let count = all.train.len() + all.val.len();
        assert!(count > 250_000 && count < 400_000, "{count} tokens");
        assert!(all.train.iter().all(|&t| (t as usize) < gpt2.vocab()));
    }
}
