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
    // Two sequences of 70 positions: more than one block of queries and keys, the last one
    // short; a sequence shorter than a tile of rows with heads past two vectors (33: tiles
    // of 32 and 16); two blocks, the second of two rows, with a head of 17 (one tile of 32);
    // three blocks and a part, so that a query block meets key blocks before its own.
    for (batch, seq, heads, size) in [
        (2, 70, 3, 4),
        (1, 3, 2, 33),
        (1, 66, 1, 17),
        (1, 200, 2, 16),
    ] {
        attention_check(Heads {
            batch,
            seq,
            heads,
            size,
        });
    }
}

/// The attention's output and rows' log-sum-exps for `qkv`.
fn attention_forward(heads: Heads, qkv: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (n, c) = (heads.rows(), heads.width());
    let mut both = written(n * c + heads.stats_len().unwrap(), |buf| {
        let (out, stats) = buf.split_at_mut(n * c);
        attention::forward(heads, qkv, out, Some(stats), None)
    });
    let stats = both.split_off(n * c);
    (both, stats)
}

fn attention_check(heads: Heads) {
    let (n, c) = (heads.rows(), heads.width());
    let qkv = values(n * 3 * c, 5, 1.5);
    let w = values(n * c, 6, 1.0);
    let (out, stats) = attention_forward(heads, &qkv);
    reference_check(heads, &qkv, &out, &stats);
    let dqkv = written(n * 3 * c, |d| {
        attention::backward(heads, &qkv, (&out, &stats), &w, None, d)
    });
    check("attention dqkv", &qkv, &dqkv, 1e-2, 3e-2, |qkv| {
        weighted(&w, &attention_forward(heads, qkv).0)
    });
    // Causal: the first position's output is its own value, whatever the rest.
    for d in 0..heads.size {
        assert_eq!(out[d], qkv[2 * c + d]);
    }
    // With the weights kept, the same output and the same gradient, to the bit.
    let mut probs = vec![0.0; heads.probs_len().unwrap()];
    let mut kept_stats = vec![0.0; heads.stats_len().unwrap()];
    let kept = written(n * c, |o| {
        // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the kernel writes only floats.
        let (raw, stats) = unsafe {
            (
                &mut *(probs.as_mut_slice() as *mut [f32] as *mut [MaybeUninit<f32>]),
                &mut *(kept_stats.as_mut_slice() as *mut [f32] as *mut [MaybeUninit<f32>]),
            )
        };
        attention::forward(heads, &qkv, o, Some(stats), Some(raw))
    });
    assert_eq!(bits(&kept), bits(&out));
    assert_eq!(bits(&kept_stats), bits(&stats));
    let again = written(n * 3 * c, |d| {
        attention::backward(heads, &qkv, (&out, &stats), &w, Some(&probs), d)
    });
    assert_eq!(bits(&again), bits(&dqkv));
}

/// The output and the log-sum-exps against a plain causal softmax attention in `f64`.
fn reference_check(heads: Heads, qkv: &[f32], out: &[f32], stats: &[f32]) {
    let (c, t, size) = (heads.width(), heads.seq, heads.size);
    let scale = 1.0 / (size as f64).sqrt();
    let at = |row: usize, part: usize, h: usize, i: usize| {
        qkv[row * 3 * c + part * c + h * size + i] as f64
    };
    for b in 0..heads.batch {
        for h in 0..heads.heads {
            for i in 0..t {
                let row = b * t + i;
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..size)
                            .map(|e| at(row, 0, h, e) * at(b * t + j, 1, h, e))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::MIN, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                let lse = max + sum.ln();
                let got = stats[(b * heads.heads + h) * t + i] as f64;
                assert!(
                    (got - lse).abs() < 1e-4 * (1.0 + lse.abs()),
                    "lse {got} {lse}"
                );
                for e in 0..size {
                    let want: f64 = scores
                        .iter()
                        .enumerate()
                        .map(|(j, s)| (s - lse).exp() * at(b * t + j, 2, h, e))
                        .sum();
                    let got = out[row * c + h * size + e] as f64;
                    assert!(
                        (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                        "out {got} {want}"
                    );
                }
            }
        }
    }
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

/// A GPT of one block for the whole-model checks: width 16, 2 heads, 3 sequences of 6.
/// The attention's shape of a GPT of `shape`.
fn heads_of(shape: &train_replay::model::gpt::Shape) -> Heads {
    Heads {
        batch: shape.batch,
        seq: shape.context,
        heads: shape.heads,
        size: shape.width / shape.heads,
    }
}

/// Kernels on `Vec<f32>`, on the calling thread.
fn one_thread() -> train_replay::model::ops::Ops<'static, train_replay::backend::VecBackend> {
    train_replay::model::ops::Ops {
        backend: &train_replay::backend::VecBackend,
        threads: 1,
        dry: false,
    }
}

