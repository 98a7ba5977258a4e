//! The GPT's text: byte-level tokens of a file (by default the one that ships with the job,
//! `data/shakespeare.txt`: the first MiB of Shakespeare's plays, public domain), its first
//! nine tenths for training and the last tenth for validation. Batches are windows of
//! `context + 1` bytes at offsets drawn from the seed with SplitMix64's mixer ([`offsets`]),
//! a function simple enough that `scripts/torch_gpt.py` draws the same ones.

use std::path::{Path, PathBuf};

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

/// A text split into training and validation tokens.
#[derive(Debug, Clone)]
pub struct Text {
    /// The first nine tenths.
    pub train: Vec<u8>,
    /// The last tenth.
    pub val: Vec<u8>,
    /// Where it came from (`None`: the shipped text).
    pub path: Option<PathBuf>,
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
    /// The file at `path` (the shipped text if `None`), split; an error naming `--data` if the
    /// file cannot be read, is empty, has a part shorter than `context + 1` bytes, or holds a
    /// byte that is not below `vocab`.
    pub fn load(path: Option<&Path>, context: usize, vocab: usize) -> Result<Self, BadInput> {
        let bytes = match path {
            Some(path) => std::fs::read(path).map_err(|e| {
                BadInput(format!(
                    "--data {}: {e}: give a readable text file",
                    path.display()
                ))
            })?,
            None => SHIPPED.to_vec(),
        };
        Self::split(bytes, path, context, vocab)
    }

    /// Splits `bytes` (see [`load`](Self::load)).
    pub fn split(
        mut bytes: Vec<u8>,
        path: Option<&Path>,
        context: usize,
        vocab: usize,
    ) -> Result<Self, BadInput> {
        let name = source(path);
        if bytes.is_empty() {
            return Err(BadInput(format!(
                "{name} is empty: give a text of at least 10 x (--context + 1) bytes"
            )));
        }
        let cut = bytes.len() / 10 * 9 + bytes.len() % 10 * 9 / 10;
        let val = bytes.split_off(cut);
        let need = context.saturating_add(1);
        if bytes.len() < need || val.len() < need {
            return Err(BadInput(format!(
                "{name} has {} bytes: its training part ({} bytes) and validation part ({} \
                 bytes, the last tenth) must each hold one context and its next byte, {need} \
                 bytes (--context {context}): give a longer text or a shorter --context",
                bytes.len() + val.len(),
                bytes.len(),
                val.len(),
            )));
        }
        if let Some(&largest) = bytes
            .iter()
            .chain(&val)
            .max()
            .filter(|&&b| b as usize >= vocab)
        {
            return Err(BadInput(format!(
                "{name} holds the byte {largest}, but --vocab {vocab} has tokens 0 to {}: \
                 give a --vocab above {largest} (256 holds every byte)",
                vocab.saturating_sub(1)
            )));
        }
        Ok(Self {
            train: bytes,
            val,
            path: path.map(Path::to_path_buf),
        })
    }

    /// The tokens of `part`.
    pub fn part(&self, part: Part) -> &[u8] {
        match part {
            Part::Train => &self.train,
            Part::Val => &self.val,
        }
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
            inputs.extend(window[..context].iter().map(|&b| u32::from(b)));
            targets.extend(window[1..].iter().map(|&b| u32::from(b)));
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
        let text = Text::split((0..100u8).collect(), None, 8, 256).unwrap();
        assert_eq!((text.train.len(), text.val.len()), (90, 10));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        text.batch(Part::Val, 1, 0, (3, 8), &mut x, &mut y);
        assert_eq!((x.len(), y.len()), (24, 24));
        assert!(x.iter().zip(&y).all(|(a, b)| b == &(a + 1)));
        assert!(x.iter().all(|&t| (90..100).contains(&t)));
        for (bytes, context, vocab, words) in [
            (vec![], 8, 256, "empty"),
            (vec![1; 50], 8, 256, "validation part (5"),
            (vec![200; 100], 8, 128, "the byte 200"),
        ] {
            let error = Text::split(bytes, None, context, vocab).unwrap_err().0;
            assert!(error.contains(words), "{error}");
        }
        let missing = Text::load(Some(Path::new("/no/such/file")), 8, 256)
            .unwrap_err()
            .0;
        assert!(missing.contains("--data /no/such/file"), "{missing}");
    }

    #[test]
    fn the_shipped_text_is_bytes_below_128_and_at_most_a_mib() {
        assert!(SHIPPED.len() <= 1 << 20 && SHIPPED.len() > 1 << 19);
        let text = Text::load(None, 256, 128).unwrap();
        assert_eq!(text.train.len() + text.val.len(), SHIPPED.len());
    }
}
