//! Hardware profiles for the cost model, loaded from `rules/cost.ron`.
//!
//! A profile says how fast a machine moves bytes, launches kernels and does arithmetic. The
//! partitioner ([`crate::partition`]) prices each kernel with one: launch overhead, plus bytes
//! at the kernel boundary over bandwidth, plus arithmetic over throughput, combined per the
//! profile's `overlap` (1 = roofline, 0 = sum).
//!
//! Arithmetic is counted from the op's formula: every primitive of the formula language has a
//! weight in flop-equivalents (one add = 1), so an op added in a user's `ops.ron` gets a cost
//! without anyone writing one down, and the cost of `sigmoid` follows from `1 / (1 + exp(-x))`.

use super::ron_file::{self, RonDocument};
use super::{OpDef, OpKind};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result, Site};
use crate::formula::{BinOp, Expr, Func};
use crate::shape::IndexMap;
use crate::span::Step;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The embedded default profiles.
pub const DEFAULT_COST: &str = include_str!("../../rules/cost.ron");

/// What a flop-equivalent weight is given for: the primitives of the formula language, plus one
/// accumulation of a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Primitive {
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    /// Any of `<`, `<=`, `>`, `>=`, `==`, `!=`.
    Compare,
    Select,
    Min,
    Max,
    Abs,
    Floor,
    Exp,
    Log,
    Log1p,
    Expm1,
    Sqrt,
    Rsqrt,
    Tanh,
    Erf,
    Sin,
    Cos,
    Atan,
    Pow,
    /// One accumulation step of a reduction, per input element.
    Reduce,
}

impl Primitive {
    pub const ALL: [Primitive; 24] = [
        Primitive::Add,
        Primitive::Sub,
        Primitive::Mul,
        Primitive::Div,
        Primitive::Neg,
        Primitive::Compare,
        Primitive::Select,
        Primitive::Min,
        Primitive::Max,
        Primitive::Abs,
        Primitive::Floor,
        Primitive::Exp,
        Primitive::Log,
        Primitive::Log1p,
        Primitive::Expm1,
        Primitive::Sqrt,
        Primitive::Rsqrt,
        Primitive::Tanh,
        Primitive::Erf,
        Primitive::Sin,
        Primitive::Cos,
        Primitive::Atan,
        Primitive::Pow,
        Primitive::Reduce,
    ];

