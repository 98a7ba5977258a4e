//! The numeric kernels of both models, each in a file of its own: matrix products and the
//! fused linear layer ([`gemm`], over the blocked product of [`tile`]), element-wise pieces
//! ([`elementwise`]), the optimisers ([`optim`]),
//! layer norm ([`layernorm`]), causal attention ([`attention`]), the embeddings
//! ([`embedding`]), softmax cross-entropy ([`loss`]); the vector dispatch and exact sums they
//! share ([`simd`]) and the scratch they share across threads ([`scratch`]).
//!
//! Every kernel gives the same bits at any thread count: its work is cut by the shapes, never
//! by the threads, and every sum is taken in an order the code fixes. So the losses of a run
//! are the same bits at 1, 2, 3 or 32 threads, and a recomputed tensor is the same bits as the
//! one it replaces.

pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod layernorm;
pub mod loss;
pub mod optim;
pub mod scratch;
pub mod simd;
pub mod tile;
