//! The matrix product every kernel of the job runs: `c = start + prologue(a) * b`, then a
//! ReLU if asked, blocked so that its memory does not grow with the threads.
//!
//! - **Shared panel.** `b` is packed a panel at a time (at most [`KP`] of its depth by [`NC`]
//!   of its columns, in strips of [`NR`] columns) into one buffer that every thread reads:
//!   the call packs it once, whatever the thread count, and it is the call's only buffer on
//!   the heap ([`panel_bytes`]), kept between calls in a [`Stash`]; products that run at
//!   once (from two threads, or one inside another's task) each take a buffer of their own.
//! - **A tile per thread.** A task is a sliver of [`MR`] rows of `a`: it packs [`KC`] of
//!   their depth at a time into a buffer on its own stack (24 KiB, and as much again for
//!   the rows a prologue prepares), applying the prologue (a layer norm, a GELU) while it
//!   packs, and multiplies it by each strip of the panel in registers ([`MR`] x [`NR`]
//!   accumulators). The output tile is loaded, summed into and stored; nothing else is kept
//!   per thread.
//! - **The same bits everywhere.** Every element of `c` is one chain of fused multiply-adds
//!   over the depth in order, starting from its start value (zero, the output's value, the
//!   bias, the bias plus a residual): the blocking, the split among threads and the kernel
//!   chosen (AVX-512, AVX2, or the portable one) change which element is summed where, never
//!   how. So the results are the same bits at any thread count, and on any processor (a NaN's
//!   payload aside).

use rayon::prelude::*;

use super::elementwise::gelu_into;
use super::layernorm;
use super::scratch::Stash;

/// Rows of a register tile: a sliver of `a`.
pub const MR: usize = 12;
/// Columns of a register tile: a strip of `b` (two AVX-512 vectors).
pub const NR: usize = 32;
/// Depth of a packed sliver of `a` (a sliver is `MR x KC`, 24 KiB, on the task's stack).
pub const KC: usize = 512;
/// Columns of a packed panel of `b`.
pub const NC: usize = 1024;
/// Depth of a packed panel of `b` at most: deeper products add a panel's sums at a time.
pub const KP: usize = 512;

/// The bytes of the panel buffer a product of depth `k` and `n` columns packs (the call's
/// only heap buffer, read by all its threads).
pub fn panel_bytes(k: usize, n: usize) -> u64 {
    (k.min(KP) as u64)
        .saturating_mul(n.min(NC).next_multiple_of(NR) as u64)
        .saturating_mul(4)
}

/// A matrix operand: its elements and its row and column strides.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major `rows x cols` matrix.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns (no copy).
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }

    /// A matrix with row stride `rs` and column stride `cs`.
    pub fn strided(data: &'a [f32], rs: usize, cs: usize) -> Self {
        Self { data, rs, cs }
    }

    /// The rows from `row` on.
    ///
    /// # Panics
    ///
    /// If `row x rs` is past the elements.
    pub fn below(self, row: usize) -> Self {
        let start = row.checked_mul(self.rs).expect("row * rs overflows");
        Self {
            data: &self.data[start..],
            ..self
        }
    }

    /// Whether every element of a `rows x cols` operand lies inside `data`.
    pub fn reaches(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || (rows - 1)
                .checked_mul(self.rs)
                .zip((cols - 1).checked_mul(self.cs))
                .and_then(|(r, c)| r.checked_add(c))
                .is_some_and(|last| last < self.data.len())
    }

    /// Element `(i, j)`.
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }
}

/// What a product does to each row of `a` before it multiplies it.
#[derive(Clone, Copy, Debug)]
pub enum Prologue<'a> {
    /// The rows as they are.
    Identity,
    /// A layer norm with this weight and bias (see [`layernorm`]); `a` must be row-major.
    LayerNorm {
        /// Its weight (gain), one per column.
        weight: &'a [f32],
        /// Its bias, one per column.
        bias: &'a [f32],
    },
    /// The GELU, tanh form (see [`gelu_into`]); `a` must be row-major.
    Gelu,
}

/// What each element of the output starts its sum from.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// Zero: the output is written without being read (it may be uninitialised).
    Zero,
    /// The output's own value (a sum added to it).
    Output,
    /// The bias of its column.
    Bias(&'a [f32]),
    /// A residual's element plus the bias of its column: `residual` is row-major with one
    /// row of `n` per output row.
    Residual {
        /// The bias, one per column.
        bias: &'a [f32],
        /// The residual, `m x n` row-major.
        residual: &'a [f32],
    },
}

/// One product `c[m x n] = relu?(start + prologue(a)[m x k] * b[k x n])`.
#[derive(Clone, Copy, Debug)]
pub struct Product<'a> {
    /// Rows of `a` and `c`.
    pub m: usize,
    /// The depth: columns of `a`, rows of `b`.
    pub k: usize,
    /// Columns of `b` and `c`.
    pub n: usize,
    /// The left operand.
    pub a: Mat<'a>,
    /// What `a`'s rows go through first.
    pub prologue: Prologue<'a>,
    /// The right operand.
    pub b: Mat<'a>,
    /// Where each sum starts.
    pub start: Start<'a>,
    /// A ReLU on the output.
    pub relu: bool,
}

/// An output the tasks share, each writing its own elements: a product's rows (one sliver a
/// task), or a panel's depth steps (one block of them a task, `pack_panel`).
#[derive(Clone, Copy)]
struct Out(*mut f32);