    /// The key used in `cost.ron`'s `weights` tables.
    pub fn name(self) -> &'static str {
        match self {
            Primitive::Add => "add",
            Primitive::Sub => "sub",
            Primitive::Mul => "mul",
            Primitive::Div => "div",
            Primitive::Neg => "neg",
            Primitive::Compare => "compare",
            Primitive::Select => "select",
            Primitive::Min => "min",
            Primitive::Max => "max",
            Primitive::Abs => "abs",
            Primitive::Floor => "floor",
            Primitive::Exp => "exp",
            Primitive::Log => "log",
            Primitive::Log1p => "log1p",
            Primitive::Expm1 => "expm1",
            Primitive::Sqrt => "sqrt",
            Primitive::Rsqrt => "rsqrt",
            Primitive::Tanh => "tanh",
            Primitive::Erf => "erf",
            Primitive::Sin => "sin",
            Primitive::Cos => "cos",
            Primitive::Atan => "atan",
            Primitive::Pow => "pow",
            Primitive::Reduce => "reduce",
        }
    }

    pub fn from_name(name: &str) -> Option<Primitive> {
        Primitive::ALL.into_iter().find(|p| p.name() == name)
    }

    fn of_binop(op: BinOp) -> Primitive {
        match op {
            BinOp::Add => Primitive::Add,
            BinOp::Sub => Primitive::Sub,
            BinOp::Mul => Primitive::Mul,
            BinOp::Div => Primitive::Div,
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne => {
                Primitive::Compare
            }
        }
    }

    fn of_func(func: Func) -> Primitive {
        match func {
            Func::Exp => Primitive::Exp,
            Func::Log => Primitive::Log,
            Func::Log1p => Primitive::Log1p,
            Func::Expm1 => Primitive::Expm1,
            Func::Sqrt => Primitive::Sqrt,
            Func::Rsqrt => Primitive::Rsqrt,
            Func::Tanh => Primitive::Tanh,
            Func::Erf => Primitive::Erf,
            Func::Abs => Primitive::Abs,
            Func::Floor => Primitive::Floor,
            Func::Sin => Primitive::Sin,
            Func::Cos => Primitive::Cos,
            Func::Atan => Primitive::Atan,
            Func::Min => Primitive::Min,
            Func::Max => Primitive::Max,
            Func::Pow => Primitive::Pow,
            Func::Select => Primitive::Select,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One machine as the cost model sees it. Every field is complete after loading: weights not
/// given by the profile come from its file's table, then from the embedded defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub doc: String,
    /// Bytes read plus bytes written per second, in GB/s (1e9 bytes).
    pub bandwidth_gbps: f64,
    /// Fixed cost of one kernel, in microseconds.
    pub launch_us: f64,
    /// Flop-equivalents per second of generated kernels, in GFLOP/s.
    pub pointwise_gflops: f64,
    /// How much of the shorter of memory and compute time hides behind the longer one: 1 is
    /// the roofline `max`, 0 the sum.
    pub overlap: f64,
    /// Matrix-product throughput per result dtype, in GFLOP/s.
    pub matmul_gflops: BTreeMap<DType, f64>,
    /// What a read costs beyond its bytes, by access pattern.
    pub reads: Reads,
    /// How the machine runs reductions that are not row reductions.
    pub reductions: Reductions,
    weights: [f64; Primitive::ALL.len()],
}

/// The price of a read by its access pattern, beyond the bytes it moves (`reads` in
/// `cost.ron`). A kernel reading a value through a view pays for the memory lines it touches,
/// not the bytes it uses: a transposed read along the loop's inner axis touches a new line
/// (and soon a new page) per element. The partitioner charges that extra as bytes moved at
/// the profile's bandwidth, which is what lets it weigh a view against a copy kernel that
/// gathers once and is then read contiguously. The default, all zero, prices every read by its
/// bytes alone.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename = "Reads", deny_unknown_fields)]
pub struct Reads {
    /// The unit the memory system moves, in bytes (a cache line, a GPU sector).
    #[serde(default = "Reads::default_line")]
    pub line_bytes: f64,
    /// Extra bytes moved per byte read when consecutive elements along the inner loop axis
    /// lie on different lines (stride × element size ≥ `line_bytes`). A shorter stride pays
    /// the share of it given by how much of each line it skips.
    #[serde(default)]
    pub strided: f64,
    /// Values of at most this many bytes pay no `strided` price: the lines a strided pass
    /// touches stay cached for the neighbouring elements the next rows read (a transposing
    /// read of a small matrix reads every line from memory once).
    #[serde(default)]
    pub cache_bytes: f64,
    /// Extra bytes moved per byte read through an index map with floor-division/remainder
    /// stages (a reshape of a transposed or sliced view).
    #[serde(default)]
    pub gathered: f64,
    /// Whether a row kernel reads its inputs from memory again on every pass over a row (the
    /// CPU's passes re-walk the row, so a strided row gathers again each pass). `false` where
    /// the row stays on chip after the first read (the CUDA row kernels' registers or shared
    /// memory).
    #[serde(default)]
    pub rows_reread: bool,
}

/// How a machine runs the reductions of a kernel that is no row kernel (`reductions` in
/// `cost.ron`): column sums, a bias gradient's `sum_to_size`, a sum of everything. On a GPU
/// they are passes of their own launches, and each output's reduced elements are walked by a
/// few threads, so a kernel reducing few outputs runs few threads, however large its domain:
/// a pass with too few threads has too few loads in flight to keep the memory busy. The
/// default (all zero) prices such a kernel like any other, as one launch moving its bytes at
/// the profile's bandwidth, which is how the CPU's threads run it.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename = "Reductions", deny_unknown_fields)]
pub struct Reductions {
    /// Launches beyond the first that a kernel with such reductions takes (CUDA: an `_init`
    /// pass that sets the accumulators and a `_finish` pass that rounds and stores them).
    #[serde(default)]
    pub extra_launches: f64,
    /// Reduced elements one thread walks for one output before the output is split between
    /// more threads: the pass runs about outputs × ⌈reduced elements / `per_thread`⌉ threads.
    #[serde(default = "Reductions::default_per_thread")]
    pub per_thread: f64,
    /// Threads a pass needs to keep the memory busy. A pass with fewer threads moves its bytes
    /// (`saturating_threads` / threads)^`exponent` times slower. 0: no such limit.
    #[serde(default)]
    pub saturating_threads: f64,
    /// How steeply a pass short of threads slows down. 1 is Little's law with a fixed number
    /// of bytes in flight per thread; measured GPU passes slow down less steeply than that,
    /// since a thread with fewer neighbours gets more of the memory system's queue.
    #[serde(default = "Reductions::default_exponent")]
    pub exponent: f64,
    /// Bytes per thread at which a pass short of threads pays the whole slowdown above. A
    /// pass whose threads move fewer bytes each pays the slowdown times
    /// (bytes per thread / `full_bytes_per_thread`)^`bytes_exponent` (never below 1): its
    /// threads finish their few loads before the latency the slowdown models adds up (on an
    /// H200, column sums moving 1 KiB a thread ran at copy speed at every thread count,
    /// those moving 4 KiB 3.4–4.1× slower with 16384 threads or fewer). 0: every pass pays
    /// the whole slowdown.
    #[serde(default)]
    pub full_bytes_per_thread: f64,
    /// How steeply the slowdown fades below `full_bytes_per_thread`.
    #[serde(default = "Reductions::default_exponent")]
    pub bytes_exponent: f64,
}

impl Reductions {
    fn default_per_thread() -> f64 {
        64.0
    }

    fn default_exponent() -> f64 {
        1.0
    }

    /// The threads of a pass reducing `outputs` outputs of `count` elements each: infinite
    /// when it reduces nothing (such a pass is never short of threads).
    pub fn pass_threads(&self, outputs: usize, count: usize) -> f64 {
        if outputs == 0 || count == 0 {
            return f64::INFINITY;
        }
        outputs as f64 * (count as f64 / self.per_thread.max(1.0)).ceil()
    }

    /// How many times slower than the bandwidth a pass of `threads` threads moving `bytes`
    /// moves them (1 with enough threads, with few bytes per thread, or with no limit).
    pub fn memory_factor(&self, threads: f64, bytes: f64) -> f64 {
        if self.saturating_threads <= 0.0 || threads.is_nan() || threads <= 0.0 {
            return 1.0;
        }
        let short = (self.saturating_threads / threads).powf(self.exponent);
        let share = if self.full_bytes_per_thread > 0.0 {
            (bytes / threads / self.full_bytes_per_thread)
                .min(1.0)
                .powf(self.bytes_exponent)
        } else {
            1.0
        };
        (short * share).max(1.0)
    }
}

impl Default for Reductions {
    fn default() -> Self {
        Reductions {
            extra_launches: 0.0,
            per_thread: Reductions::default_per_thread(),
            saturating_threads: 0.0,
            exponent: Reductions::default_exponent(),
            full_bytes_per_thread: 0.0,
            bytes_exponent: Reductions::default_exponent(),
        }
    }
}

impl Reads {
    fn default_line() -> f64 {
        64.0
    }

    /// Extra bytes, per byte of the value, that one pass reading `map` for a value of `shape`
    /// with elements of `element_bytes` moves beyond the value's bytes: 0 for a contiguous or
    /// broadcast inner axis or a value of at most `cache_bytes`, `gathered` through index-map
    /// stages, the stride's share of `strided` otherwise.
    pub fn extra_per_byte(&self, map: &IndexMap, shape: &[usize], element_bytes: usize) -> f64 {
        if !map.stages.is_empty() {
            return self.gathered;
        }
        let value_bytes = crate::shape::numel(shape) as f64 * element_bytes as f64;
        if value_bytes <= self.cache_bytes {
            return 0.0;
        }
        // The innermost axis that has more than one element is the one the loop walks.
        let Some(d) = shape.iter().rposition(|&n| n > 1) else {
            return 0.0;
        };
        if d + 1 != shape.len() {
            // Every axis after `d` has one element: the inner loop axis broadcasts this value.
            return 0.0;
        }
        let stride = map.outer.strides.get(d).map_or(1, |s| s.unsigned_abs());
        if stride <= 1 {
            return 0.0;
        }
        let element = element_bytes.max(1) as f64;
        if self.line_bytes <= element {
            return self.strided;
        }
        let skipped = (stride as f64 * element).min(self.line_bytes) - element;
        self.strided * skipped / (self.line_bytes - element)
    }
}

impl Default for Reads {
    fn default() -> Self {
        Reads {
            line_bytes: Reads::default_line(),
            strided: 0.0,
            cache_bytes: 0.0,
            gathered: 0.0,
            rows_reread: false,
        }
    }
}

impl Profile {
    /// The flop-equivalent weight of one primitive.
    pub fn weight(&self, primitive: Primitive) -> f64 {
        self.weights[primitive.index()]
    }

    /// Flop-equivalents to evaluate `expr` once. Numbers and variables are free.
    pub fn formula_flops(&self, expr: &Expr) -> f64 {
        match expr {
            Expr::Num(_) | Expr::Var(_) => 0.0,
            Expr::Neg(e) => self.weight(Primitive::Neg) + self.formula_flops(e),
            Expr::Binary(op, l, r) => {
                self.weight(Primitive::of_binop(*op))
                    + self.formula_flops(l)
                    + self.formula_flops(r)
            }
            Expr::Call(f, args) => {
                self.weight(Primitive::of_func(*f))
                    + args.iter().map(|a| self.formula_flops(a)).sum::<f64>()
            }
        }
    }

    /// Flop-equivalents per element of `op`'s iteration domain: a pointwise op's formula (at
    /// least 1: an op with no arithmetic, such as `cast` with formula `x`, still converts and
    /// stores every element), a reduction's accumulation per input element, nothing for layout
    /// ops, and nothing for opaque ops, whose arithmetic depends on shapes (see
    /// [`Profile::matmul_flops`]).
    pub fn elementwise_flops(&self, op: &OpDef) -> f64 {
        match op.kind() {
            OpKind::Pointwise => op.formula().map_or(1.0, |f| self.formula_flops(f).max(1.0)),
            OpKind::Reduction => self.weight(Primitive::Reduce),
            OpKind::Layout | OpKind::Opaque => 0.0,
        }
    }

    /// 2·M·N·K for a (batched) matrix product with operand shapes `a`, `b` and result shape
    /// `out`: each of the numel(out) results is a K-long dot product of multiply-adds. K is the
    /// contracted axis, `a`'s last (its only one when `a` is 1-D).
    pub fn matmul_flops(a: &[usize], out: &[usize]) -> f64 {
        let k = a.last().copied().unwrap_or(1);
        2.0 * crate::shape::numel(out) as f64 * k as f64
    }

    /// Matrix-product throughput for `dtype`; a dtype the profile does not list gets the
    /// slowest listed rate, so an unlisted case is never priced optimistically.
    pub fn matmul_rate(&self, dtype: DType) -> f64 {
        self.matmul_gflops.get(&dtype).copied().unwrap_or_else(|| {
            self.matmul_gflops
                .values()
                .copied()
                .fold(f64::INFINITY, f64::min)
        })
    }

    /// Microseconds to move `bytes` across the memory bus.
    pub fn memory_us(&self, bytes: f64) -> f64 {
        bytes / (self.bandwidth_gbps * 1e3)
    }

    /// Microseconds for `flops` flop-equivalents at `gflops` GFLOP/s.
    pub fn compute_us(flops: f64, gflops: f64) -> f64 {
        flops / (gflops * 1e3)
    }

    /// One kernel's time from its parts: launch + memory + compute − overlap · min(memory,
    /// compute).
    pub fn combine(&self, memory_us: f64, compute_us: f64) -> f64 {
        self.launch_us + memory_us + compute_us - self.overlap * memory_us.min(compute_us)
    }
}

/// All profiles by name.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    profiles: BTreeMap<String, Profile>,
    /// The embedded weight table: what a user's file starts from.
    base_weights: [f64; Primitive::ALL.len()],
}

