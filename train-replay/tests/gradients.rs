//! Every kernel of the GPT against finite differences: each backward pass gives the gradient
//! of a scalar `L = sum(w * output)` (random `w`) that central differences of the forward
//! pass agree with. No PyTorch needed. (Each test fails if its backward pass drops a term:
//! a layer norm's mean term, the attention's softmax correction, a GELU slope's cubic.)

use std::mem::MaybeUninit;

use train_replay::kernels::attention::{self, Heads};
use train_replay::kernels::elementwise::{gelu_backward, gelu_uninit};
use train_replay::kernels::gemm::{Linear, Prologue};
use train_replay::kernels::{embedding, layernorm, loss};

/// Deterministic values in about [-scale, scale).
fn values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Runs a kernel into a fresh output of `len` elements.
fn written(len: usize, kernel: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut out = vec![MaybeUninit::new(f32::NAN); len];
    kernel(&mut out);
    // SAFETY: the elements started initialised, and the kernels write only floats.
    out.iter().map(|v| unsafe { v.assume_init() }).collect()
}

/// `sum(w * f(x))` in `f64`.
fn weighted(w: &[f32], out: &[f32]) -> f64 {
    w.iter().zip(out).map(|(&w, &o)| w as f64 * o as f64).sum()
}

/// Checks `analytic` (the gradient of `loss` at `x`) against central differences of step
/// `h` at up to `samples` evenly spread elements: within `tolerance` of the larger of the
/// two, plus an absolute floor.
fn check(
    name: &str,
    x: &[f32],
    analytic: &[f32],
    h: f32,
    tolerance: f64,
    loss: impl Fn(&[f32]) -> f64,
) {
    assert_eq!(x.len(), analytic.len(), "{name}: the gradient's length");
    let stride = (x.len() / 40).max(1);
    let mut worst = 0.0f64;
    for i in (0..x.len()).step_by(stride) {
        let mut moved = x.to_vec();
        moved[i] = x[i] + h;
        let up = loss(&moved);
        moved[i] = x[i] - h;
        let down = loss(&moved);
        let numeric = (up - down) / (2.0 * h as f64);
        let got = analytic[i] as f64;
        let error = (got - numeric).abs() / (got.abs().max(numeric.abs()) + 1e-2);
        worst = worst.max(error);
        assert!(
            error <= tolerance,
            "{name}[{i}]: analytic {got}, numeric {numeric} (relative error {error:.2e})"
        );
    }
    assert!(worst.is_finite(), "{name}");
}

#[test]
fn layer_norm_gradients_match_finite_differences() {
    let (rows, c) = (5, 24);
    let x = values(rows * c, 1, 2.0);
    let weight: Vec<f32> = values(c, 2, 0.5).iter().map(|v| v + 1.0).collect();
    let bias = values(c, 3, 0.5);
    let w = values(rows * c, 4, 1.0);
    let forward = |x: &[f32], weight: &[f32], bias: &[f32]| {
        let mut stats = vec![0.0; 2 * rows];
        let out = written(rows * c, |out| {
            layernorm::forward(rows, c, x, weight, bias, out, &mut stats)
        });
        (out, stats)
    };
    let (_, stats) = forward(&x, &weight, &bias);
    let (mut dx, mut dw, mut db) = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c]);
    layernorm::backward(rows, c, &w, &x, &weight, &stats, &mut dx, &mut dw, &mut db);
    check("layer norm dx", &x, &dx, 1e-2, 2e-2, |x| {
        weighted(&w, &forward(x, &weight, &bias).0)
    });
    check("layer norm dw", &weight, &dw, 1e-2, 2e-2, |p| {
        weighted(&w, &forward(&x, p, &bias).0)
    });
    check("layer norm db", &bias, &db, 1e-2, 2e-2, |p| {
        weighted(&w, &forward(&x, &weight, p).0)
    });
}

#[test]
fn attention_gradients_match_finite_differences_and_kept_weights_give_the_same_bits() {
    // Two sequences of 70 positions: more than one block of queries, the last one short; a
    // sequence shorter than a tile of rows with heads past two vectors (33: tiles of 32 and
    // 16); two blocks of queries, the second of two rows, with a head of 17 (one tile of 32).
    for (batch, seq, heads, size) in [(2, 70, 3, 4), (1, 3, 2, 33), (1, 66, 1, 17)] {
        attention_check(Heads {
            batch,
            seq,
            heads,
            size,
        });
    }
}