impl Out {
    /// The pointer (a method, so that closures capture the `Sync` wrapper, not the field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: the tasks that share it write disjoint elements (rows of a product, depth steps of
// a panel), and the buffer it points into outlives them: `Product::run`'s caller keeps the
// output valid and unaliased until it returns, and `pack_panel` borrows the panel mutably
// until every task has returned.
unsafe impl Send for Out {}
// SAFETY: as for `Send`.
unsafe impl Sync for Out {}

/// Where a register tile's sums start: `from` (row stride `rs`; null: zeros), plus `bias`
/// (one row, added to every row; null: nothing added).
#[derive(Clone, Copy)]
struct Init {
    from: *const f32,
    rs: usize,
    bias: *const f32,
}

/// A register-tile kernel: `c[MR x NR] (row stride c_rs) = init + a_sliver * b_strip` over
/// `kc` of depth (a sliver holds `MR` per depth step, a strip `NR`), each element one chain
/// of fused multiply-adds in depth order from its start; then a ReLU if asked.
///
/// # Safety (of each kernel)
///
/// `a` holds `kc * MR` elements, `b` `kc * NR`; `c` is valid for writes of the `MR x NR`
/// tile and no other reference reaches it; `init`'s pointers are null or valid for reads of
/// an `MR x NR` tile of row stride `rs` (one row for `bias`), initialised (`from` may be `c`
/// itself: every kernel reads all its starts before it writes); the processor has the
/// kernel's features.
type Kernel = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, Init, bool);

/// Writes `kc` elements of each of `MR` rows side by side into a sliver: element `p` of row
/// `i` at `p * MR + i`.
///
/// # Safety (of each version)
///
/// Each row holds at least `kc` elements, `kc <= KC`; the processor has the version's
/// features.
type Interleave = unsafe fn(&[&[f32]; MR], usize, &mut [f32; MR * KC]);

/// The kernels this processor runs best.
#[derive(Clone, Copy)]
struct Kernels {
    tile: Kernel,
    interleave: Interleave,
}

