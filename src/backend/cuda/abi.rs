//! The launch ABI of generated CUDA kernels: which entry points run, with what grid, and the
//! bytes of their one parameter.
//!
//! Everything here is plain Rust arithmetic on a [`KernelIr`] and a [`Launch`], so it is
//! tested without a GPU. The emitter ([`super::emit`]) reads the same functions (vector width,
//! reduction groups, entry names, parameter layout), so the kernel text and the host side of
//! a launch cannot disagree.
//!
//! # Entry points
//!
//! Every entry point exists twice, `<name><part>_i32` and `<name><part>_i64`: the same template
//! body instantiated with 32- or 64-bit index arithmetic. 32-bit integer division and
//! multiplication are several times cheaper on a GPU, and a kernel's coordinates are divided
//! by run-time sizes for every element; [`needs_i64`] picks the wide variant only when some
//! count or element offset of the launch does not fit in an `int`.
//!
//! - A kernel without reductions has one part, `""`: a grid-stride loop over the domain.
//! - A [row kernel](crate::lower::ir) also has the one part `""`, launched with one block per
//!   row (grid-stride over rows when there are more rows than the grid has blocks),
//!   [`row_block`] threads and [`row_shared_bytes`] of dynamic shared memory, chosen from the
//!   row length at launch, and takes the [`RowPath`] its `vec` word says.
//! - A kernel with reductions runs `_init` (scratch accumulators set to the identity; not in
//!   deterministic mode), then `_g0`, `_g1`, … (one pass per [reduction group](reduction_groups),
//!   the first one also writing every pointwise store), then `_finish` (means divided, results
//!   rounded to their dtype and stored).
//!
//! # The parameter block
//!
//! Each entry point takes one by-value parameter, a struct of 8-byte fields (so there is no
//! padding and the layout is the field order), laid out by [`ParamLayout`]:
//!
//! | field            | count           | meaning |
//! |------------------|-----------------|---------|
//! | `p{a}`           | one per view    | device pointer of argument `a` ([`KernelIr::views`] order) |
//! | `q{r}`           | one per reduction | device pointer of reduction `r`'s scratch (f64, or i64 for an integer output) |
//! | `n[rank]`        | rank            | domain sizes, after [folding](fold) |
//! | `s[args][rank]`  | args × rank     | strides in elements (read only on `Strided` axes) |
//! | `o[args]`        | args            | element offsets of domain point 0 |
//! | `m[words]`       | index-map words | every index map's stages ([`Launch::map_words`]) |
//! | `vec`            | 1               | 1 when the vectorized path may run ([`vector_ok`]); a row kernel's [`RowPath`] |
//! | `lanes[groups]`  | groups          | threads cooperating on one output, per group |
//! | `split[groups]`  | groups          | pieces each output's reduced elements are cut into |
//! | `r[2·ranges + 2·gathers]` | 2 × (ranges + gathers) | start and end of each range a concat read in place uses ([`Launch::ranges`]), then stride and extent of each gather ([`Launch::gathers`]) |
//!
//! Arrays of length zero are left out (C has none), so a pointwise kernel has no `lanes` or
//! `split`. Sizes are the launch's after [`fold`]: the host folds contiguous axes when it
//! writes the block, once per launch, rather than every thread doing it.
//!
//! The block is `8 × (2·args + reductions + rank·(args + 1) + words + 1 + 2·groups)` bytes: a kernel
//! at the fusion budget's 64 arguments, without reductions, stays under the classic 4 KiB
//! kernel-parameter limit up to rank 5; a bigger block needs CUDA 12.1's 32 KiB limit (driver
//! 12.1 or newer, Volta or newer).
//!
//! Scratch needs no initialisation by the runtime: `_init` sets it (atomic mode), or every
//! slot is written by the pass before `_finish` reads it (deterministic mode), so one set of
//! scratch buffers can serve every kernel queued on a stream.

use crate::backend::cuda::emit::EmitOptions;
use crate::lower::ir::{Axis, Instr, KernelIr, Launch};

/// Threads per block for every entry point. Fixed, because the block reduction's shared
/// memory and the `__launch_bounds__` of every entry are sized for it.
pub const BLOCK: u32 = 256;

/// Threads in a warp.
pub const WARP: i64 = 32;

/// Elements each thread of a row kernel's block handles per pass before the block grows,
/// when the kernel keeps nothing of the row in registers (see [`row_block`]).
pub const ROW_ELEMS_PER_THREAD: i64 = 4;

/// Bytes of a row's cached loads each thread of a row kernel aims to hold in registers: the
/// register cache's slots per thread ([`row_slots`]) are this over the bytes one element of
/// every cached load takes, so the cache costs about 16 registers whatever the dtypes.
pub const ROW_REGISTER_BYTES: usize = 64;