/// `cost.ron` as written.
#[derive(Debug, Deserialize)]
#[serde(rename = "Cost", deny_unknown_fields)]
struct CostSpec {
    /// Weights for every profile of this file; keys not given come from the embedded table.
    #[serde(default)]
    weights: BTreeMap<String, f64>,
    profiles: BTreeMap<String, ProfileSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename = "Profile", deny_unknown_fields)]
struct ProfileSpec {
    #[serde(default)]
    doc: String,
    bandwidth_gbps: f64,
    launch_us: f64,
    pointwise_gflops: f64,
    /// Defaults to the sum (0), the pessimistic combination.
    #[serde(default)]
    overlap: f64,
    matmul_gflops: BTreeMap<DType, f64>,
    /// Overrides of the file's weights for this profile.
    #[serde(default)]
    weights: BTreeMap<String, f64>,
    /// Read prices by access pattern; none beyond bytes when absent.
    #[serde(default)]
    reads: Reads,
    /// How reductions outside row kernels run; like any kernel when absent.
    #[serde(default)]
    reductions: Reductions,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::defaults()
    }
}

impl CostModel {
    /// The embedded profiles (`cpu`, `h200`).
    pub fn defaults() -> CostModel {
        let mut model = CostModel {
            profiles: BTreeMap::new(),
            base_weights: [f64::NAN; Primitive::ALL.len()],
        };
        model
            .load(DEFAULT_COST, "rules/cost.ron", true)
            .expect("the embedded rules/cost.ron is checked by tests");
        model
    }