impl Product<'_> {
    /// Checks that every operand holds its shape; panics if not.
    fn check(&self) {
        let (m, k, n) = (self.m, self.k, self.n);
        let fits = |len: usize, cols: usize| m.checked_mul(cols).is_some_and(|need| len >= need);
        assert!(
            self.a.reaches(m, k) && self.b.reaches(k, n),
            "operands too short for their shapes"
        );
        match self.prologue {
            Prologue::Identity => {}
            Prologue::LayerNorm { weight, bias } => assert!(
                weight.len() == k && bias.len() == k && (self.a.cs == 1 || m == 0),
                "a layer norm of another width, or of columns"
            ),
            Prologue::Gelu => assert!(self.a.cs == 1 || m == 0, "a GELU of columns"),
        }
        match self.start {
            Start::Zero | Start::Output => {}
            Start::Bias(bias) => assert!(bias.len() >= n, "a bias of another width"),
            Start::Residual { bias, residual } => assert!(
                bias.len() >= n && fits(residual.len(), n),
                "a bias or residual of another shape"
            ),
        }
    }

    /// Runs the product into `c` (row stride `c_rs`): with `threads` above 1, the current
    /// rayon pool's threads share it; with 1, this thread runs it alone. The same bits either
    /// way, and at any pool size.
    ///
    /// # Safety
    ///
    /// `c` is non-null, aligned for `f32` and valid for writes of every element `i * c_rs +
    /// j` (`i < m`, `j < n`), and for reads of them if the start is [`Start::Output`] (they
    /// are then initialised); no other reference reaches them, or overlaps the operands,
    /// while the call runs. (Rows that overlap, `c_rs < n`, are refused with a panic: the
    /// threads write rows at once.)
    ///
    /// # Panics
    ///
    /// If an operand is too short for its shape, or a layer norm or GELU prologue is asked
    /// of an `a` that is not row-major.
    pub unsafe fn run(&self, c: *mut f32, c_rs: usize, threads: usize) {
        // SAFETY: the caller's contract.
        unsafe { self.run_with(c, c_rs, threads, choose_kernels()) }
    }

    /// [`Product::run`] with the kernels given.
    ///
    /// # Safety
    ///
    /// As [`Product::run`]'s, and the processor has the kernels' features.
    unsafe fn run_with(&self, c: *mut f32, c_rs: usize, threads: usize, kernel: Kernels) {
        self.check();
        assert!(
            self.m <= 1 || self.n == 0 || c_rs >= self.n,
            "output rows that overlap (row stride below the columns)"
        );
        let (m, k, n) = (self.m, self.k, self.n);
        if m == 0 || n == 0 {
            return;
        }
        let out = Out(c);
        if k == 0 {
            // No depth: each element is its start value.
            let mut buffers = Buffers::new();
            for j0 in (0..n).step_by(NC) {
                let nc = NC.min(n - j0);
                for s in 0..m.div_ceil(MR) {
                    // SAFETY: as below, with an empty depth (no operand is read).
                    unsafe { self.sliver(s, &[], 0, 0, j0, nc, out, c_rs, kernel, &mut buffers) }
                }
            }
            return;
        }
        let strips_max = n.min(NC).div_ceil(NR);
        PANEL.with(k.min(KP) * strips_max * NR, |panel| {
            for j0 in (0..n).step_by(NC) {
                let nc = NC.min(n - j0);
                let strips = nc.div_ceil(NR);
                for d0 in (0..k).step_by(KP) {
                    let kp = KP.min(k - d0);
                    let panel = &mut panel[..strips * kp * NR];
                    pack_panel(self.b, d0, kp, j0, nc, panel, threads);
                    let panel = &*panel;
                    let sliver = |buffers: &mut Buffers, s: usize| {
                        // SAFETY: the sliver's rows of `c` are its own (tasks take disjoint
                        // slivers), inside `m x n` (the caller's contract), and the panel
                        // holds `strips` strips of `kp x NR`.
                        unsafe { self.sliver(s, panel, d0, kp, j0, nc, out, c_rs, kernel, buffers) }
                    };
                    // A task's buffers are made (and zeroed) once for all the slivers it
                    // runs, not once a sliver.
                    let tasks = m.div_ceil(MR);
                    if threads > 1 && tasks > 1 {
                        (0..tasks)
                            .into_par_iter()
                            .for_each_init(Buffers::new, sliver);
                    } else {
                        let mut buffers = Buffers::new();
                        (0..tasks).for_each(|s| sliver(&mut buffers, s));
                    }
                }
            }
        });
    }

    /// Sliver `s` (rows `s * MR ..`) against a packed panel of depth `d0 .. d0 + kp` and
    /// columns `j0 .. j0 + nc`: packs [`KC`] of its depth at a time and runs the kernel on
    /// each strip. With no depth (`k == 0`), writes the start values.
    ///
    /// # Safety
    ///
    /// As [`Product::run`]'s, for the sliver's rows and the panel's columns of `c`, which no
    /// other task touches; `panel` holds `nc.div_ceil(NR)` strips of `kp x NR`.
    #[allow(clippy::too_many_arguments)] // a sliver's place in the product, its buffers
    unsafe fn sliver(
        &self,
        s: usize,
        panel: &[f32],
        d0: usize,
        kp: usize,
        j0: usize,
        nc: usize,
        out: Out,
        c_rs: usize,
        kernel: Kernels,
        buffers: &mut Buffers,
    ) {
        let i0 = s * MR;
        let mr = MR.min(self.m - i0);
        let strips = nc.div_ceil(NR);
        let tile = |t: usize| {
            let (j, nr) = (j0 + t * NR, NR.min(nc - t * NR));
            // SAFETY: element `(i0, j)` is in the output (caller).
            (unsafe { out.get().add(i0 * c_rs + j) }, j, nr)
        };
        if kp == 0 {
            for t in 0..strips {
                let (c, j, nr) = tile(t);
                // SAFETY: the tile is the sliver's and the strip's (caller).
                unsafe {
                    self.write_start(c, c_rs, i0, mr, j, nr);
                    if self.relu {
                        for i in 0..mr {
                            let row = std::slice::from_raw_parts_mut(c.add(i * c_rs), nr);
                            row.iter_mut()
                                .for_each(|v| *v = if *v > 0.0 { *v } else { 0.0 });
                        }
                    }
                }
            }
            return;
        }
        // Each row's layer-norm moments, over the whole row.
        let mut moments = [(0.0f32, 0.0f32); MR];
        if let Prologue::LayerNorm { .. } = self.prologue {
            for (i, moment) in moments.iter_mut().enumerate().take(mr) {
                let row = &self.a.data[(i0 + i) * self.a.rs..][..self.k];
                *moment = layernorm::moments(row);
            }
        }
        let Buffers { sliver: a, rows } = buffers;
        for p0 in (0..kp).step_by(KC) {
            let kc = KC.min(kp - p0);
            let into = (&mut a.0, &mut *rows);
            self.pack_sliver(i0, mr, d0 + p0, kc, &moments, into, kernel.interleave);
            let begins = d0 == 0 && p0 == 0;
            let relu = self.relu && d0 + p0 + kc == self.k;
            for t in 0..strips {
                let (c, j, nr) = tile(t);
                let b = &panel[t * kp * NR + p0 * NR..][..kc * NR];
                // SAFETY: the tile's elements are the sliver's and the strip's (caller); the
                // first depth block starts from the start values, later ones from the sums
                // in `c`; the sliver and the strip hold `kc` of depth.
                unsafe { self.tile(kernel, kc, &a.0, b, c, c_rs, i0, mr, j, nr, begins, relu) };
            }
        }
    }

    /// One tile: rows `i0 .. i0 + mr` and columns `j .. j + nr` (at `c`), summed over `kc`
    /// of depth from the start values (`begins`) or from the sums in `c`; a whole tile in
    /// place, an edge through a whole one on the stack.
    ///
    /// # Safety
    ///
    /// The tile's elements are in the output and the caller's alone, initialised unless
    /// `begins`; `a` and `b` hold `kc` of depth.
    #[allow(clippy::too_many_arguments)] // a tile's place, operands and mode
    #[inline(always)]
    unsafe fn tile(
        &self,
        kernel: Kernels,
        kc: usize,
        a: &[f32; MR * KC],
        b: &[f32],
        c: *mut f32,
        c_rs: usize,
        i0: usize,
        mr: usize,
        j: usize,
        nr: usize,
        begins: bool,
        relu: bool,
    ) {
        // SAFETY: the caller's contract, and the stack tile is a whole `MR x NR`.
        unsafe {
            if mr == MR && nr == NR {
                let init = if begins {
                    self.init(i0, j, c, c_rs)
                } else {
                    Init {
                        from: c,
                        rs: c_rs,
                        bias: std::ptr::null(),
                    }
                };
                (kernel.tile)(kc, a.as_ptr(), b.as_ptr(), c, c_rs, init, relu);
            } else {
                let mut tile = Tile([0.0; MR * NR]);
                let (t, rs) = (tile.0.as_mut_ptr(), NR);
                if begins && !matches!(self.start, Start::Output) {
                    self.write_start(t, rs, i0, mr, j, nr);
                } else {
                    for i in 0..mr {
                        std::ptr::copy_nonoverlapping(c.add(i * c_rs), t.add(i * rs), nr);
                    }
                }
                let init = Init {
                    from: t,
                    rs,
                    bias: std::ptr::null(),
                };
                (kernel.tile)(kc, a.as_ptr(), b.as_ptr(), t, rs, init, relu);
                for i in 0..mr {
                    std::ptr::copy_nonoverlapping(t.add(i * rs), c.add(i * c_rs), nr);
                }
            }
        }
    }

    /// Where the sums of the whole tile at rows `i0 ..`, columns `j ..` (at `c`) start.
    fn init(&self, i0: usize, j: usize, c: *mut f32, c_rs: usize) -> Init {
        let null = std::ptr::null();
        match self.start {
            Start::Zero => Init {
                from: null,
                rs: 0,
                bias: null,
            },
            Start::Output => Init {
                from: c,
                rs: c_rs,
                bias: null,
            },
            Start::Bias(bias) => Init {
                from: bias[j..].as_ptr(),
                rs: 0,
                bias: null,
            },
            Start::Residual { bias, residual } => Init {
                from: residual[i0 * self.n + j..].as_ptr(),
                rs: self.n,
                bias: bias[j..].as_ptr(),
            },
        }
    }

    /// Writes the start values of the tile at rows `i0 .. i0 + mr`, columns `j .. j + nr`
    /// (nothing for [`Start::Output`]).
    ///
    /// # Safety
    ///
    /// `c` points at element `(i0, j)` of the output; the tile's elements are valid for
    /// writes and no other reference reaches them.
    unsafe fn write_start(
        &self,
        c: *mut f32,
        c_rs: usize,
        i0: usize,
        mr: usize,
        j: usize,
        nr: usize,
    ) {
        // The output may be uninitialised (a `MaybeUninit` one): it is only written here,
        // through the pointer, never made a reference.
        let write = |i: usize, values: &mut dyn Iterator<Item = f32>| {
            // SAFETY: row `i < mr` of the tile lies in the output, is the caller's alone and
            // valid for writes of its `nr` elements (the caller's contract).
            let row = unsafe { c.add(i * c_rs) };
            for (x, value) in values.take(nr).enumerate() {
                // SAFETY: as above, element `x < nr` of the row.
                unsafe { row.add(x).write(value) };
            }
        };
        match self.start {
            Start::Output => {}
            Start::Zero => (0..mr).for_each(|i| write(i, &mut std::iter::repeat(0.0))),
            Start::Bias(bias) => {
                (0..mr).for_each(|i| write(i, &mut bias[j..j + nr].iter().copied()))
            }
            Start::Residual { bias, residual } => {
                let bias = &bias[j..j + nr];
                for i in 0..mr {
                    let res = &residual[(i0 + i) * self.n + j..][..nr];
                    write(i, &mut res.iter().zip(bias).map(|(&r, &b)| r + b));
                }
            }
        }
    }

    /// Packs rows `i0 .. i0 + mr` and depth `p0 .. p0 + kc` of `a`, through the prologue
    /// (into `prepared` first), into `sliver` (`MR` per depth step; rows past `mr` are
    /// zeros). Neither is read before it is written here.
    #[allow(clippy::too_many_arguments)] // a sliver's place, the rows' moments, the kernel
    fn pack_sliver(
        &self,
        i0: usize,
        mr: usize,
        p0: usize,
        kc: usize,
        moments: &[(f32, f32); MR],
        (sliver, prepared): (&mut [f32; MR * KC], &mut Rows),
        interleave: Interleave,
    ) {
        if mr < MR {
            sliver[..kc * MR].fill(0.0);
        }
        let a = self.a;
        match self.prologue {
            Prologue::Identity if a.cs != 1 && a.rs == 1 => {
                // Columns of `a` are contiguous: a depth step's rows side by side.
                for p in 0..kc {
                    let column = &a.data[(p0 + p) * a.cs + i0..][..mr];
                    match (
                        <&[f32; MR]>::try_from(column),
                        <&mut [f32; MR]>::try_from(&mut sliver[p * MR..][..mr]),
                    ) {
                        (Ok(from), Ok(to)) => *to = *from,
                        _ => sliver[p * MR..][..mr].copy_from_slice(column),
                    }
                }
            }
            Prologue::Identity if a.cs != 1 => {
                for i in 0..mr {
                    for p in 0..kc {
                        sliver[p * MR + i] = a.at(i0 + i, p0 + p);
                    }
                }
            }
            Prologue::Identity => {
                let rows: [&[f32]; MR] = std::array::from_fn(|i| {
                    if i < mr {
                        &a.data[(i0 + i) * a.rs + p0..][..kc]
                    } else {
                        &[]
                    }
                });
                interleave_rows(&rows, mr, kc, sliver, interleave);
            }
            prologue => {
                for (i, (row, &(mean, rstd))) in
                    prepared.0.iter_mut().zip(moments).enumerate().take(mr)
                {
                    let from = &a.data[(i0 + i) * a.rs + p0..][..kc];
                    let row = &mut row[..kc];
                    match prologue {
                        Prologue::Identity => row.copy_from_slice(from),
                        Prologue::Gelu => gelu_into(from, row),
                        Prologue::LayerNorm { weight, bias } => layernorm::normalize_part(
                            from,
                            &weight[p0..p0 + kc],
                            &bias[p0..p0 + kc],
                            mean,
                            rstd,
                            row,
                        ),
                    }
                }
                let rows: [&[f32]; MR] = std::array::from_fn(|i| &prepared.0[i][..kc]);
                interleave_rows(&rows, mr, kc, sliver, interleave);
            }
        }
    }
}