fn tiny_gpt() -> (
    train_replay::model::gpt::Shape,
    train_replay::model::gpt::params::Params<train_replay::backend::VecBackend>,
) {
    use rand::SeedableRng;
    let shape = train_replay::model::gpt::Shape {
        vocab: 29,
        context: 6,
        width: 16,
        heads: 2,
        layers: 1,
        batch: 3,
    };
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(11);
    let backend = train_replay::backend::VecBackend;
    let mut params =
        train_replay::model::gpt::params::Params::new(&backend, &shape, Some(&mut rng)).unwrap();
    // Layer norms and biases off their initial ones and zeros, so that every term counts.
    for (i, value) in params.lnf_w.get_mut().unwrap().iter_mut().enumerate() {
        *value = 1.0 + 0.3 * ((i % 5) as f32 - 2.0) / 2.0;
    }
    let block = &mut params.blocks[0];
    use train_replay::model::gpt::params::W;
    for (which, seed) in [(W::Ln1W, 1), (W::Ln2W, 2), (W::AttnB, 3), (W::FcB, 4)] {
        let noise = values(block[which].get().len(), seed, 0.3);
        for (v, n) in block[which].get_mut().unwrap().iter_mut().zip(noise) {
            *v += n;
        }
    }
    (shape, params)
}

/// A whole block (layer norms, attention, projections, the MLP, both residuals) against
/// finite differences of `L = sum(w * block(x))`: the input's gradient, and the fused
/// layers' weights'.
#[test]
fn a_whole_blocks_gradients_match_finite_differences() {
    use train_replay::backend::{Backend, VecBackend};
    use train_replay::model::gpt::block::{Keeping, Layer};
    use train_replay::model::gpt::params::W;
    let (shape, mut params) = tiny_gpt();
    let heads = heads_of(&shape);
    let n = heads.rows() * shape.width;
    let ops = one_thread();
    let (x, w) = (values(n, 21, 1.0), values(n, 22, 1.0));
    let forward = |params: &train_replay::model::gpt::params::Params<VecBackend>, x: &[f32]| {
        let layer = Layer {
            ops: &ops,
            params: &params.blocks[0],
            heads,
            keep_scores: false,
        };
        let x = VecBackend.save(x.to_vec()).unwrap();
        let (values, out) = layer.forward(x, Keeping::Plain, true).unwrap();
        (values, out.unwrap())
    };
    let (dx, grads) = {
        let (values, _) = forward(&params, &x);
        let layer = Layer {
            ops: &ops,
            params: &params.blocks[0],
            heads,
            keep_scores: false,
        };
        layer.backward(&values, w.clone()).unwrap()
    };
    let loss_at = |params: &train_replay::model::gpt::params::Params<VecBackend>, x: &[f32]| {
        weighted(&w, &forward(params, x).1)
    };
    check("block dx", &x, &dx, 1e-2, 2e-2, |x| loss_at(&params, x));
    for which in [W::AttnW, W::ProjW, W::FcW, W::OutW, W::Ln1W, W::Ln2B] {
        let start = params.blocks[0][which].get().to_vec();
        let analytic = grads[which as usize].clone();
        let name = format!("block {which:?}");
        let cell = std::cell::RefCell::new(&mut params);
        check(&name, &start, &analytic, 1e-2, 2e-2, |moved| {
            let mut params = cell.borrow_mut();
            params.blocks[0][which]
                .get_mut()
                .unwrap()
                .copy_from_slice(moved);
            loss_at(&params, &x)
        });
        cell.into_inner().blocks[0][which]
            .get_mut()
            .unwrap()
            .copy_from_slice(&start);
    }
}

/// The head (the final layer norm, the projection tied to the token embedding, the mean
/// cross-entropy) against finite differences of its loss, whole and in chunks of 5 rows: the
/// input's gradient, the embedding's and the layer norm's weight's.
#[test]
fn the_heads_gradients_match_finite_differences() {
    use train_replay::backend::{Backend, VecBackend};
    use train_replay::model::gpt::head::head;
    let (shape, mut params) = tiny_gpt();
    let heads = heads_of(&shape);
    let rows = heads.rows();
    let ops = one_thread();
    let x = values(rows * shape.width, 31, 1.5);
    let targets: Vec<u32> = (0..rows as u32)
        .map(|r| (r * 7) % shape.vocab as u32)
        .collect();
    for chunk in [0, 5] {
        let loss = |params: &train_replay::model::gpt::params::Params<VecBackend>, x: &[f32]| {
            let x = VecBackend.save(x.to_vec()).unwrap();
            head(&ops, params, &x, heads, &targets, false, chunk)
                .unwrap()
                .0 as f64
        };
        let saved = VecBackend.save(x.clone()).unwrap();
        let (_, grads) = head(&ops, &params, &saved, heads, &targets, true, chunk).unwrap();
        let grads = grads.unwrap();
        check(
            &format!("head dx ({chunk})"),
            &x,
            &grads.dx,
            1e-2,
            2e-2,
            |x| loss(&params, x),
        );
        let tables = [("wte", grads.dwte.clone()), ("ln_f", grads.lnf[0].clone())];
        for (name, analytic) in tables {
            let start = match name {
                "wte" => params.wte.get().to_vec(),
                _ => params.lnf_w.get().to_vec(),
            };
            let cell = std::cell::RefCell::new(&mut params);
            let set = |params: &mut train_replay::model::gpt::params::Params<VecBackend>,
                       values: &[f32]| {
                let param = match name {
                    "wte" => &mut params.wte,
                    _ => &mut params.lnf_w,
                };
                param.get_mut().unwrap().copy_from_slice(values);
            };
            check(
                &format!("head {name} ({chunk})"),
                &start,
                &analytic,
                1e-2,
                2e-2,
                |moved| {
                    let mut params = cell.borrow_mut();
                    set(&mut params, moved);
                    loss(&params, &x)
                },
            );
            set(cell.into_inner(), &start);
        }
    }
}