/// Most slots of the register cache per thread: 16 floats a thread and 256 threads hold a
/// row of 4096 f32 elements.
pub const ROW_MAX_SLOTS: usize = 16;

/// Static shared memory a row kernel may declare for its block-wide combinations: `smem` and
/// `smemi`, one `double` or `long long` per warp of a full block each.
pub const ROW_COMBINE_BYTES: i64 = 2 * (BLOCK as i64 / WARP) * 8;

/// Dynamic shared memory a row kernel may ask for to cache a row too long for registers:
/// what is left for it of the 48 KiB every CUDA device grants a block without an opt-in
/// attribute, so the launch needs nothing beyond its shared-memory size. The 48 KiB hold the
/// static arrays too ([`ROW_COMBINE_BYTES`]): a launch asking for all 48 KiB dynamically
/// fails with `CUDA_ERROR_INVALID_VALUE` (seen on an H200 with three cached f32 rows of 4096).
pub const ROW_SHARED_BYTES: i64 = 48 * 1024 - ROW_COMBINE_BYTES;

/// How a row kernel's block holds each row between its passes, chosen per launch by
/// [`row_path`] and handed to the kernel in the parameter block's `vec` word (the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowPath {
    /// Every pass reads the row's loads from global memory again (L1/L2 after the first).
    Reread = 0,
    /// The first pass that reads a cached load copies it into dynamic shared memory, and the
    /// later passes read it there.
    Shared = 1,
    /// The row's cached loads are read once into registers, [`row_slots`] per thread, element
    /// by element (thread `t`'s slot `s` holds element `s * threads + t`).
    Registers = 2,
    /// As `Registers`, with 16-byte loads and stores of the views contiguous along the row:
    /// thread `t`'s slots `g * W .. (g + 1) * W` hold elements `(g * threads + t) * W + l`.
    RegistersVector = 3,
}

/// Load views of a row kernel worth caching: those read in two or more passes over the row
/// (a load read once gains nothing from being kept), moving along the row (a per-row scalar
/// is one element), not read through an index map (whose positions are computed per
/// element anyway) nor at a gather's run-time index (its row lies wherever the index puts
/// it; the element is read where the gather needs it). An operand of a concat read along the row is cached too: the caches'
/// loads of it are guarded by its range like its other reads, and hold 0 outside it (see
/// `emit::rows`). In load order.
pub fn row_cached(ir: &KernelIr) -> Vec<usize> {
    if !ir.is_row_kernel() {
        return Vec::new();
    }
    let inner = ir.rank.saturating_sub(1);
    let mut gathered = vec![false; ir.loads.len()];
    for instr in &ir.body {
        if let Instr::GatherLoad { view, .. } = instr {
            gathered[*view] = true;
        }
    }
    let mut passes_reading = vec![0usize; ir.loads.len()];
    for pass in 0..ir.passes() {
        for (view, reads) in row_pass_loads(ir, pass).into_iter().enumerate() {
            passes_reading[view] += usize::from(reads);
        }
    }
    (0..ir.loads.len())
        .filter(|&view| {
            let v = &ir.loads[view];
            passes_reading[view] >= 2
                && v.axes[inner] != Axis::Broadcast
                && !v.is_mapped()
                && !gathered[view]
        })
        .collect()
}

/// Per load view, whether pass `pass` of row kernel `ir` reads it per element: the loads
/// its accumulated row reductions (level `pass + 1`) and, in the last pass, its element
/// stores depend on, not looking through the row reductions it reads as constants.
pub fn row_pass_loads(ir: &KernelIr, pass: usize) -> Vec<bool> {
    ir.loads_met(&ir.row_pass_meets(pass, &[]))
}

/// Whether a row kernel can have a [`RowPath::RegistersVector`] path: it has a vector width.
/// A kernel reading a concat along its rows has one too; its launches take it only when
/// every segment is made of whole vectors ([`ranges_of_whole_vectors`]).
fn row_vector_ok(ir: &KernelIr) -> bool {
    // A gathered row's element is read at a run-time index, where no vector load reaches.
    row_vector_width(ir) > 1 && !ir.has_gathers()
}

/// Whether every launch range of a row kernel reading a concat along its rows starts and
/// ends on a multiple of `width` (always, for other kernels): a vector of `width`
/// neighbouring elements then lies wholly inside or outside each segment, so one guard per
/// vector decides whether its operand is loaded, and no vector load reads past an operand.
/// Feature blocks of 512 or 1024 joined along the rows qualify; a segment of 5 does not.
fn ranges_of_whole_vectors(ir: &KernelIr, launch: &Launch, width: usize) -> bool {
    let width = width as i64;
    !ir.selects_along_rows()
        || launch
            .ranges
            .iter()
            .all(|&(start, end)| start % width == 0 && end % width == 0)
}