/// Writes `kc` elements of each of the first `mr` rows side by side into `sliver`: element
/// `p` of row `i` at `p * MR + i` (rows past `mr` are left as they are).
fn interleave_rows(
    rows: &[&[f32]; MR],
    mr: usize,
    kc: usize,
    sliver: &mut [f32; MR * KC],
    interleave: Interleave,
) {
    if mr == MR && rows.iter().all(|row| row.len() >= kc) && kc <= KC {
        // SAFETY: every row holds `kc` elements, `kc <= KC` (checked), and `interleave` was
        // chosen for this processor.
        unsafe { interleave(rows, kc, sliver) };
    } else {
        for (i, row) in rows.iter().enumerate().take(mr) {
            for (p, &v) in row[..kc].iter().enumerate() {
                sliver[p * MR + i] = v;
            }
        }
    }
}

/// [`Interleave`] in plain Rust.
///
/// # Safety
///
/// See [`Interleave`] (bounds are checked here too).
unsafe fn interleave_portable(rows: &[&[f32]; MR], kc: usize, sliver: &mut [f32; MR * KC]) {
    let rows: [&[f32]; MR] = std::array::from_fn(|i| &rows[i][..kc]);
    for (p, step) in sliver[..kc * MR].chunks_exact_mut(MR).enumerate() {
        for (to, row) in step.iter_mut().zip(&rows) {
            *to = row[p];
        }
    }
}

