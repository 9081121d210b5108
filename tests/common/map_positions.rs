//! Index-map launches whose positions sit at and beside multiples of a stage size, from small
//! ones up to the 2^51 cap (`lower::MAX_MAP_POSITIONS`): the cases where the emitters'
//! division by a rounded reciprocal (`spelling::map_stage_positions`) needs its correction.
//! Shared by the C backend's test (tests/cpu_emit.rs) and the CUDA emulation's
//! (tests/cuda_emit.rs), with the expected elements computed here by integer arithmetic.

use fusebox::dtype::DType;
use fusebox::lower::ir::{Axis, Instr, KernelIr, Launch, MapStage, RowArithmetic, Store, View};

/// The first stage's inner size. `fl(1/49)` lies below `1/49` by enough that `49k · fl(1/49)`
/// rounds below `k` for many `k` (the estimate truncates to `k - 1` and the correction adds
/// one), unlike 3, 7 or 10.
pub const DIVISOR: i64 = 49;
/// The second stage's inner size, which brings the first stage's positions down to an
/// element of a small buffer.
pub const SECOND: i64 = 1000;
/// Columns of the domain: positions `49k - 1`, `49k`, `49k + 1` in each row.
pub const COLUMNS: i64 = 3;

/// `y[r, c] = x[e]`, `x` read through two stages: the first `[a, 49]` with strides `[1, 1]`
/// (so its output position `q / 49 + q % 49` changes if the quotient or the remainder is
/// off), the second `[b, 1000]` with strides `[0, 1]` (the element is that position modulo
/// 1000; an error of ±48 in it shows).
pub fn kernel() -> KernelIr {
    let mut x = View::strided(DType::F32, vec![Axis::Strided, Axis::Strided]);
    x.stages = vec![2, 2];
    let ir = KernelIr {
        rank: 2,
        row_arithmetic: RowArithmetic::default(),
        loads: vec![x],
        body: vec![
            Instr::Load { view: 0 },
            Instr::Round {
                x: 0,
                dtype: DType::F32,
            },
        ],
        stores: vec![Store::new(
            1,
            View::strided(DType::F32, vec![Axis::Strided, Axis::Unit]),
        )],
        reductions: Vec::new(),
    };
    assert_eq!(ir.verify(), Ok(()));
    ir
}

/// The launch of [`kernel`] over `rows` rows whose row `r` reads positions
/// `49 · (first + r · step) + {-1, 0, 1}`.
pub fn launch(rows: i64, first: i64, step: i64) -> Launch {
    let last = DIVISOR * (first + (rows - 1) * step) + 1;
    assert!(last < fusebox::lower::MAX_MAP_POSITIONS);
    let second = last / DIVISOR + DIVISOR;
    Launch {
        sizes: vec![rows, COLUMNS],
        strides: vec![vec![DIVISOR * step, 1], vec![COLUMNS, 1]],
        offsets: vec![DIVISOR * first - 1, 0],
        ranges: Vec::new(),
        gathers: Vec::new(),
        maps: vec![vec![
            MapStage {
                offset: 0,
                sizes: vec![last / DIVISOR + 1, DIVISOR],
                strides: vec![1, 1],
            },
            MapStage {
                offset: 0,
                sizes: vec![second / SECOND + 1, SECOND],
                strides: vec![0, 1],
            },
        ]],
    }
}

/// The launches the tests run: small positions (within 32-bit indexing), and 64 rows spread
/// from 48 up to just below 2^51.
pub fn launches() -> [(Launch, bool); 2] {
    let step = ((fusebox::lower::MAX_MAP_POSITIONS - 2) / DIVISOR - 1) / 63;
    [(launch(64, 1, 1), true), (launch(64, 1, step), false)]
}

/// The position `launch` reads at row `r`, column `c`.
pub fn position(launch: &Launch, r: i64, c: i64) -> i64 {
    launch.offsets[0] + r * launch.strides[0][0] + c
}

/// The element of `x` (of [`SECOND`] elements) read at position `q`, by integer arithmetic.
pub fn element(q: i64) -> i64 {
    (q / DIVISOR + q % DIVISOR) % SECOND
}

/// How many of `launch`'s positions the reciprocal estimate alone gets wrong (truncating
/// `q · fl(1/49)` gives a quotient other than `q / 49`): the cases the correction fixes.
pub fn corrected(launch: &Launch) -> usize {
    let reciprocal = 1.0 / DIVISOR as f64;
    (0..launch.sizes[0])
        .flat_map(|r| (0..COLUMNS).map(move |c| (r, c)))
        .map(|(r, c)| position(launch, r, c))
        .filter(|&q| (q as f64 * reciprocal) as i64 != q / DIVISOR)
        .count()
}