/// Vector width of a row kernel's [`RowPath::RegistersVector`] path: as for a pointwise
/// kernel ([`vector_width`]), from the narrowest view contiguous along the row; 1 when no
/// view is.
pub fn row_vector_width(ir: &KernelIr) -> usize {
    unit_vector_width(ir)
}

/// Slots of a row kernel's register cache per thread, a compile-time constant of its text:
/// [`ROW_REGISTER_BYTES`] over the bytes of one element of every cached load, as a power of
/// two between the vector width (so a thread's slots are whole vectors) and
/// [`ROW_MAX_SLOTS`]. 0 when nothing is cached.
pub fn row_slots(ir: &KernelIr) -> usize {
    let cached = row_cached(ir);
    if cached.is_empty() {
        return 0;
    }
    let bytes: usize = cached.iter().map(|&v| ir.loads[v].dtype.size_bytes()).sum();
    let fit = (ROW_REGISTER_BYTES / bytes.max(1)).max(1);
    let pow2 = 1usize << (usize::BITS - 1 - fit.leading_zeros());
    pow2.clamp(4, ROW_MAX_SLOTS).max(row_vector_width(ir))
}

/// Threads of the block that runs each row of a row kernel whose rows have `len` elements:
/// the smallest power of two that gives every thread at most [`row_slots`] elements (or
/// [`ROW_ELEMS_PER_THREAD`] without a register cache), between one warp and [`BLOCK`].
///
/// Why by length, at launch: every pass ends in a block-wide combination (warp shuffles, then
/// shared memory and two barriers), a fixed cost per pass that only pays when each thread has
/// several elements to accumulate first, and a row that fits the register cache of fewer
/// threads is read once by them. A row of up to 16 × 32 f32 elements runs on one warp, whose
/// combination is shuffles alone; layernorm's 1024 takes 64 threads, softmax's 4096 the full
/// block of 256. Powers of two keep the warps whole, which the shuffles need. The choice is a
/// launch argument: the kernel reads `blockDim.x`, so its text (and the compile cache key)
/// does not depend on it.
pub fn row_block(ir: &KernelIr, len: i64) -> u32 {
    let per_thread = match row_slots(ir) {
        0 => ROW_ELEMS_PER_THREAD,
        slots => slots as i64,
    };
    let wanted = (len.max(0).saturating_add(per_thread - 1) / per_thread).max(WARP);
    let threads = u64::try_from(wanted)
        .unwrap_or(u64::MAX)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX);
    threads.min(u64::from(BLOCK)) as u32
}

/// Bytes of dynamic shared memory cache load `k` of [`row_cached`] starts at, for rows of
/// `len` elements: each cached load's row rounded up to 16 bytes, in order. The kernel forms
/// the same sums (`fbc_row_cache`), so the two cannot disagree.
fn row_shared_extent(ir: &KernelIr, len: i64) -> i128 {
    row_cached(ir)
        .iter()
        .map(|&v| {
            let bytes = i128::from(len.max(0)) * ir.loads[v].dtype.size_bytes() as i128;
            (bytes + 15) / 16 * 16
        })
        .sum()
}

/// The dynamic shared memory of a row kernel's launch for rows of `len` elements: the
/// cached loads' rows ([`RowPath::Shared`]) when the row is too long for the register cache
/// of a full block and they fit [`ROW_SHARED_BYTES`]; 0 otherwise.
pub fn row_shared_bytes(ir: &KernelIr, len: i64) -> u32 {
    let slots = row_slots(ir) as i64;
    if slots == 0 || len <= slots * i64::from(row_block(ir, len)) {
        return 0;
    }
    let extent = row_shared_extent(ir, len);
    if extent <= i128::from(ROW_SHARED_BYTES) {
        extent as u32
    } else {
        0
    }
}

/// The path a row kernel's launch takes (see [`RowPath`]) with folded sizes `n` and device
/// pointers `ptrs`: registers when the row fits [`row_slots`] per thread of [`row_block`],
/// with vectors when [`vector_ok`] holds at [`row_vector_width`]; else shared memory when
/// [`row_shared_bytes`] grants it; else re-reading.
pub fn row_path(ir: &KernelIr, launch: &Launch, n: &[i64], ptrs: &[u64]) -> RowPath {
    let len = n.get(ir.rank.saturating_sub(1)).copied().unwrap_or(0);
    let slots = row_slots(ir) as i64;
    if slots > 0 && len <= slots * i64::from(row_block(ir, len)) {
        let width = row_vector_width(ir);
        if row_vector_ok(ir)
            && vector_ok_at(ir, launch, n, ptrs, width)
            && ranges_of_whole_vectors(ir, launch, width)
        {
            RowPath::RegistersVector
        } else {
            RowPath::Registers
        }
    } else if row_shared_bytes(ir, len) > 0 {
        RowPath::Shared
    } else {
        RowPath::Reread
    }
}