/// [`Interleave`] with AVX-512: 16 depth steps at a time, the rows transposed in registers.
///
/// # Safety
///
/// See [`Interleave`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn interleave_avx512(rows: &[&[f32]; MR], kc: usize, sliver: &mut [f32; MR * KC]) {
    use std::arch::x86_64::*;
    let whole = kc / 16 * 16;
    for p0 in (0..whole).step_by(16) {
        let mut r = [_mm512_setzero_ps(); 16];
        for (r, row) in r.iter_mut().zip(rows) {
            // SAFETY: `p0 + 16 <= kc <= row.len()` (caller).
            *r = unsafe { _mm512_loadu_ps(row[p0..p0 + 16].as_ptr()) };
        }
        transpose(&mut r);
        for (p, r) in r.iter().enumerate() {
            let to = &mut sliver[(p0 + p) * MR..][..MR];
            // SAFETY: the mask writes the first `MR` (12) lanes, all inside `to`.
            unsafe { _mm512_mask_storeu_ps(to.as_mut_ptr(), (1 << MR) - 1, *r) };
        }
    }
    for p in whole..kc {
        for (i, row) in rows.iter().enumerate() {
            sliver[p * MR + i] = row[p];
        }
    }
}

/// Transposes 16 vectors of 16: afterwards `r[j]` holds element `j` of each, in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let (pd, ps) = (_mm512_castps_pd, _mm512_castpd_ps);
    for b in (0..16).step_by(4) {
        r[b] = ps(_mm512_unpacklo_pd(pd(t[b]), pd(t[b + 2])));
        r[b + 1] = ps(_mm512_unpackhi_pd(pd(t[b]), pd(t[b + 2])));
        r[b + 2] = ps(_mm512_unpacklo_pd(pd(t[b + 1]), pd(t[b + 3])));
        r[b + 3] = ps(_mm512_unpackhi_pd(pd(t[b + 1]), pd(t[b + 3])));
    }
    for b in [0, 8] {
        for j in 0..4 {
            t[b + j] = _mm512_shuffle_f32x4::<0x88>(r[b + j], r[b + 4 + j]);
            t[b + 4 + j] = _mm512_shuffle_f32x4::<0xdd>(r[b + j], r[b + 4 + j]);
        }
    }
    for j in 0..8 {
        r[j] = _mm512_shuffle_f32x4::<0x88>(t[j], t[8 + j]);
        r[8 + j] = _mm512_shuffle_f32x4::<0xdd>(t[j], t[8 + j]);
    }
}

/// `to = from` (as long as `to`), a strip's worth inline.
#[inline(always)]
fn copy(from: &[f32], to: &mut [f32]) {
    match (
        <&[f32; NR]>::try_from(from),
        <&mut [f32; NR]>::try_from(&mut *to),
    ) {
        (Ok(from), Ok(to)) => *to = *from,
        _ => to.copy_from_slice(&from[..to.len()]),
    }
}

/// The rows of a sliver after their prologue, on a task's stack.
#[repr(C, align(64))]
struct Rows([[f32; KC]; MR]);

/// A task's buffers for its slivers (on its stack, made once for every sliver it runs): the
/// packed sliver and its rows after their prologue.
struct Buffers {
    sliver: Sliver,
    rows: Rows,
}