    /// Adds the profiles of a `cost.ron` document; a profile with the name of an existing one
    /// replaces it. Weights the document leaves out come from the embedded table. Nothing is
    /// added unless the whole document is valid.
    pub fn load_str(&mut self, text: &str, file: &str) -> Result<()> {
        self.load(text, file, false)
    }

    /// `embedded`: the document is the embedded default and must give every weight itself.
    fn load(&mut self, text: &str, file: &str, embedded: bool) -> Result<()> {
        let doc: RonDocument<CostSpec> = ron_file::parse(text, file)?;
        let base = if embedded {
            [f64::NAN; Primitive::ALL.len()]
        } else {
            self.base_weights
        };
        let file_weights = overlay(base, &doc.value.weights, &doc, &[Step::field("weights")])?;
        if let Some(missing) = Primitive::ALL
            .iter()
            .find(|p| file_weights[p.index()].is_nan())
        {
            return Err(Error::new(
                doc.site(&[Step::field("weights")]),
                ErrorKind::Rule(format!(
                    "the weight table must give every primitive; `{}` is missing",
                    missing.name()
                )),
            ));
        }
        let mut added = Vec::new();
        for (name, spec) in &doc.value.profiles {
            let path = [Step::field("profiles"), Step::key(name)];
            added.push(profile(name, spec, file_weights, &doc, &path)?);
        }
        if embedded {
            self.base_weights = file_weights;
        }
        for p in added {
            self.profiles.insert(p.name.clone(), p);
        }
        Ok(())
    }

    /// The profile called `name`; an unknown name is an error that lists the known ones.
    pub fn profile(&self, name: &str) -> Result<&Profile> {
        self.profiles.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.names().collect();
            Error::new(
                Site::default(),
                ErrorKind::Rule(format!(
                    "no cost profile `{name}`{}; cost.ron defines {}",
                    crate::error::hint(name, known.iter().copied()),
                    known.join(", ")
                )),
            )
        })
    }

    /// Profile names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    pub fn profiles(&self) -> impl Iterator<Item = &Profile> {
        self.profiles.values()
    }
}