/// The paths a row kernel's text has an entry point for, in [`RowPath`] order: re-reading
/// alone when nothing is cached, else re-reading, shared memory and registers, and vectors
/// too when the kernel has a vector width. [`row_path`] never picks a path outside these.
///
/// Why one entry point per path rather than one that branches on the `vec` word: the
/// compiler gives a kernel the registers of its hungriest branch, and every launch runs with
/// that many. The element-by-element register path needs about twice the registers of the
/// vector path (a guard and an address per slot), so with both in one kernel the vector path
/// ran at half the blocks per SM it needs (80 registers instead of 39 for softmax's `[4096,
/// 4096]` f32 under NVRTC for sm_90: 3 blocks of 256 threads per SM instead of 6).
pub fn row_paths(ir: &KernelIr) -> Vec<RowPath> {
    if row_cached(ir).is_empty() {
        return vec![RowPath::Reread];
    }
    let mut paths = vec![RowPath::Reread, RowPath::Shared, RowPath::Registers];
    if row_vector_ok(ir) {
        paths.push(RowPath::RegistersVector);
    }
    paths
}

/// Blocks of [`BLOCK`] threads per SM a row kernel's vector path is compiled for (the
/// minimum of its `__launch_bounds__`): six, which caps it at 40 registers a thread, the
/// 16 of the register cache ([`ROW_REGISTER_BYTES`]) and 24 for the rest. Left to itself
/// NVRTC gave layernorm's `[8192, 1024]` f32 vector path 64 registers; capped, it needs no
/// spill for 32-bit indices and ran 2–3% faster on an H200 (0.0230 against 0.0236 ms, two
/// alternations; softmax's, at 39, did not move). `None` for the other paths: the
/// element-by-element path needs its registers (capping it spills), and the shared and
/// re-reading paths use few.
pub fn row_min_blocks(path: RowPath) -> Option<u32> {
    (path == RowPath::RegistersVector).then_some(6)
}

/// The part of a row kernel's entry point names for `path` (see [`entry_name`]): `_p` and
/// the path's `vec` word.
pub fn row_part(path: RowPath) -> String {
    format!("_p{}", path as u32)
}

/// Upper bound on blocks per SM in one grid. Grid-stride loops make any grid correct; this
/// many keeps every SM busy (8 blocks of 256 threads fill an SM's 2048 thread slots, times
/// four waves to even out imbalance) without launching millions of blocks that each do a
/// handful of elements.
pub const BLOCKS_PER_SM: u32 = 32;

/// Threads a reduction pass aims to keep busy before it splits outputs' reduced elements
/// across several groups: about an H100/H200's resident thread count (132 SMs × 2048). It
/// depends on sizes only, never on the device, so results are the same on every GPU.
pub const TARGET_THREADS: i64 = 1 << 18;

/// How a launch of one kernel runs: entry points in order, each with its grid, and the
/// scratch buffers (f64 accumulators, one per reduction) the runtime must provide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    pub launches: Vec<GpuLaunch>,
    /// Bytes of scratch per reduction, in [`KernelIr::reductions`] order (at least 8 each, so
    /// no allocation is empty). Empty for kernels without reductions.
    pub scratch_bytes: Vec<usize>,
}

/// One kernel launch: entry point name, grid, block and dynamic shared memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLaunch {
    pub entry: String,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory: 0 but for a row kernel's [`RowPath::Shared`] launch (the block
    /// reductions use static shared memory).
    pub shared_bytes: u32,
    /// A row kernel's entry points by path, indexed by the `vec` word ([`RowPath`] value;
    /// empty where the text has none): the path depends on the device pointers' alignment,
    /// known only when a run's buffers are, so the runtime takes [`GpuLaunch::entry_for`]
    /// of the parameter block it launches with. `entry` is the one for 16-byte aligned
    /// pointers. Empty for every other kernel.
    pub by_path: Vec<String>,
}

impl GpuLaunch {
    /// The entry points this launch may take, indexed as [`GpuLaunch::pick`] answers: a row
    /// kernel's by path (empty where its text has none), else [`GpuLaunch::entry`] alone.
    pub fn entries(&self) -> &[String] {
        if self.by_path.is_empty() {
            std::slice::from_ref(&self.entry)
        } else {
            &self.by_path
        }
    }

    /// Which of [`GpuLaunch::entries`] a launch with parameter block words `words` takes:
    /// for a row kernel the path in the block's `vec` word (`vec_word` is its index,
    /// [`ParamLayout::vec`] / 8), else the one.
    pub fn pick(&self, words: &[u64], vec_word: usize) -> usize {
        if self.by_path.is_empty() {
            return 0;
        }
        words
            .get(vec_word)
            .and_then(|&path| usize::try_from(path).ok())
            .filter(|&i| self.by_path.get(i).is_some_and(|name| !name.is_empty()))
            .or_else(|| self.by_path.iter().position(|name| *name == self.entry))
            .unwrap_or(0)
    }

