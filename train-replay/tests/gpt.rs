//! The GPT end to end, tiny: the same losses to the bit at any thread count and whatever the
//! forward pass keeps (everything, every k-th block's input, or fitted to a budget that
//! evicts), weights that go out to a safetensors file and come back, the validation loss and
//! the sample, and bad input refused with exit code 2 and a message naming the flag.

mod common;

use common::{succeeded, train_replay};
use train_replay::measure::Summary;

/// A GPT small enough for a debug build: 3 blocks of width 32, context 24, batch 4.
const TINY_GPT: &[&str] = &[
    "--model",
    "gpt",
    "--context",
    "24",
    "--width",
    "32",
    "--heads",
    "4",
    "--layers",
    "3",
    "--batch",
    "4",
    "--steps",
    "3",
];

/// The summary of a `--json` run of the tiny GPT with `extra` flags.
fn run(extra: &[&str]) -> Summary {
    let args = [&["train", "--json"], TINY_GPT, extra].concat();
    let out = train_replay(&args);
    Summary::parse(&succeeded(&out, &args)).expect("a JSON summary")
}

/// The losses' bits and the digest of the parameters' bits after the last step (the losses
/// of three steps alone hide a difference of an ulp in a gradient).
fn bits(summary: &Summary) -> (Vec<u32>, Option<u64>) {
    let losses = summary.losses.iter().map(|l| l.to_bits()).collect();
    (losses, summary.params_digest)
}

#[test]
fn the_losses_are_the_same_bits_at_any_thread_count_and_any_keeping() {
    let reference = run(&["--threads", "1", "--checkpoint-every", "0"]);
    assert_eq!(reference.losses.len(), 3);
    assert!(reference.losses[0] > 5.0 && reference.losses[2] < reference.losses[0]);
    for extra in [
        &["--threads", "2", "--checkpoint-every", "0"][..],
        &["--threads", "3", "--checkpoint-every", "1"],
        &["--threads", "8", "--checkpoint-every", "2"],
        &["--threads", "2", "--checkpoint-every", "99"],
        &["--threads", "2", "--keep-scores", "--checkpoint-every", "0"],
    ] {
        assert_eq!(bits(&run(extra)), bits(&reference), "{extra:?}");
    }
    // Fitted to a budget whose pool share holds the parameters and one block's tensors, not
    // all: it evicts, recomputes, and gives the same bits. The share set aside for what
    // stays outside the pool follows the machine's L2 cache, so it is read from a run first.
    let roomy = run(&["--threads", "2", "--budget", "1GiB"]);
    let outside = roomy
        .outside_reserve_bytes
        .expect("a fitted run reports its reserve");
    let budget = (outside + (900 << 10)).to_string();
    let fitted = run(&["--threads", "2", "--budget", &budget]);
    assert!(fitted.evictions_per_step.unwrap() > 0.0, "{fitted:?}");
    assert!(
        fitted.recomputed_bytes_per_step.unwrap() > 0.0,
        "{fitted:?}"
    );
    // Every recompute is counted under its kind, and the kinds hold what the pool counted
    // (the pool counts blocks, the kinds tensors: every tensor of this shape fills its block).
    let by_kind: f64 = fitted
        .recomputed_by_kind
        .iter()
        .map(|k| k.bytes_per_step)
        .sum();
    assert_eq!(
        Some(by_kind),
        fitted.recomputed_bytes_per_step,
        "{fitted:?}"
    );
    assert_eq!(bits(&fitted), bits(&reference));
}

/// The head in chunks of rows (32 of the tiny batch's 96, so three chunks): the same bits
/// at any thread count and whatever the forward pass keeps, and within 1e-5 of the head that
/// holds the logits whole (the weight gradient of the embedding is summed a chunk at a time).
#[test]
fn the_chunked_head_keeps_the_bits_and_agrees_with_the_whole_logits() {
    let chunked = run(&[
        "--threads",
        "1",
        "--checkpoint-every",
        "0",
        "--head-rows",
        "32",
    ]);
    for extra in [
        &[
            "--threads",
            "2",
            "--checkpoint-every",
            "0",
            "--head-rows",
            "32",
        ][..],
        &[
            "--threads",
            "3",
            "--checkpoint-every",
            "2",
            "--head-rows",
            "32",
        ],
    ] {
        assert_eq!(bits(&run(extra)), bits(&chunked), "{extra:?}");
    }
    let whole = run(&["--threads", "2", "--head-rows", "0"]);
    assert_eq!(
        bits(&whole),
        bits(&run(&["--threads", "2"])),
        "one chunk is the whole"
    );
    for (a, b) in chunked.losses.iter().zip(&whole.losses) {
        assert!(((a - b) / b).abs() < 1e-5, "{chunked:?} against {whole:?}");
    }
}