/// `base` with the entries of `table` laid over it; unknown keys and bad values are located
/// errors.
fn overlay(
    mut base: [f64; Primitive::ALL.len()],
    table: &BTreeMap<String, f64>,
    doc: &RonDocument<CostSpec>,
    path: &[Step],
) -> Result<[f64; Primitive::ALL.len()]> {
    for (key, &value) in table {
        let mut at = path.to_vec();
        at.push(Step::key(key));
        let Some(primitive) = Primitive::from_name(key) else {
            let position = doc
                .spans
                .key_position(&at)
                .unwrap_or_else(|| doc.spans.nearest(&at));
            return Err(Error::new(
                Site::file(&doc.file, position),
                ErrorKind::Rule(format!(
                    "unknown weight `{key}`{}; weights are given for {}",
                    crate::error::hint(key, Primitive::ALL.iter().map(|p| p.name())),
                    Primitive::ALL.map(|p| p.name()).join(", ")
                )),
            ));
        };
        if !(0.0..=MAX_TIME_OR_WEIGHT).contains(&value) {
            return Err(Error::new(
                doc.site(&at),
                ErrorKind::Rule(format!(
                    "weight `{key}` must be a finite number ≥ 0, at most {MAX_TIME_OR_WEIGHT:e}, found {value}"
                )),
            ));
        }
        base[primitive.index()] = value;
    }
    Ok(base)
}

/// The rates a profile may give (`bandwidth_gbps`, `pointwise_gflops`, `matmul_gflops`), in
/// GB/s or GFLOP/s: from a thousandth of a byte per microsecond to 10^12 GB/s. Outside it,
/// times come out 0, infinite or NaN (`5e-324` GB/s makes every kernel infinitely slow,
/// `1e308` overflows to infinity when scaled), and the plan the partitioner picks is arbitrary.
pub const RATE_RANGE: std::ops::RangeInclusive<f64> = 1e-6..=1e12;

/// The most a time (`launch_us`) or a weight may be: 10^9 µs or flop-equivalents, far beyond
/// any machine, small enough that sums over a graph stay finite.
pub const MAX_TIME_OR_WEIGHT: f64 = 1e9;

/// Why a positive rate outside [`RATE_RANGE`] is refused.
fn out_of_range(value: f64) -> String {
    format!(
        "must lie between {:e} and {:e} (GB/s or GFLOP/s), found {value:e}: beyond that, \
         kernel times come out 0, infinite or NaN and the plan would be arbitrary",
        RATE_RANGE.start(),
        RATE_RANGE.end()
    )
}