    /// The name of the entry point [`GpuLaunch::pick`] picks.
    pub fn entry_for(&self, words: &[u64], vec_word: usize) -> &str {
        &self.entries()[self.pick(words, vec_word)]
    }
}

/// The entry point of `part` (`""`, `"_init"`, `"_g{g}"`, `"_finish"`) of kernel `name`, with
/// 64-bit indexing when `wide`.
pub fn entry_name(name: &str, part: &str, wide: bool) -> String {
    format!("{name}{part}_{}", if wide { "i64" } else { "i32" })
}

/// Reductions that share one pass over the domain: those with equal `reduced` masks, grouped
/// in order of first appearance. A pass walks each output's reduced elements, so reductions
/// over different axes need different walks (the domain is read once per group).
pub fn reduction_groups(ir: &KernelIr) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (r, red) in ir.reductions.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|g| ir.reductions[g[0]].reduced == red.reduced)
        {
            Some(group) => group.push(r),
            None => groups.push(vec![r]),
        }
    }
    groups
}

/// Elements per thread in the vectorized path of a pointwise kernel: as many as make a
/// 16-byte access of the narrowest view that is contiguous along the innermost axis (8 for f16,
/// bf16 or bool, 4 for f32 or i32, 2 for 8-byte types), so every such view moves in whole
/// 16-byte chunks (bool in 8-byte ones). 1 means the kernel has no vectorized path: it has
/// reductions or row reductions (their passes are scalar) or no view with a `Unit` inner axis.
pub fn vector_width(ir: &KernelIr) -> usize {
    // A concat read in place picks its operand per element, by the element's coordinate.
    // A gather reads its element at a run-time index, which no vector of lanes holds.
    if !ir.reductions.is_empty() || ir.is_row_kernel() || ir.has_ranges() || ir.has_gathers() {
        return 1;
    }
    unit_vector_width(ir)
}

/// 16 bytes over the element size of the narrowest view contiguous along the innermost axis
/// (at least 2 bytes), or 1 when no view is.
fn unit_vector_width(ir: &KernelIr) -> usize {
    let inner = ir.rank.saturating_sub(1);
    ir.views()
        .filter(|v| v.axes.get(inner) == Some(&Axis::Unit))
        .map(|v| 16 / v.dtype.size_bytes().max(2))
        .max()
        .unwrap_or(1)
}

/// Bytes of one vector access of a view of `elem_bytes`-byte elements at vector `width`: the
/// whole run of `width` elements if it is at most 16 bytes, else 16 (the run is then moved as
/// several 16-byte chunks).
pub fn chunk_bytes(elem_bytes: usize, width: usize) -> usize {
    (elem_bytes * width).min(16)
}

/// Byte offsets of the fields of a kernel's parameter block (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamLayout {
    pub ptrs: usize,
    pub scratch: usize,
    pub sizes: usize,
    pub strides: usize,
    pub offsets: usize,
    /// Index-map stages (empty for a kernel without index maps).
    pub maps: usize,
    pub vec: usize,
    pub lanes: usize,
    pub split: usize,
    /// The ranges of concats read in place (start, end per range).
    pub ranges: usize,
    /// Size of the whole block.
    pub bytes: usize,
}

/// The layout of `ir`'s parameter block.
pub fn param_layout(ir: &KernelIr) -> ParamLayout {
    let args = ir.arg_count();
    let groups = reduction_groups(ir).len();
    let ptrs = 0;
    let scratch = ptrs + 8 * args;
    let sizes = scratch + 8 * ir.reductions.len();
    let strides = sizes + 8 * ir.rank;
    let offsets = strides + 8 * args * ir.rank;
    let maps = offsets + 8 * args;
    let vec = maps + 8 * ir.map_word_count();
    let lanes = vec + 8;
    let split = lanes + 8 * groups;
    let ranges = split + 8 * groups;
    ParamLayout {
        ptrs,
        scratch,
        sizes,
        strides,
        offsets,
        maps,
        vec,
        lanes,
        split,
        ranges,
        bytes: ranges + 16 * (ir.range_count() + ir.gather_count()),
    }
}

/// Sizes of `launch` with outer axes folded into the innermost one by the rule of
/// [`crate::lower::fold`], the one the C kernels spell in their preamble: the host folds once
/// per launch, when it writes the parameter block, rather than every thread doing it.
pub fn fold(ir: &KernelIr, launch: &Launch) -> Vec<i64> {
    crate::lower::fold::folded_sizes(ir, launch)
}

/// The run-time stride of argument `arg` on `axis` (0 when the launch lacks it).
fn stride_of(launch: &Launch, arg: usize, axis: usize) -> i64 {
    launch
        .strides
        .get(arg)
        .and_then(|s| s.get(axis))
        .copied()
        .unwrap_or(0)
}