fn attention_check(heads: Heads) {
    let (n, c) = (heads.rows(), heads.width());
    let qkv = values(n * 3 * c, 5, 1.5);
    let w = values(n * c, 6, 1.0);
    let forward = |qkv: &[f32]| written(n * c, |out| attention::forward(heads, qkv, out, None));
    let out = forward(&qkv);
    let dqkv = written(n * 3 * c, |d| {
        attention::backward(heads, &qkv, &out, &w, None, d)
    });
    check("attention dqkv", &qkv, &dqkv, 1e-2, 3e-2, |qkv| {
        weighted(&w, &forward(qkv))
    });
    // Causal: the first position's output is its own value, whatever the rest.
    for d in 0..heads.size {
        assert_eq!(out[d], qkv[2 * c + d]);
    }
    // With the weights kept, the same output and the same gradient, to the bit.
    let mut probs = vec![0.0; heads.probs_len().unwrap()];
    let kept = written(n * c, |o| {
        // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the kernel writes only floats.
        let raw = unsafe { &mut *(probs.as_mut_slice() as *mut [f32] as *mut [MaybeUninit<f32>]) };
        attention::forward(heads, &qkv, o, Some(raw))
    });
    assert_eq!(bits(&kept), bits(&out));
    let again = written(n * 3 * c, |d| {
        attention::backward(heads, &qkv, &out, &w, Some(&probs), d)
    });
    assert_eq!(bits(&again), bits(&dqkv));
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn gelu_gradient_matches_finite_differences() {
    let x = values(300, 7, 4.0);
    let w = values(300, 8, 1.0);
    let forward = |x: &[f32]| written(x.len(), |out| gelu_uninit(x, out));
    let mut grad = w.clone();
    gelu_backward(&mut grad, &x);
    check("gelu", &x, &grad, 1e-2, 1e-2, |x| weighted(&w, &forward(x)));
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    let (rows, vocab) = (6, 11);
    let logits = values(rows * vocab, 9, 3.0);
    let targets: Vec<u32> = (0..rows as u32).map(|r| (r * 7) % vocab as u32).collect();
    let mean = |logits: &[f32]| {
        let mut copy = logits.to_vec();
        loss::cross_entropy(
            rows,
            vocab,
            &mut copy,
            &targets,
            &mut vec![0.0; rows],
            false,
        ) as f64
    };
    let mut grad = logits.clone();
    let got = loss::cross_entropy(rows, vocab, &mut grad, &targets, &mut vec![0.0; rows], true);
    assert_eq!(got.to_bits(), (mean(&logits) as f32).to_bits());
    check("cross-entropy", &logits, &grad, 1e-2, 1e-2, mean);
    // The softmax of each row minus its target sums to 0.
    for row in grad.chunks(vocab) {
        assert!(row.iter().sum::<f32>().abs() < 1e-6);
    }
}

#[test]
fn embedding_gradients_are_the_sums_of_their_rows() {
    let (seq, c, vocab) = (5, 8, 7);
    let tokens: Vec<u32> = vec![1, 3, 3, 0, 6, 3, 2, 2, 1, 5];
    let (wte, wpe) = (values(vocab * c, 10, 1.0), values(seq * c, 11, 1.0));
    let w = values(tokens.len() * c, 12, 1.0);
    let forward = |wte: &[f32], wpe: &[f32]| {
        written(tokens.len() * c, |out| {
            embedding::forward(&tokens, seq, c, wte, wpe, out)
        })
    };
    let mut dwte = vec![0.0; vocab * c];
    let dwpe = written(seq * c, |dwpe| {
        embedding::backward(&tokens, seq, c, &w, &mut dwte, dwpe)
    });
    check("wte", &wte, &dwte, 1e-2, 1e-3, |p| {
        weighted(&w, &forward(p, &wpe))
    });
    check("wpe", &wpe, &dwpe, 1e-2, 1e-3, |p| {
        weighted(&w, &forward(&wte, p))
    });
}

/// The fused layer is the composition it stands for: a layer norm or a GELU, the product,
/// the bias and the residual.
#[test]
fn the_fused_layer_is_its_composition() {
    let (rows, k, n) = (300, 12, 5);
    let (input, weight, bias) = (
        values(rows * k, 13, 2.0),
        values(k * n, 14, 0.5),
        values(n, 15, 0.5),
    );
    let residual = values(rows * n, 16, 1.0);
    let (lw, lb) = (values(k, 17, 1.0), values(k, 18, 1.0));
    let naive = |prepared: &[f32]| -> Vec<f32> {
        (0..rows * n)
            .map(|i| {
                let (r, j) = (i / n, i % n);
                let dot: f64 = (0..k)
                    .map(|p| prepared[r * k + p] as f64 * weight[p * n + j] as f64)
                    .sum();
                (dot + bias[j] as f64 + residual[i] as f64) as f32
            })
            .collect()
    };
    let mut stats = vec![0.0; 2 * rows];
    let normed = written(rows * k, |out| {
        layernorm::forward(rows, k, &input, &lw, &lb, out, &mut stats)
    });
    let activated = written(rows * k, |out| gelu_uninit(&input, out));
    for (prologue, prepared) in [
        (Prologue::Identity, input.clone()),
        (
            Prologue::LayerNorm {
                weight: &lw,
                bias: &lb,
            },
            normed,
        ),
        (Prologue::Gelu, activated),
    ] {
        let layer = Linear {
            k,
            n,
            weight: &weight,
            bias: &bias,
            prologue,
            residual: Some(&residual),
            relu: false,
        };
        let got = written(rows * n, |out| layer.run(rows, &input, out, 2));
        for (a, b) in got.iter().zip(naive(&prepared)) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{prologue:?}: {a} vs {b}"
            );
        }
    }
}