/// GPT-2's tokenizer: the text in its tokens (a loss that starts at about ln 50257, a
/// vocabulary that follows the tokenizer), and the sample decoded to text.
#[test]
fn gpt2_tokens_train_and_the_sample_is_text() {
    let args = [
        &["train"],
        TINY_GPT,
        &["--tokenizer", "gpt2", "--steps", "2", "--sample", "8"],
    ]
    .concat();
    let text = succeeded(&train_replay(&args), &args);
    assert!(text.contains("vocabulary 50257"), "{text}");
    let first: f32 = text
        .lines()
        .find_map(|line| line.strip_prefix("step    1  loss "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|loss| loss.parse().ok())
        .expect("the first step's loss");
    assert!((first - 50_257f32.ln()).abs() < 0.2, "{text}");
    let sample = text.split("----").nth(1).expect("a sample between rules");
    assert!(
        sample
            .trim()
            .chars()
            .all(|c| !c.is_control() || c.is_whitespace()),
        "{sample:?}"
    );
}

/// `--trace` on the GPT: each step's spans (`step`, `forward`, `loss`, `backward`), a
/// `backward (segment)` and an `optimizer (block)` span per block, every span ended, on the
/// track of the worker thread that runs the steps, named.
#[test]
fn the_gpt_trace_holds_every_steps_spans() {
    let dir = std::env::temp_dir().join(format!("gpt-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    let args = [
        &["train"],
        TINY_GPT,
        &["--trace", trace.to_str().unwrap(), "--sample", "0"],
    ]
    .concat();
    succeeded(&train_replay(&args), &args);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let spans = |name: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "B" && e["name"] == name)
            .collect()
    };
    let (steps, blocks) = (3, 3);
    for span in ["step", "forward", "loss", "backward"] {
        assert_eq!(spans(span).len(), steps, "a {span:?} span per step");
    }
    for span in ["backward (segment)", "optimizer (block)"] {
        assert_eq!(
            spans(span).len(),
            steps * blocks,
            "a {span:?} span per block"
        );
    }
    let begins = events.iter().filter(|e| e["ph"] == "B").count();
    let ends = events.iter().filter(|e| e["ph"] == "E").count();
    assert_eq!(
        (begins, ends),
        (steps * (4 + 2 * blocks), begins),
        "every span ended"
    );
    let tid = &spans("step")[0]["tid"];
    assert!(
        tid.as_u64().is_some_and(|t| t > 0),
        "an OS thread id: {tid}"
    );
    assert!(
        events.iter().any(|e| e["ph"] == "M"
            && e["name"] == "thread_name"
            && &e["tid"] == tid
            && e["args"]["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("worker "))),
        "the steps run on a worker's track, named"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn weights_go_out_and_come_back() {
    let dir = std::env::temp_dir().join(format!("gpt-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("init.safetensors");
    let path = file.to_str().unwrap();
    let seeded = run(&["--save-init", path]);
    // Another seed draws other weights and other batches; the file's weights with the first
    // seed's batches give the first run's losses.
    assert_ne!(bits(&run(&["--seed", "8"])), bits(&seeded));
    assert_eq!(bits(&run(&["--seed", "7", "--load", path])), bits(&seeded));
    let bytes = std::fs::read(&file).unwrap();
    let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8_lossy(&bytes[8..8 + length]).into_owned();
    for name in [
        "transformer.wte.weight",
        "transformer.h.2.mlp.c_proj.weight",
        "transformer.ln_f.bias",
    ] {
        assert!(header.contains(name), "no {name} in {header}");
    }
    // nanoGPT's layout: c_attn's weight is [3 x width, width].
    assert!(
        header.contains(r#""transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":[96,32]"#),
        "{header}"
    );

    // A context of one position: the position table is still a matrix, [1, width].
    let one = dir.join("one.safetensors");
    let one_path = one.to_str().unwrap();
    let first = run(&["--context", "1", "--save-init", one_path]);
    assert_eq!(
        bits(&run(&["--context", "1", "--load", one_path])),
        bits(&first)
    );
    let bytes = std::fs::read(&one).unwrap();
    let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8_lossy(&bytes[8..8 + length]).into_owned();
    assert!(
        header.contains(r#""transformer.wpe.weight":{"dtype":"F32","shape":[1,32]"#),
        "{header}"
    );

    // A model of another shape names the tensor and both shapes, and exits with 2.
    let args = [&["train"], TINY_GPT, &["--width", "64", "--load", path]].concat();
    let out = train_replay(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .contains("transformer.wte.weight is [256, 32] in the file, the model's is [256, 64]"),
        "{stderr}"
    );
    // Fewer blocks than the file: a tensor the model does not have.
    let args = [&["train"], TINY_GPT, &["--layers", "2", "--load", path]].concat();
    let out = train_replay(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("transformer.h.2.") && stderr.contains("not one of the model's"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run whose loss stops being finite ends with an error (exit code 1), not NaN figures.
#[test]
fn a_diverged_run_fails() {
    let args = [
        &["train"],
        TINY_GPT,
        &["--lr", "1e5", "--steps", "40", "--sample", "0"],
    ]
    .concat();
    let out = train_replay(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("diverged") && stderr.contains("--lr"),
        "{stderr}"
    );
}

#[test]
fn a_run_prints_the_validation_loss_and_a_sample() {
    let args = [
        &["train"],
        TINY_GPT,
        &["--eval-every", "2", "--sample", "40"],
    ]
    .concat();
    let text = succeeded(&train_replay(&args), &args);
    assert!(text.contains("step    2  validation loss"), "{text}");
    assert!(text.contains("sample (seeded"), "{text}");
    assert!(
        text.contains("validation loss") && text.contains("(falling)"),
        "{text}"
    );
}

/// `args` is refused with exit code 2 and a message holding each of `words`.
fn refused(args: &[&str], words: &[&str]) {
    let args = [&["train"], TINY_GPT, args].concat();
    let out = train_replay(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    for word in words {
        assert!(stderr.contains(word), "{args:?}: no {word:?} in {stderr}");
    }
}

#[test]
fn bad_input_is_refused_with_exit_code_2() {
    refused(
        &["--width", "30"],
        &["--width 30", "--heads 4", "--width 32"],
    );
    refused(&["--context", "0"], &["--context", "1 to 4096"]);
    refused(&["--context", "5000"], &["--context", "1 to 4096"]);
    refused(&["--vocab", "0"], &["--vocab", "1 to 65536"]);
    refused(&["--vocab", "65537"], &["--vocab"]);
    refused(&["--heads", "0"], &["--heads", "at least 1"]);
    refused(&["--vocab", "100"], &["--vocab 100", "byte 122"]);
    let dir = std::env::temp_dir().join(format!("gpt-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (empty, short) = (dir.join("empty.txt"), dir.join("short.txt"));
    std::fs::write(&empty, b"").unwrap();
    std::fs::write(&short, [b'a'; 100]).unwrap();
    refused(
        &["--data", empty.to_str().unwrap()],
        &["--data", "is empty"],
    );
    refused(
        &["--data", short.to_str().unwrap()],
        &["--data", "validation part (10 bytes", "--context 24"],
    );
    refused(
        &["--data", dir.join("missing").to_str().unwrap()],
        &["--data", "missing"],
    );
    refused(&["--data", dir.to_str().unwrap()], &["--data"]); // a directory
    refused(
        &["--load", short.to_str().unwrap()],
        &["--load", "not a safetensors file"],
    );
    // A text with fewer tokens of GPT-2's than one context in each part.
    std::fs::write(&short, "to be or not to be ".repeat(12)).unwrap();
    refused(
        &["--tokenizer", "gpt2", "--data", short.to_str().unwrap()],
        &["--data", "tokens of --tokenizer gpt2", "--context 24"],
    );
    refused(
        &["--tokenizer", "gpt2", "--vocab", "50000"],
        &["--vocab 50000", "50257", "--tokenizer gpt2"],
    );
    refused(&["--tokenizer", "words"], &["--tokenizer", "bytes", "gpt2"]);
    refused(
        &["--preset", "gpt3"],
        &["--preset", "gpt2-small", "gpt2-mini"],
    );
    // A flag of the other model would be silently ignored.
    refused(&["--hidden", "7"], &["--hidden", "--model mlp"]);
    let out = train_replay(&["train", "--model", "mlp", "--preset", "gpt2-mini"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--preset is a flag of --model gpt"),
        "{stderr}"
    );
    refused(&["--model", "mlp"], &["--context", "--model gpt"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