/// The stride the kernel multiplies coordinate `axis` of argument `arg` by: 0 on `Broadcast`
/// axes, 1 on `Unit` ones, the run-time stride on `Strided` ones.
fn effective_stride(ir: &KernelIr, launch: &Launch, arg: usize, axis: usize) -> i64 {
    match ir.views().nth(arg).and_then(|v| v.axes.get(axis)) {
        Some(Axis::Strided) => stride_of(launch, arg, axis),
        Some(Axis::Unit) => 1,
        Some(Axis::Broadcast) | None => 0,
    }
}

/// How one reduction group's pass is cut into work, from (folded) sizes alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupShape {
    /// Output elements: the product of the kept axes' sizes.
    pub outputs: i64,
    /// Reduced elements per output: the product of the reduced axes' sizes.
    pub count: i64,
    /// Threads cooperating on one (output, piece) item: 1 when the innermost axis is kept
    /// (neighbouring threads take neighbouring outputs, so loads coalesce), a warp or the
    /// whole block when it is reduced (neighbouring threads take neighbouring elements).
    pub lanes: i64,
    /// Pieces each output's reduced elements are cut into, so that few outputs with many
    /// elements each still fill the GPU. Each piece is one item.
    pub split: i64,
}

impl GroupShape {
    /// Items of the pass: one per (output, piece).
    pub fn items(&self) -> i64 {
        self.outputs.saturating_mul(self.split)
    }
}

/// The shape of every reduction group's pass, for folded sizes `n`.
pub fn group_shapes(ir: &KernelIr, n: &[i64]) -> Vec<GroupShape> {
    let inner = ir.rank.saturating_sub(1);
    reduction_groups(ir)
        .iter()
        .map(|group| {
            let reduced = &ir.reductions[group[0]].reduced;
            let product = |keep: bool| -> i64 {
                (0..ir.rank)
                    .filter(|&d| reduced[d] != keep)
                    .map(|d| n.get(d).copied().unwrap_or(1).max(0))
                    .fold(1i64, |a, b| a.saturating_mul(b))
            };
            let outputs = product(true);
            let count = product(false);
            let lanes = if !reduced[inner] {
                1
            } else if outputs < 1024 && count >= 8192 {
                i64::from(BLOCK)
            } else {
                WARP
            };
            // Each lane gets at least 64 elements (16 for a whole block) before an output is
            // split further; splitting stops once the pass has TARGET_THREADS threads.
            let per_item = lanes * if lanes == i64::from(BLOCK) { 16 } else { 64 };
            let wanted = TARGET_THREADS / lanes;
            let split = if outputs == 0 || count == 0 || outputs >= wanted {
                1
            } else {
                div_ceil(wanted, outputs)
                    .min(div_ceil(count, per_item))
                    .max(1)
            };
            GroupShape {
                outputs,
                count,
                lanes,
                split,
            }
        })
        .collect()
}

fn div_ceil(a: i64, b: i64) -> i64 {
    if b <= 0 { 0 } else { (a + b - 1) / b }
}

/// Whether some count or element offset of the launch (with folded sizes `n`) needs 64-bit
/// indexing: the domain's element count, any size, any group's outputs, reduced count or
/// items, and for every argument every partial sum `offset + Σ i_d·stride_d` the kernel forms
/// (its extremes over the domain, and the sums of the stride terms alone) must lie in
/// `[-2^31, 2^31 - 1]`. Loop counters run in the unsigned type of the same width, whose range
/// covers a count below 2^31 plus one grid's worth of threads.
pub fn needs_i64(ir: &KernelIr, launch: &Launch, n: &[i64]) -> bool {
    let fits = |v: i128| v >= i128::from(i32::MIN) && v <= i128::from(i32::MAX);
    let total: i128 = n.iter().map(|&s| i128::from(s.max(0))).product();
    if !fits(total) || n.iter().any(|&s| !fits(i128::from(s))) {
        return true;
    }
    for shape in group_shapes(ir, n) {
        let counts = [shape.outputs, shape.count, shape.items()];
        if counts
            .iter()
            .any(|&c| !fits(i128::from(c)) || c == i64::MAX)
        {
            return true;
        }
    }
    for arg in 0..ir.arg_count() {
        let offset = i128::from(launch.offsets.get(arg).copied().unwrap_or(0));
        let (mut low, mut high) = (0i128, 0i128);
        for (d, &size) in n.iter().enumerate().take(ir.rank) {
            if size <= 1 {
                continue;
            }
            let stride = i128::from(effective_stride(ir, launch, arg, d));
            if !fits(stride) {
                return true;
            }
            let span = i128::from(size - 1) * stride;
            if span < 0 {
                low += span;
            } else {
                high += span;
            }
        }
        let extremes = [offset, low, high, offset + low, offset + high];
        if extremes.iter().any(|&v| !fits(v)) {
            return true;
        }
        if launch.stages(arg).iter().any(|stage| !stage_fits(stage)) {
            return true;
        }
    }
    false
}