fn profile(
    name: &str,
    spec: &ProfileSpec,
    file_weights: [f64; Primitive::ALL.len()],
    doc: &RonDocument<CostSpec>,
    path: &[Step],
) -> Result<Profile> {
    let at = |field: &str| {
        let mut p = path.to_vec();
        p.push(Step::field(field));
        p
    };
    let rule =
        |field: &str, message: String| Error::new(doc.site(&at(field)), ErrorKind::Rule(message));
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        let position = doc
            .spans
            .key_position(path)
            .unwrap_or_else(|| doc.spans.nearest(path));
        return Err(Error::new(
            Site::file(&doc.file, position),
            ErrorKind::Rule(format!(
                "profile name `{name}` must be non-empty without spaces (it is given to --profile)"
            )),
        ));
    }
    let positive = |field: &str, value: f64| {
        if RATE_RANGE.contains(&value) {
            Ok(())
        } else if value.is_finite() && value > 0.0 {
            Err(rule(field, format!("`{field}` {}", out_of_range(value))))
        } else {
            Err(rule(
                field,
                format!("`{field}` must be a finite number > 0, found {value}"),
            ))
        }
    };
    positive("bandwidth_gbps", spec.bandwidth_gbps)?;
    positive("pointwise_gflops", spec.pointwise_gflops)?;
    if !(0.0..=MAX_TIME_OR_WEIGHT).contains(&spec.launch_us) {
        return Err(rule(
            "launch_us",
            format!(
                "`launch_us` must be a finite number ≥ 0, at most {MAX_TIME_OR_WEIGHT:e}, found {}",
                spec.launch_us
            ),
        ));
    }
    if !(0.0..=1.0).contains(&spec.overlap) {
        return Err(rule(
            "overlap",
            format!(
                "`overlap` must lie in [0, 1] (0: memory and compute time add up, 1: roofline), found {}",
                spec.overlap
            ),
        ));
    }
    if spec.matmul_gflops.is_empty() {
        return Err(rule(
            "matmul_gflops",
            "`matmul_gflops` must give the rate of at least one dtype".into(),
        ));
    }
    for (dtype, &rate) in &spec.matmul_gflops {
        if !RATE_RANGE.contains(&rate) {
            let mut p = at("matmul_gflops");
            p.push(Step::key(dtype.name()));
            let message = if rate.is_finite() && rate > 0.0 {
                format!("matmul rate for {} {}", dtype.name(), out_of_range(rate))
            } else {
                format!(
                    "matmul rate for {} must be a finite number > 0, found {rate}",
                    dtype.name()
                )
            };
            return Err(Error::new(doc.site(&p), ErrorKind::Rule(message)));
        }
    }
    // Each sub-structure's numbers within their ranges, an error located at the field.
    type Field<'a> = (&'a str, f64, std::ops::RangeInclusive<f64>);
    let in_ranges = |section: &str, fields: &[Field]| -> Result<()> {
        for (field, value, range) in fields {
            if !range.contains(value) {
                let mut p = at(section);
                p.push(Step::field(field));
                return Err(Error::new(
                    doc.site(&p),
                    ErrorKind::Rule(format!(
                        "`{section}.{field}` must be a finite number between {} and {:e}, found {value}",
                        range.start(),
                        range.end()
                    )),
                ));
            }
        }
        Ok(())
    };
    let reads = spec.reads;
    in_ranges(
        "reads",
        &[
            ("line_bytes", reads.line_bytes, 1.0..=MAX_TIME_OR_WEIGHT),
            ("strided", reads.strided, 0.0..=MAX_TIME_OR_WEIGHT),
            ("gathered", reads.gathered, 0.0..=MAX_TIME_OR_WEIGHT),
            ("cache_bytes", reads.cache_bytes, 0.0..=1e18),
        ],
    )?;
    let reductions = spec.reductions;
    in_ranges(
        "reductions",
        &[
            ("extra_launches", reductions.extra_launches, 0.0..=1e3),
            ("per_thread", reductions.per_thread, 1.0..=1e12),
            (
                "saturating_threads",
                reductions.saturating_threads,
                0.0..=1e12,
            ),
            ("exponent", reductions.exponent, 0.0..=4.0),
            (
                "full_bytes_per_thread",
                reductions.full_bytes_per_thread,
                0.0..=1e12,
            ),
            ("bytes_exponent", reductions.bytes_exponent, 0.0..=4.0),
        ],
    )?;
    let weights = overlay(file_weights, &spec.weights, doc, &at("weights"))?;
    Ok(Profile {
        name: name.to_string(),
        doc: spec.doc.clone(),
        bandwidth_gbps: spec.bandwidth_gbps,
        launch_us: spec.launch_us,
        pointwise_gflops: spec.pointwise_gflops,
        overlap: spec.overlap,
        matmul_gflops: spec.matmul_gflops.clone(),
        reads,
        reductions,
        weights,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Catalogue;

    #[test]
    fn embedded_profiles_load_with_complete_weights() {
        let model = CostModel::defaults();
        assert_eq!(model.names().collect::<Vec<_>>(), ["cpu", "h200"]);
        for p in model.profiles() {
            for prim in Primitive::ALL {
                assert!(p.weight(prim).is_finite(), "{} {}", p.name, prim.name());
            }
        }
        let h200 = model.profile("h200").unwrap();
        assert_eq!(h200.bandwidth_gbps, 4300.0);
        assert_eq!(h200.matmul_rate(DType::BF16), 790000.0);
        // The cpu profile overrides exp but keeps the shared add.
        let cpu = model.profile("cpu").unwrap();
        assert_eq!(cpu.weight(Primitive::Exp), 20.0);
        assert_eq!(cpu.weight(Primitive::Add), 1.0);
        assert_eq!(h200.weight(Primitive::Exp), 10.0);
    }

    #[test]
    fn flops_follow_the_formula() {
        let ops = Catalogue::defaults();
        let cpu = CostModel::defaults().profile("cpu").unwrap().clone();
        // sigmoid = 1 / (1 + exp(-x)): div 7 + add 1 + exp 20 + neg 1.
        assert_eq!(cpu.elementwise_flops(ops.get("sigmoid").unwrap()), 29.0);
        assert_eq!(cpu.elementwise_flops(ops.get("mul").unwrap()), 1.0);
        // cast's formula is `x`: no arithmetic, but the 1-flop floor.
        assert_eq!(cpu.elementwise_flops(ops.get("cast").unwrap()), 1.0);
        assert_eq!(cpu.elementwise_flops(ops.get("sum").unwrap()), 1.0);
        assert_eq!(cpu.elementwise_flops(ops.get("transpose").unwrap()), 0.0);
        // where = select(c, a, b); gt = a > b.
        assert_eq!(cpu.elementwise_flops(ops.get("where").unwrap()), 1.0);
        assert_eq!(cpu.elementwise_flops(ops.get("gt").unwrap()), 1.0);
        // [64, 32] x [32, 16]: 2 * 64 * 16 * 32.
        assert_eq!(Profile::matmul_flops(&[64, 32], &[64, 16]), 65536.0);
    }

    #[test]
    fn user_file_adds_profiles_and_inherits_weights() {
        let mut model = CostModel::defaults();
        model
            .load_str(
                r#"Cost(weights: {"exp": 3.0}, profiles: {
                    "toy": Profile(bandwidth_gbps: 1.0, launch_us: 10.0, pointwise_gflops: 1.0,
                                   matmul_gflops: {"f32": 2.0}, weights: {"tanh": 5.0}),
                })"#,
                "my/cost.ron",
            )
            .unwrap();
        let toy = model.profile("toy").unwrap();
        assert_eq!(toy.weight(Primitive::Exp), 3.0);
        assert_eq!(toy.weight(Primitive::Tanh), 5.0);
        assert_eq!(toy.weight(Primitive::Div), 10.0, "from the embedded table");
        assert_eq!(toy.overlap, 0.0);
        assert_eq!(toy.matmul_rate(DType::F16), 2.0, "slowest listed");
        assert_eq!(toy.combine(3.0, 2.0), 15.0);
        assert!(model.profile("cpu").is_ok(), "defaults stay");
    }

    /// Rates so small or large that times come out infinite, 0 or NaN are refused at load,
    /// at the value, instead of giving an arbitrary plan.
    #[test]
    fn extreme_profile_numbers_are_refused_where_written() {
        let cases = [
            (
                "bandwidth_gbps: 5e-324",
                "launch_us: 1.0",
                "1:46",
                "found 5e-324",
            ),
            (
                "bandwidth_gbps: 1e308",
                "launch_us: 1.0",
                "1:46",
                "found 1e308",
            ),
            (
                "bandwidth_gbps: 1.0",
                "launch_us: 1e300",
                "1:62",
                "at most 1e9",
            ),
        ];
        for (bandwidth, launch, at, needle) in cases {
            let text = format!(
                "Cost(profiles: {{\"x\": Profile({bandwidth}, {launch}, pointwise_gflops: 1.0, matmul_gflops: {{\"f32\": 1.0}})}})"
            );
            let err = CostModel::defaults()
                .load_str(&text, "c.ron")
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(&format!("c.ron:{at}: ")), "{err}");
            assert!(err.contains(needle), "{err}");
        }
        let text = "Cost(profiles: {\"x\": Profile(bandwidth_gbps: 1.0, launch_us: 1.0, pointwise_gflops: 1.0, matmul_gflops: {\"f32\": 1e-320}, weights: {\"exp\": 1e300})})";
        let err = CostModel::defaults().load_str(text, "c.ron").unwrap_err();
        assert!(
            err.to_string()
                .contains("matmul rate for f32 must lie between"),
            "{err}"
        );
        let text = "Cost(profiles: {\"x\": Profile(bandwidth_gbps: 1.0, launch_us: 1.0, pointwise_gflops: 1.0, matmul_gflops: {\"f32\": 1.0}, weights: {\"exp\": 1e300})})";
        let err = CostModel::defaults().load_str(text, "c.ron").unwrap_err();
        assert!(
            err.to_string()
                .contains("weight `exp` must be a finite number ≥ 0, at most 1e9"),
            "{err}"
        );
    }

    /// Read prices load from `reads`, default to bytes alone when absent, and refuse negative
    /// or non-finite prices at the value.
    #[test]
    fn read_prices_load_default_and_are_checked() {
        let model = CostModel::defaults();
        let cpu = model.profile("cpu").unwrap();
        assert_eq!(cpu.reads.strided, 36.0);
        assert!(cpu.reads.rows_reread);
        assert!(!model.profile("h200").unwrap().reads.rows_reread);
        let base = "bandwidth_gbps: 1.0, launch_us: 1.0, pointwise_gflops: 1.0, matmul_gflops: {\"f32\": 1.0}";
        let mut model = CostModel::defaults();
        model
            .load_str(
                &format!("Cost(profiles: {{\"x\": Profile({base})}})"),
                "c.ron",
            )
            .unwrap();
        assert_eq!(model.profile("x").unwrap().reads, Reads::default());
        let err = model
            .load_str(
                &format!(
                    "Cost(profiles: {{\"x\": Profile({base},\n reads: Reads(strided: -1.0))}})"
                ),
                "c.ron",
            )
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.ron:2:"), "{err}");
        assert!(
            err.contains("`reads.strided` must be a finite number between 0 and"),
            "{err}"
        );
        // A [4, 8] f32 read transposed from [8, 4]: stride 4 elements = 16 bytes of a 64-byte
        // line, 12 of its 60 bytes past the first element skipped.
        let reads = Reads {
            strided: 10.0,
            ..Reads::default()
        };
        let map = IndexMap::contiguous(&[8, 4]).transpose(&[1, 0]);
        assert!((reads.extra_per_byte(&map, &[4, 8], 4) - 10.0 * 12.0 / 60.0).abs() < 1e-12);
        let cached = Reads {
            cache_bytes: 128.0,
            ..reads
        };
        assert_eq!(cached.extra_per_byte(&map, &[4, 8], 4), 0.0);
    }

    #[test]
    fn reduction_passes_load_default_and_are_checked() {
        let model = CostModel::defaults();
        assert_eq!(
            model.profile("cpu").unwrap().reductions,
            Reductions::default()
        );
        let h200 = model.profile("h200").unwrap().reductions;
        assert_eq!(h200.extra_launches, 2.0);
        // The LSTM backward's column sums: 1024 outputs of 256 rows are 4096 threads, 64x short
        // of 2^18, so (64)^0.4 = 5.28x slower when each moves 4 KiB or more (16 MiB); 4096
        // outputs 16384 threads, 16^0.4 = 3.03x; a sum of a [4096, 4096] row by row is
        // 4096 x 64 threads, enough.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        const MIB: f64 = 1048576.0;
        let threads = h200.pass_threads(1024, 256);
        assert_eq!(threads, 4096.0);
        assert!(close(
            h200.memory_factor(threads, 16.0 * MIB),
            64f64.powf(0.4)
        ));
        assert!(close(
            h200.memory_factor(threads, 64.0 * MIB),
            64f64.powf(0.4)
        ));
        let threads = h200.pass_threads(4096, 256);
        assert!(close(
            h200.memory_factor(threads, 64.0 * MIB),
            16f64.powf(0.4)
        ));
        assert_eq!(h200.pass_threads(4096, 4096), 262144.0);
        assert!(close(h200.memory_factor(262144.0, 256.0 * MIB), 1.0));
        // Fewer bytes a thread pay a share of it: 1 KiB a thread (4 MiB over 4096) a quarter
        // of 4 KiB, 0.25^1.5 = 1/8 of 5.28, which leaves 1; 2 KiB 5.28 / 2^1.5 = 1.87.
        assert!(close(h200.memory_factor(4096.0, 4.0 * MIB), 1.0));
        assert!(close(
            h200.memory_factor(4096.0, 8.0 * MIB),
            64f64.powf(0.4) / 2f64.powf(1.5)
        ));
        // Little's law (exponent 1) when a profile leaves the exponent out, whatever the
        // bytes when it leaves out `full_bytes_per_thread`.
        let linear = Reductions {
            saturating_threads: 24576.0,
            ..Reductions::default()
        };
        assert_eq!(
            linear.memory_factor(linear.pass_threads(1024, 256), 1.0),
            6.0
        );
        assert_eq!(h200.pass_threads(0, 256), f64::INFINITY);
        assert_eq!(h200.memory_factor(h200.pass_threads(0, 256), MIB), 1.0);
        assert_eq!(h200.memory_factor(h200.pass_threads(16, 0), MIB), 1.0);
        assert_eq!(h200.memory_factor(0.0, MIB), 1.0);
        assert_eq!(Reductions::default().memory_factor(1.0, MIB), 1.0);
        let base = "bandwidth_gbps: 1.0, launch_us: 1.0, pointwise_gflops: 1.0, matmul_gflops: {\"f32\": 1.0}";
        for (bad, field) in [
            ("per_thread: 0.5", "per_thread"),
            ("extra_launches: -1.0", "extra_launches"),
            ("saturating_threads: 1e300", "saturating_threads"),
            ("exponent: -0.5", "exponent"),
            ("full_bytes_per_thread: -1.0", "full_bytes_per_thread"),
            ("bytes_exponent: 5.0", "bytes_exponent"),
        ] {
            let err = CostModel::defaults()
                .load_str(
                    &format!(
                        "Cost(profiles: {{\"x\": Profile({base},\n reductions: Reductions({bad}))}})"
                    ),
                    "c.ron",
                )
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("c.ron:2:"), "{err}");
            assert!(
                err.contains(&format!("`reductions.{field}` must be")),
                "{err}"
            );
        }
    }

    #[test]
    fn errors_are_located_and_suggest() {
        let mut model = CostModel::defaults();
        let err = model
            .load_str(
                "Cost(profiles: {\n  \"x\": Profile(bandwidth_gbps: 1.0, launch_us: 1.0,\n    pointwise_gflops: 1.0, matmul_gflops: {\"f32\": 1.0},\n    weights: {\"tahn\": 2.0}),\n})",
                "c.ron",
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "c.ron:4:15: invalid rule: unknown weight `tahn` (did you mean `tanh`?); weights are given for add, sub, mul, div, neg, compare, select, min, max, abs, floor, exp, log, log1p, expm1, sqrt, rsqrt, tanh, erf, sin, cos, atan, pow, reduce"
        );
        let err = model
            .load_str(
                "Cost(profiles: {\"x\": Profile(bandwidth_gbps: 0.0, launch_us: 1.0, pointwise_gflops: 1.0, matmul_gflops: {\"f32\": 1.0})})",
                "c.ron",
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "c.ron:1:46: invalid rule: `bandwidth_gbps` must be a finite number > 0, found 0"
        );
        let err = model
            .load_str("Cost(profiles: {}, speed: 1)", "c.ron")
            .unwrap_err();
        assert!(
            err.to_string().starts_with("c.ron:1:20: RON syntax"),
            "{err}"
        );
        let err = model.profile("h100").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid rule: no cost profile `h100` (did you mean `h200`?); cost.ron defines cpu, h200"
        );
    }
}