impl Buffers {
    fn new() -> Self {
        Self {
            sliver: Sliver([0.0; MR * KC]),
            rows: Rows([[0.0; KC]; MR]),
        }
    }
}

/// The panel buffers the products share, kept between calls: one while products run one at
/// a time (a product takes it and gives it back), grown to the largest panel the run packs;
/// a product running beside another (inside its task, or on another thread) takes one more.
static PANEL: Stash = Stash::new();

/// A sliver of `a` on a task's stack, aligned for the kernels' broadcasts.
#[repr(C, align(64))]
struct Sliver([f32; MR * KC]);

/// A register tile's worth of output on a task's stack.
#[repr(C, align(64))]
struct Tile([f32; MR * NR]);

/// Packs depth `d0 .. d0 + kp` and columns `j0 .. j0 + nc` of `b` into `panel`: strip `t`
/// (columns `j0 + t * NR ..`) is `kp` rows of `NR`, columns past `nc` zeros. Blocks of the
/// depth are packed on `threads` threads, each reading its rows of `b` in order.
fn pack_panel(
    b: Mat<'_>,
    d0: usize,
    kp: usize,
    j0: usize,
    nc: usize,
    panel: &mut [f32],
    threads: usize,
) {
    /// Depth steps per task.
    const STEPS: usize = 64;
    let strips = nc.div_ceil(NR);
    let last = nc - (strips - 1) * NR;
    let to = Out(panel.as_mut_ptr());
    let len = panel.len();
    let block = |first: usize| {
        let steps = first..STEPS.min(kp - first) + first;
        for p in steps {
            for t in 0..strips {
                let (j, nr) = (j0 + t * NR, if t + 1 == strips { last } else { NR });
                let at = t * kp * NR + p * NR;
                assert!(at + NR <= len, "a panel too short for its strips");
                // SAFETY: `at .. at + NR` is inside the panel (asserted) and is depth step
                // `p` of strip `t`, which only this task (it owns the step) writes.
                let to = unsafe { std::slice::from_raw_parts_mut(to.get().add(at), NR) };
                if b.cs == 1 {
                    copy(&b.data[(d0 + p) * b.rs + j..][..nr], &mut to[..nr]);
                } else {
                    for (x, to) in to[..nr].iter_mut().enumerate() {
                        *to = b.at(d0 + p, j + x);
                    }
                }
                to[nr..].fill(0.0);
            }
        }
    };
    let blocks = kp.div_ceil(STEPS);
    if threads > 1 && blocks > 1 {
        (0..blocks).into_par_iter().for_each(|b| block(b * STEPS));
    } else {
        (0..blocks).for_each(|b| block(b * STEPS));
    }
}

/// The best kernels this processor runs.
fn choose_kernels() -> Kernels {
    #[cfg(target_arch = "x86_64")]
    {
        if super::simd::has_avx512() {
            return Kernels {
                tile: avx512,
                interleave: interleave_avx512,
            };
        }
        if super::simd::has_avx2() {
            return Kernels {
                tile: avx2,
                interleave: interleave_portable,
            };
        }
    }
    Kernels {
        tile: portable,
        interleave: interleave_portable,
    }
}

/// The start of element `(i, x)` of a tile.
///
/// # Safety
///
/// `init`'s pointers are null or valid for reads of the element (see [`Kernel`]).
#[inline(always)]
unsafe fn start_of(init: Init, i: usize, x: usize) -> f32 {
    // SAFETY: caller.
    unsafe {
        let from = if init.from.is_null() {
            0.0
        } else {
            *init.from.add(i * init.rs + x)
        };
        if init.bias.is_null() {
            from
        } else {
            from + *init.bias.add(x)
        }
    }
}

/// The kernel in plain Rust: `f32::mul_add` is the same fused multiply-add.
///
/// # Safety
///
/// See [`Kernel`].
unsafe fn portable(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    c_rs: usize,
    init: Init,
    relu: bool,
) {
    // SAFETY: the operands hold `kc` depth steps (caller).
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, kc * MR),
            std::slice::from_raw_parts(b, kc * NR),
        )
    };
    let mut tile = [[0.0f32; NR]; MR];
    for (i, row) in tile.iter_mut().enumerate() {
        for (x, acc) in row.iter_mut().enumerate() {
            // SAFETY: the element is in the tile `init` reaches (caller).
            let mut sum = unsafe { start_of(init, i, x) };
            for p in 0..kc {
                sum = a[p * MR + i].mul_add(b[p * NR + x], sum);
            }
            // As the vector kernels' `max`: zero for NaN and for either zero.
            *acc = if !relu || sum > 0.0 { sum } else { 0.0 };
        }
    }
    for (i, row) in tile.iter().enumerate() {
        // SAFETY: row `i` of the tile is the caller's to write (read above only through
        // `init`, before this write).
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), c.add(i * c_rs), NR) };
    }
}