/// Whether every value the unflattening of `stage` forms fits an `int`: its sizes, their
/// products (the divisors), its strides, and its offset plus the partial sums of its terms.
fn stage_fits(stage: &crate::lower::ir::MapStage) -> bool {
    let fits = |v: i128| v >= i128::from(i32::MIN) && v <= i128::from(i32::MAX);
    let mut product = 1i128;
    let (mut low, mut high) = (0i128, 0i128);
    for (&size, &stride) in stage.sizes.iter().zip(&stage.strides) {
        product *= i128::from(size.max(1));
        if !fits(product) || !fits(i128::from(stride)) {
            return false;
        }
        let span = i128::from(size.max(1) - 1) * i128::from(stride);
        if span < 0 {
            low += span;
        } else {
            high += span;
        }
    }
    let offset = i128::from(stage.offset);
    [offset, low, high, offset + low, offset + high]
        .iter()
        .all(|&v| fits(v))
}

/// Whether the vectorized path of a pointwise kernel may run with folded sizes `n` and device
/// pointers `ptrs`: the kernel has one ([`vector_width`] > 1), the innermost size is a
/// multiple of the width (so a vector never crosses a row), and every view with a `Unit`
/// innermost axis starts each row on a chunk boundary: its pointer plus offset is aligned to
/// its [`chunk_bytes`], and so is its stride (in bytes) along every outer axis that moves.
pub fn vector_ok(ir: &KernelIr, launch: &Launch, n: &[i64], ptrs: &[u64]) -> bool {
    vector_ok_at(ir, launch, n, ptrs, vector_width(ir))
}

/// [`vector_ok`] at vector width `width` (a row kernel's is [`row_vector_width`]).
fn vector_ok_at(ir: &KernelIr, launch: &Launch, n: &[i64], ptrs: &[u64], width: usize) -> bool {
    let inner = ir.rank.saturating_sub(1);
    let inner_size = n.get(inner).copied().unwrap_or(0);
    if width <= 1 || inner_size % width as i64 != 0 {
        return false;
    }
    for (arg, view) in ir.views().enumerate() {
        if view.axes[inner] != Axis::Unit {
            continue;
        }
        let elem = view.dtype.size_bytes() as i128;
        let chunk = chunk_bytes(view.dtype.size_bytes(), width) as i128;
        let ptr = i128::from(ptrs.get(arg).copied().unwrap_or(0));
        let offset = i128::from(launch.offsets.get(arg).copied().unwrap_or(0));
        if (ptr + offset * elem).rem_euclid(chunk) != 0 {
            return false;
        }
        for d in 0..inner {
            let moves = n.get(d).copied().unwrap_or(1) > 1 && view.axes[d] == Axis::Strided;
            if moves && (i128::from(stride_of(launch, arg, d)) * elem).rem_euclid(chunk) != 0 {
                return false;
            }
        }
    }
    true
}

/// Blocks for `threads` threads of work, at least one and at most [`BLOCKS_PER_SM`] per SM.
pub fn grid_for(threads: i64, sm_count: u32) -> u32 {
    let max_blocks = i64::from(sm_count.max(1)) * i64::from(BLOCKS_PER_SM);
    div_ceil(threads.max(1), i64::from(BLOCK)).clamp(1, max_blocks) as u32
}

/// How to run kernel `ir` (named `name`) for `launch` on a device with `sm_count` SMs: the
/// entry points in order (work-less ones left out: a grid cannot be empty), and the scratch
/// each reduction needs (`outputs` doubles with atomics, `outputs × split` in deterministic
/// mode, where each piece's partial result has its own slot).
pub fn plan(
    ir: &KernelIr,
    name: &str,
    launch: &Launch,
    sm_count: u32,
    options: &EmitOptions,
) -> LaunchPlan {
    let n = fold(ir, launch);
    let wide = needs_i64(ir, launch, &n);
    let total: i64 = n.iter().fold(1i64, |a, &b| a.saturating_mul(b.max(0)));
    let mut launches = Vec::new();
    if ir.is_row_kernel() {
        // One block per row: the grid covers the rows (grid-stride beyond the cap), and the
        // block's size follows the row length.
        let inner = ir.rank.saturating_sub(1);
        let rows = n
            .iter()
            .take(inner)
            .fold(1i64, |a, &b| a.saturating_mul(b.max(0)));
        let len = n.get(inner).copied().unwrap_or(0);
        let max_blocks = i64::from(sm_count.max(1)) * i64::from(BLOCKS_PER_SM);
        // An empty row still has results to write (a sum of 0, a mean of NaN); without rows
        // there is nothing to do, and a grid cannot be empty.
        if rows > 0 {
            let mut by_path = vec![String::new(); RowPath::RegistersVector as usize + 1];
            for path in row_paths(ir) {
                by_path[path as usize] = entry_name(name, &row_part(path), wide);
            }
            // No pointers: the path for aligned ones.
            let aligned = row_path(ir, launch, &n, &[]);
            launches.push(GpuLaunch {
                entry: by_path[aligned as usize].clone(),
                grid: (rows.min(max_blocks) as u32, 1, 1),
                block: (row_block(ir, len), 1, 1),
                shared_bytes: row_shared_bytes(ir, len),
                by_path,
            });
        }
        return LaunchPlan {
            launches,
            scratch_bytes: Vec::new(),
        };
    }
    let mut push = |part: &str, threads: i64| {
        if threads > 0 {
            launches.push(GpuLaunch {
                entry: entry_name(name, part, wide),
                grid: (grid_for(threads, sm_count), 1, 1),
                block: (BLOCK, 1, 1),
                shared_bytes: 0,
                by_path: Vec::new(),
            });
        }
    };
    if ir.reductions.is_empty() {
        let width = vector_width(ir) as i64;
        let inner = n.get(ir.rank.saturating_sub(1)).copied().unwrap_or(0);
        let threads = if width > 1 && inner % width == 0 {
            total / width
        } else {
            total
        };
        push("", threads);
        return LaunchPlan {
            launches,
            scratch_bytes: Vec::new(),
        };
    }
    let shapes = group_shapes(ir, &n);
    let groups = reduction_groups(ir);
    let most_outputs = shapes.iter().map(|s| s.outputs).max().unwrap_or(0);
    if !options.deterministic {
        push("_init", most_outputs);
    }
    for (g, shape) in shapes.iter().enumerate() {
        push(&format!("_g{g}"), shape.items().saturating_mul(shape.lanes));
    }
    push("_finish", most_outputs);
    let mut scratch_bytes = vec![8; ir.reductions.len()];
    for (group, shape) in groups.iter().zip(&shapes) {
        let slots = if options.deterministic {
            shape.items()
        } else {
            shape.outputs
        };
        for &r in group {
            scratch_bytes[r] = usize::try_from(slots.saturating_mul(8))
                .unwrap_or(usize::MAX)
                .max(8);
        }
    }
    LaunchPlan {
        launches,
        scratch_bytes,
    }
}

/// The parameter block of one launch of `ir` (layout in the module documentation), with
/// device pointers `ptrs` (one per argument, [`KernelIr::views`] order) and `scratch` (one per
/// reduction, sized by [`plan`]). Every entry point of the kernel takes this same block.
pub fn param_block(ir: &KernelIr, launch: &Launch, ptrs: &[u64], scratch: &[u64]) -> Vec<u8> {
    param_words(ir, launch, ptrs, scratch)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// [`param_block`] as its 8-byte fields, in native order: the storage a launch hands to the
/// driver (8-byte aligned, as the block's pointers and int64s need).
pub fn param_words(ir: &KernelIr, launch: &Launch, ptrs: &[u64], scratch: &[u64]) -> Vec<u64> {
    debug_assert_eq!(ptrs.len(), ir.arg_count(), "one pointer per argument");
    debug_assert_eq!(
        scratch.len(),
        ir.reductions.len(),
        "one scratch per reduction"
    );
    let n = fold(ir, launch);
    let args = ir.arg_count();
    let mut words: Vec<u64> = Vec::with_capacity(param_layout(ir).bytes / 8);
    words.extend((0..args).map(|a| ptrs.get(a).copied().unwrap_or(0)));
    words.extend((0..ir.reductions.len()).map(|r| scratch.get(r).copied().unwrap_or(0)));
    words.extend((0..ir.rank).map(|d| n.get(d).copied().unwrap_or(0) as u64));
    for arg in 0..args {
        words.extend((0..ir.rank).map(|d| stride_of(launch, arg, d) as u64));
    }
    words.extend((0..args).map(|a| launch.offsets.get(a).copied().unwrap_or(0) as u64));
    let mut maps = launch.map_words();
    maps.resize(ir.map_word_count(), 0);
    words.extend(maps.iter().map(|&w| w as u64));
    words.push(if ir.is_row_kernel() {
        row_path(ir, launch, &n, ptrs) as u64
    } else {
        u64::from(vector_ok(ir, launch, &n, ptrs))
    });
    let shapes = group_shapes(ir, &n);
    words.extend(shapes.iter().map(|s| s.lanes as u64));
    words.extend(shapes.iter().map(|s| s.split as u64));
    for r in 0..ir.range_count() {
        let (start, end) = launch.ranges.get(r).copied().unwrap_or((0, 0));
        words.push(start as u64);
        words.push(end as u64);
    }
    for g in 0..ir.gather_count() {
        let gathered = launch.gathers.get(g);
        words.push(gathered.map_or(0, |g| g.stride) as u64);
        words.push(gathered.map_or(0, |g| g.extent) as u64);
    }
    words
}