/// The AVX-512 kernel: the tile in 24 registers, two vectors of the strip and one
/// broadcast of the sliver a depth step.
///
/// # Safety
///
/// See [`Kernel`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn avx512(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    c_rs: usize,
    init: Init,
    relu: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // SAFETY: `init`'s pointers reach the tile's rows (or the bias row) when not null.
    unsafe {
        if !init.from.is_null() {
            for (i, row) in acc.iter_mut().enumerate() {
                let from = init.from.add(i * init.rs);
                *row = [_mm512_loadu_ps(from), _mm512_loadu_ps(from.add(16))];
            }
        }
        if !init.bias.is_null() {
            let bias = [
                _mm512_loadu_ps(init.bias),
                _mm512_loadu_ps(init.bias.add(16)),
            ];
            for row in acc.iter_mut() {
                *row = [
                    _mm512_add_ps(row[0], bias[0]),
                    _mm512_add_ps(row[1], bias[1]),
                ];
            }
        }
    }
    for p in 0..kc {
        // SAFETY: depth step `p < kc` of the strip and the sliver (caller).
        unsafe {
            let b0 = _mm512_loadu_ps(b.add(p * NR));
            let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
            for (i, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(p * MR + i));
                row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                row[1] = _mm512_fmadd_ps(x, b1, row[1]);
            }
        }
    }
    let zero = _mm512_setzero_ps();
    for (i, row) in acc.iter().enumerate() {
        let row = if relu {
            [_mm512_max_ps(row[0], zero), _mm512_max_ps(row[1], zero)]
        } else {
            *row
        };
        // SAFETY: row `i` of the tile is the caller's to write.
        unsafe {
            let to = c.add(i * c_rs);
            _mm512_storeu_ps(to, row[0]);
            _mm512_storeu_ps(to.add(16), row[1]);
        }
    }
}

/// The AVX2 kernel: the tile a quarter (6 rows x 16 columns, 12 registers) at a time.
///
/// # Safety
///
/// See [`Kernel`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    c_rs: usize,
    init: Init,
    relu: bool,
) {
    use std::arch::x86_64::*;
    const ROWS: usize = MR / 2;
    // The quarters read their starts before any writes: with an output start `c` is
    // `init.from`, and a quarter's writes must not reach another quarter's starts first.
    let mut quarters = [[[_mm256_setzero_ps(); 2]; ROWS]; 4];
    for (q, (i0, x0)) in [(0, 0), (0, 16), (ROWS, 0), (ROWS, 16)]
        .into_iter()
        .enumerate()
    {
        let acc = &mut quarters[q];
        // SAFETY: `init`'s pointers reach the tile's rows (or the bias row) when not null.
        unsafe {
            if !init.from.is_null() {
                for (i, row) in acc.iter_mut().enumerate() {
                    let from = init.from.add((i0 + i) * init.rs + x0);
                    *row = [_mm256_loadu_ps(from), _mm256_loadu_ps(from.add(8))];
                }
            }
            if !init.bias.is_null() {
                let bias = init.bias.add(x0);
                let bias = [_mm256_loadu_ps(bias), _mm256_loadu_ps(bias.add(8))];
                for row in acc.iter_mut() {
                    *row = [
                        _mm256_add_ps(row[0], bias[0]),
                        _mm256_add_ps(row[1], bias[1]),
                    ];
                }
            }
        }
    }
    for (q, (i0, x0)) in [(0, 0), (0, 16), (ROWS, 0), (ROWS, 16)]
        .into_iter()
        .enumerate()
    {
        let mut acc = quarters[q];
        for p in 0..kc {
            // SAFETY: depth step `p < kc` of the strip and the sliver (caller).
            unsafe {
                let b0 = _mm256_loadu_ps(b.add(p * NR + x0));
                let b1 = _mm256_loadu_ps(b.add(p * NR + x0 + 8));
                for (i, row) in acc.iter_mut().enumerate() {
                    let x = _mm256_set1_ps(*a.add(p * MR + i0 + i));
                    row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(x, b1, row[1]);
                }
            }
        }
        let zero = _mm256_setzero_ps();
        for (i, row) in acc.iter().enumerate() {
            let row = if relu {
                [_mm256_max_ps(row[0], zero), _mm256_max_ps(row[1], zero)]
            } else {
                *row
            };
            // SAFETY: 16 elements of row `i0 + i` from column `x0` are the caller's to write.
            unsafe {
                let to = c.add((i0 + i) * c_rs + x0);
                _mm256_storeu_ps(to, row[0]);
                _mm256_storeu_ps(to.add(8), row[1]);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Elements whose low bits vary, so that a sum in another order rounds differently.
    pub(in crate::kernels) fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let x = i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 9;
                x as f32 / (1 << 23) as f32 - 0.5
            })
            .collect()
    }

    /// The definition: each element one chain of fused multiply-adds in depth order from its
    /// start, the prologue applied to each row of `a` first.
    fn definition(p: &Product<'_>, c: &[f32]) -> Vec<f32> {
        let (m, k, n) = (p.m, p.k, p.n);
        let mut prepared = vec![0.0; m * k];
        for i in 0..m {
            let row: Vec<f32> = (0..k).map(|x| p.a.at(i, x)).collect();
            let to = &mut prepared[i * k..][..k];
            match p.prologue {
                Prologue::Identity => to.copy_from_slice(&row),
                Prologue::Gelu => gelu_into(&row, to),
                Prologue::LayerNorm { weight, bias } => {
                    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the layer norm writes
                    // every element.
                    let out =
                        unsafe { &mut *(to as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
                    layernorm::normalize_rows(k, &row, weight, bias, out, None);
                }
            }
        }
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut sum = match p.start {
                    Start::Zero => 0.0,
                    Start::Output => c[i * n + j],
                    Start::Bias(bias) => bias[j],
                    Start::Residual { bias, residual } => residual[i * n + j] + bias[j],
                };
                for x in 0..k {
                    sum = prepared[i * k + x].mul_add(p.b.at(x, j), sum);
                }
                out[i * n + j] = if !p.relu || sum > 0.0 { sum } else { 0.0 };
            }
        }
        out
    }

    /// The kernels this processor runs, each alone.
    fn every_kernel() -> Vec<(&'static str, Kernels)> {
        let mut kernels = vec![(
            "portable",
            Kernels {
                tile: portable,
                interleave: interleave_portable,
            },
        )];
        #[cfg(target_arch = "x86_64")]
        {
            if super::super::simd::has_avx2() {
                let interleave = interleave_portable;
                kernels.push((
                    "avx2",
                    Kernels {
                        tile: avx2,
                        interleave,
                    },
                ));
            }
            if super::super::simd::has_avx512() {
                let interleave = interleave_avx512;
                kernels.push((
                    "avx512",
                    Kernels {
                        tile: avx512,
                        interleave,
                    },
                ));
            }
        }
        kernels
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool")
    }

    /// Every kernel, at every thread count, gives the definition's bits: shapes with edge
    /// tiles, a depth across sliver and panel blocks, no depth, an output wider than a panel;
    /// every start, prologue and transposition; the ReLU.
    #[test]
    fn every_element_is_one_chain_of_fused_multiply_adds_whatever_the_kernel_and_threads() {
        let shapes = [
            (13, 7, 33),
            (25, KC + 3, 40),
            (12, KP + KC + 1, 32),
            (5, 0, 9),
            (30, 20, NC + 40),
        ];
        for (m, k, n) in shapes {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            // Rows of `a` 5 longer than the depth (a wider matrix's first columns).
            let padded = values(m * (k + 5), 8);
            let (bias, residual, before) = (values(n, 3), values(m * n, 4), values(m * n, 5));
            let (weight, shift) = (values(k, 6), values(k, 7));
            let row_major = (Mat::rows(&a, k), Mat::rows(&b, n));
            let transposed = (Mat::transposed(&a, m), Mat::transposed(&b, k));
            let strided = (Mat::strided(&a, 1, m), Mat::strided(&b, n, 1));
            let wider = (Mat::strided(&padded, k + 5, 1), Mat::rows(&b, n));
            let starts = [
                Start::Zero,
                Start::Output,
                Start::Bias(&bias),
                Start::Residual {
                    bias: &bias,
                    residual: &residual,
                },
            ];
            let prologues = [
                Prologue::Identity,
                Prologue::Gelu,
                Prologue::LayerNorm {
                    weight: &weight,
                    bias: &shift,
                },
            ];
            for (index, start) in starts.into_iter().enumerate() {
                let prologue = prologues[index % 3];
                for (a, b) in [row_major, transposed, strided, wider] {
                    if a.cs != 1 && !matches!(prologue, Prologue::Identity) {
                        continue; // a prologue takes rows
                    }
                    let product = Product {
                        m,
                        k,
                        n,
                        a,
                        prologue,
                        b,
                        start,
                        relu: index % 2 == 1,
                    };
                    let want = definition(&product, &before);
                    for (name, kernel) in every_kernel() {
                        for threads in [1, 2, 3, 8] {
                            let mut c = before.clone();
                            // SAFETY: `c` is the `m x n` output, ours alone; the kernels were
                            // chosen for this processor.
                            pool(threads).install(|| unsafe {
                                product.run_with(c.as_mut_ptr(), n, threads, kernel)
                            });
                            let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(
                                same,
                                "{name}, {threads} threads, {m}x{k}x{n}, start {index}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The output's columns past `n` in a wider matrix (a head's columns) are left alone.
    #[test]
    fn a_product_into_part_of_a_wider_output_writes_only_its_part() {
        let (m, k, n, wide) = (14, 9, 35, 50);
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let mut c = vec![7.0f32; m * wide];
        let product = Product {
            m,
            k,
            n,
            a: Mat::rows(&a, k),
            prologue: Prologue::Identity,
            b: Mat::rows(&b, n),
            start: Start::Zero,
            relu: false,
        };
        // SAFETY: rows of `wide` hold the `m x n` output, ours alone.
        unsafe { product.run(c.as_mut_ptr(), wide, 2) };
        let want = definition(&product, &vec![0.0; m * n]);
        for i in 0..m {
            assert_eq!(&c[i * wide..][..n], &want[i * n..][..n]);
            assert!(c[i * wide + n..][..wide - n].iter().all(|&v| v == 7.0));
        }
    }

    /// Rows that would overlap (a row stride below the columns) are refused: the threads
    /// write rows at once.
    #[test]
    #[should_panic(expected = "overlap")]
    fn overlapping_output_rows_are_refused() {
        let (a, b) = (values(24, 1), values(32, 2));
        let mut c = vec![0.0f32; 32];
        let product = Product {
            m: 24,
            k: 1,
            n: 32,
            a: Mat::rows(&a, 1),
            prologue: Prologue::Identity,
            b: Mat::rows(&b, 32),
            start: Start::Zero,
            relu: false,
        };
        // SAFETY: refused before anything is written.
        unsafe { product.run(c.as_mut_ptr(), 0, 2) };
    }

    #[test]
    fn the_panel_is_at_most_kp_by_nc() {
        assert_eq!(panel_bytes(10, 33), 10 * 64 * 4);
        assert_eq!(panel_bytes(1 << 20, 50_257), (KP * NC * 4) as u64);
    }
}
