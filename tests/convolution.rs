//! ONNX `Conv`, `MaxPool`, `AveragePool` and `ConvTranspose` of random geometry (1 or 2
//! spatial axes, groups, strides, dilations, explicit pads or `auto_pad`, `ceil_mode`,
//! `count_include_pad`, `output_padding`),
//! imported and run on the reference evaluator and compiled for the CPU, against the
//! definition computed here by direct loops over each window.

use crate::common;

use common::kernel_cache::compiler;
use common::onnx_models::value_info;
use common::random_graph::{assert_same, rules};
use fusebox::backend::Executable;
use fusebox::backend::cuda::emit::EmitOptions;
use fusebox::backend::cuda::runtime::conv::ConvGeometry;
use fusebox::backend::cuda::runtime::plan::{DevicePlan, Libraries};

use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::onnx;
use fusebox::optimize::Options;
use fusebox::runner::prepare;
use fusebox::tensor::Tensor;
use onnx_protobuf::{AttributeProto, GraphProto, ModelProto, NodeProto};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use protobuf::Message;
use rand::{RngExt, SeedableRng};

/// Convolutions to cuDNN, epilogues after their GEMMs: the CUDA backend's default.
const CUDNN: Libraries = Libraries {
    cudnn: true,
    lt_epilogues: false,
};

/// One window op's geometry.
#[derive(Debug, Clone)]
struct Window {
    /// 0: Conv, 1: MaxPool, 2: AveragePool, 3: ConvTranspose.
    op: usize,
    batch: usize,
    channels: usize,
    /// Conv: output channels per group, and the groups.
    per_group: usize,
    groups: usize,
    spatial: Vec<usize>,
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    /// Before then after, per axis; `None` with `auto_pad` SAME_UPPER or SAME_LOWER.
    pads: Option<Vec<(usize, usize)>>,
    same_lower: bool,
    ceil: bool,
    include_pad: bool,
    /// ConvTranspose: added after the output on each axis, below its stride or dilation.
    output_padding: Vec<usize>,
}

fn windows() -> impl Strategy<Value = Window> {
    (
        (0..4usize, 1..3usize, 1..4usize, 1..3usize, 1..3usize),
        prop::collection::vec(
            (
                1..8usize,
                1..4usize,
                1..4usize,
                1..3usize,
                0..3usize,
                0..3usize,
            ),
            1..3,
        ),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        prop::collection::vec(0..3usize, 2),
    )
        .prop_map(
            |((op, batch, channels, per_group, groups), axes, flags, extra)| {
                let (auto, same_lower, ceil, include_pad) = flags;
                let spatial: Vec<usize> = axes
                    .iter()
                    .map(|&(n, k, _, d, b, a)| n.max((k - 1) * d + 1).max(b.max(a) + 1))
                    .collect();
                let kernel = axes.iter().map(|a| a.1).collect();
                let strides = axes.iter().map(|a| a.2).collect();
                let dilations = axes.iter().map(|a| a.3).collect();
                // Pads smaller than the window, as ONNX's reference and PyTorch require of pools.
                let pads = (!auto).then(|| {
                    axes.iter()
                        .map(|&(_, k, _, d, b, a)| {
                            let span = (k - 1) * d + 1;
                            (b.min(span / 2), a.min(span / 2))
                        })
                        .collect()
                });
                let output_padding = axes
                    .iter()
                    .zip(&extra)
                    .map(|(&(_, _, st, d, _, _), &e)| if op == 3 { e % st.max(d) } else { 0 })
                    .collect();
                Window {
                    op,
                    batch,
                    channels: channels * groups,
                    per_group,
                    groups: if op == 0 || op == 3 { groups } else { 1 },
                    spatial,
                    kernel,
                    strides,
                    dilations,
                    pads,
                    same_lower,
                    ceil: ceil && (op == 1 || op == 2),
                    include_pad,
                    output_padding,
                }
            },
        )
}

/// Convolutions big enough for the CPU GEMM to read B where it lies (see
/// [`Window::read_where_it_lies`]): 1 to 3 spatial axes, the last up to 120 long, so that
/// products have many column blocks, narrow last strips and, over 3 axes, long runs of
/// dropped columns; up to 20 output channels per group (a partial row strip), strides 1 to
/// 3 (mostly 1), dilations, pads or none, and groups.
fn large_windows() -> impl Strategy<Value = Window> {
    type Axis = (usize, usize, usize, usize, usize, usize);
    let axis = |size: std::ops::Range<usize>| {
        (size, 1..4usize, 1..3usize, 0..3usize, 0..3usize, 0..5usize)
    };
    (
        (1..3usize, 1..3usize, 1..21usize, 1..3usize),
        prop::collection::vec(axis(1..8), 0..3),
        axis(8..121),
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |((batch, channels, per_group, groups), outer, last, (auto, bare))| {
                let axes: Vec<Axis> = outer.into_iter().chain([last]).collect();
                Window {
                    op: 0,
                    batch,
                    channels: channels * groups,
                    per_group,
                    groups,
                    spatial: axes
                        .iter()
                        .map(|&(n, k, d, ..)| n.max((k - 1) * d + 1))
                        .collect(),
                    kernel: axes.iter().map(|a| a.1).collect(),
                    // Stride 1 three times in five, 2 and 3 once each.
                    strides: axes.iter().map(|a| a.5.saturating_sub(2) + 1).collect(),
                    dilations: axes.iter().map(|a| a.2).collect(),
                    pads: match (auto, bare) {
                        (_, true) => Some(vec![(0, 0); axes.len()]),
                        (false, false) => Some(axes.iter().map(|a| (a.3, a.4)).collect()),
                        (true, false) => None,
                    },
                    same_lower: batch == 2,
                    ceil: false,
                    include_pad: false,
                    output_padding: vec![0; axes.len()],
                }
            },
        )
}

fn ints(name: &str, v: &[usize]) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INTS.into();
    a.ints = v.iter().map(|&x| x as i64).collect();
    a
}

fn int(name: &str, v: i64) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
    a.i = v;
    a
}

impl Window {
    fn out_channels(&self) -> usize {
        match self.op {
            0 | 3 => self.per_group * self.groups,
            _ => self.channels,
        }
    }

    /// ConvTranspose per axis: padding before and after (negative where `auto_pad` grows the
    /// output), and the output size, as ONNX defines them; `None` where an output size would
    /// be below 1.
    fn transposed_geometry(&self) -> Option<Vec<(i64, i64, usize)>> {
        (0..self.spatial.len())
            .map(|i| {
                let span = ((self.kernel[i] - 1) * self.dilations[i] + 1) as i64;
                let (n, s) = (self.spatial[i] as i64, self.strides[i] as i64);
                let full = s * (n - 1) + self.output_padding[i] as i64 + span;
                let (b, a) = match &self.pads {
                    Some(p) => (p[i].0 as i64, p[i].1 as i64),
                    None => {
                        let total = full - n * s;
                        let small = total.div_euclid(2);
                        match self.same_lower {
                            false => (small, total - small),
                            true => (total - small, small),
                        }
                    }
                };
                let out = full - b - a;
                (out >= 1).then_some((b, a, out as usize))
            })
            .collect()
    }

    /// Whether the CPU GEMM reads this convolution's B where it lies rather than packing it
    /// (`fb_gemm_direct_span` and `fb_gemm_image` in `gemm.c`, `phases.rs`): over a padding
    /// or at a stride, from slabs of the image (its phase split at a stride) where the
    /// positions span at most twice as many quotient offsets as there are positions; at
    /// stride 1 without padding, in place where there is at least one 48-column strip of
    /// positions and they span at most a quarter more offsets.
    fn read_where_it_lies(&self) -> bool {
        if self.op != 0 {
            return false;
        }
        let geometry = self.geometry();
        let quotients: Vec<usize> = (0..self.spatial.len())
            .map(|i| (self.spatial[i] + geometry[i].0 + geometry[i].1).div_ceil(self.strides[i]))
            .collect();
        let positions: usize = geometry.iter().map(|g| g.2).product();
        let (mut span, mut pitch) = (1, 1);
        for i in (0..quotients.len()).rev() {
            span += (geometry[i].2 - 1) * pitch;
            pitch *= quotients[i];
        }
        let padded = geometry.iter().any(|g| g.0 + g.1 > 0);
        match padded || self.strides.iter().any(|&s| s > 1) {
            true => span <= 2 * positions,
            false => positions >= 48 && span <= positions + positions / 4,
        }
    }

    /// Per axis: padding before and after, and the output size, as ONNX defines them.
    fn geometry(&self) -> Vec<(usize, usize, usize)> {
        (0..self.spatial.len())
            .map(|i| {
                let span = (self.kernel[i] - 1) * self.dilations[i] + 1;
                let (n, s) = (self.spatial[i], self.strides[i]);
                let (b, a) = match &self.pads {
                    Some(p) => p[i],
                    None => {
                        let out = n.div_ceil(s);
                        let total = ((out - 1) * s + span).saturating_sub(n);
                        let small = total / 2;
                        match self.same_lower {
                            false => (small, total - small),
                            true => (total - small, small),
                        }
                    }
                };
                let room = n + b + a - span;
                let mut out = match self.ceil {
                    true => room.div_ceil(s) + 1,
                    false => room / s + 1,
                };
                if self.ceil && (out - 1) * s >= n + b {
                    out -= 1;
                }
                (b, a, out)
            })
            .collect()
    }

    fn model(&self) -> ModelProto {
        let mut node = NodeProto::new();
        node.op_type = ["Conv", "MaxPool", "AveragePool", "ConvTranspose"][self.op].into();
        node.name = "window".into();
        node.input = vec!["x".into()];
        if self.op == 0 || self.op == 3 {
            node.input.push("w".into());
            node.attribute.push(int("group", self.groups as i64));
        } else {
            node.attribute.push(ints("kernel_shape", &self.kernel));
        }
        node.output = vec!["y".into()];
        node.attribute.push(ints("strides", &self.strides));
        node.attribute.push(ints("dilations", &self.dilations));
        match &self.pads {
            Some(p) => {
                let pads: Vec<usize> = p.iter().map(|x| x.0).chain(p.iter().map(|x| x.1)).collect();
                node.attribute.push(ints("pads", &pads));
            }
            None => {
                let mut a = AttributeProto::new();
                a.name = "auto_pad".into();
                a.type_ = onnx_protobuf::attribute_proto::AttributeType::STRING.into();
                a.s = if self.same_lower {
                    "SAME_LOWER"
                } else {
                    "SAME_UPPER"
                }
                .into();
                node.attribute.push(a);
            }
        }
        if self.op == 1 || self.op == 2 {
            node.attribute.push(int("ceil_mode", self.ceil as i64));
        }
        if self.op == 3 {
            node.attribute
                .push(ints("output_padding", &self.output_padding));
        }
        if self.op == 2 {
            node.attribute
                .push(int("count_include_pad", self.include_pad as i64));
        }
        let mut graph = GraphProto::new();
        graph.name = "window".into();
        let mut x = vec![self.batch as i64, self.channels as i64];
        x.extend(self.spatial.iter().map(|&n| n as i64));
        graph.input.push(value_info("x", 1, Some(&x)));
        if self.op == 0 || self.op == 3 {
            let mut w = match self.op {
                0 => vec![
                    self.out_channels() as i64,
                    (self.channels / self.groups) as i64,
                ],
                _ => vec![self.channels as i64, self.per_group as i64],
            };
            w.extend(self.kernel.iter().map(|&k| k as i64));
            graph.input.push(value_info("w", 1, Some(&w)));
        }
        graph.output.push(value_info("y", 1, None));
        graph.node.push(node);
        common::onnx_models::model_of(graph, 19)
    }

    /// The output by its definition: for each output element, its window's elements inside
    /// the input (padding is 0 for a sum, absent for a maximum), in f64.
    fn direct(&self, x: &Tensor, w: Option<&Tensor>) -> (Vec<usize>, Vec<f64>) {
        if self.op == 3 {
            return self.transposed(x, w.expect("a weight"));
        }
        let geometry = self.geometry();
        let s = self.spatial.len();
        let (xv, wv) = (x.values(), w.map(|w| w.values()));
        let m = self.out_channels();
        let mut shape = vec![self.batch, m];
        shape.extend(geometry.iter().map(|g| g.2));
        let positions: usize = geometry.iter().map(|g| g.2).product();
        let offsets: usize = self.kernel.iter().product();
        let per_in = self.channels / self.groups;
        let mut out = Vec::with_capacity(self.batch * m * positions);
        let unravel = |mut i: usize, sizes: &[usize]| {
            let mut c = vec![0; sizes.len()];
            for d in (0..sizes.len()).rev() {
                c[d] = i % sizes[d];
                i /= sizes[d];
            }
            c
        };
        let plane: usize = self.spatial.iter().product();
        for n in 0..self.batch {
            for oc in 0..m {
                for p in 0..positions {
                    let o = unravel(p, &geometry.iter().map(|g| g.2).collect::<Vec<_>>());
                    let (mut acc, mut max, mut count) = (0.0f64, f64::NEG_INFINITY, 0usize);
                    let mut nan = false;
                    for k in 0..offsets {
                        let kk = unravel(k, &self.kernel);
                        // Position in the padded input, and whether it lies in the input, in
                        // the padding, or past it (ceil mode's overhang).
                        let mut inside = true;
                        let mut padded_in = true;
                        let mut at = 0usize;
                        for i in 0..s {
                            let q = o[i] * self.strides[i] + kk[i] * self.dilations[i];
                            let (b, a, _) = geometry[i];
                            padded_in &= q < self.spatial[i] + b + a;
                            if q < b || q >= b + self.spatial[i] {
                                inside = false;
                            } else {
                                at = at * self.spatial[i] + (q - b);
                            }
                        }
                        if self.op == 2 && (if self.include_pad { padded_in } else { inside }) {
                            count += 1;
                        }
                        if !inside {
                            continue;
                        }
                        match self.op {
                            0 => {
                                let g = oc / self.per_group;
                                for ci in 0..per_in {
                                    let c = g * per_in + ci;
                                    let xi = (n * self.channels + c) * plane + at;
                                    let wi = (oc * per_in + ci) * offsets + k;
                                    acc += xv[xi] * wv.as_ref().unwrap()[wi];
                                }
                            }
                            _ => {
                                let v = xv[(n * self.channels + oc) * plane + at];
                                nan |= v.is_nan();
                                max = max.max(v);
                                acc += v;
                            }
                        }
                    }
                    out.push(match self.op {
                        0 => acc,
                        1 if nan => f64::NAN,
                        1 => max,
                        _ => acc / count as f64,
                    });
                }
            }
        }
        (shape, out)
    }
}

impl Window {
    /// ConvTranspose by its definition: each input element, times each weight offset `k`,
    /// added at output position `i · stride + k · dilation − pad_before` where that lies in
    /// the output, in f64.
    fn transposed(&self, x: &Tensor, w: &Tensor) -> (Vec<usize>, Vec<f64>) {
        let geometry = self.transposed_geometry().expect("an output");
        let s = self.spatial.len();
        let (xv, wv) = (x.values(), w.values());
        let m = self.out_channels();
        let sizes: Vec<usize> = geometry.iter().map(|g| g.2).collect();
        let mut shape = vec![self.batch, m];
        shape.extend(&sizes);
        let positions: usize = sizes.iter().product();
        let plane: usize = self.spatial.iter().product();
        let offsets: usize = self.kernel.iter().product();
        let per_in = self.channels / self.groups;
        let mut out = vec![0.0f64; self.batch * m * positions];
        let unravel = |mut i: usize, sizes: &[usize]| {
            let mut c = vec![0; sizes.len()];
            for d in (0..sizes.len()).rev() {
                c[d] = i % sizes[d];
                i /= sizes[d];
            }
            c
        };
        for n in 0..self.batch {
            for c in 0..self.channels {
                let g = c / per_in;
                for p in 0..plane {
                    let at = unravel(p, &self.spatial);
                    for k in 0..offsets {
                        let kk = unravel(k, &self.kernel);
                        let mut o = 0usize;
                        let mut inside = true;
                        for i in 0..s {
                            let q = (at[i] * self.strides[i] + kk[i] * self.dilations[i]) as i64
                                - geometry[i].0;
                            inside &= q >= 0 && (q as usize) < sizes[i];
                            o = o * sizes[i] + q.max(0) as usize;
                        }
                        if !inside {
                            continue;
                        }
                        let xval = xv[(n * self.channels + c) * plane + p];
                        for ml in 0..self.per_group {
                            let oc = g * self.per_group + ml;
                            let wval = wv[(c * self.per_group + ml) * offsets + k];
                            out[(n * m + oc) * positions + o] += xval * wval;
                        }
                    }
                }
            }
        }
        (shape, out)
    }
}

/// `window` imported with inputs from `seed` (multiples of 1/4 in [-2, 2), so every product
/// and sum of a window is exact in f32), and its output by [`Window::direct`].
fn case(window: &Window, seed: u64) -> Result<(fusebox::graph::Graph, Tensors, Tensor), String> {
    let dir = std::env::temp_dir().join(format!("fusebox-windows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("w{seed}.onnx"));
    std::fs::write(&path, window.model().write_to_bytes().unwrap()).unwrap();
    let rules = rules();
    let imported = onnx::import(&path, &rules.ops, &rules.onnx).map_err(|e| e.to_string())?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // The importer's constants (padding slabs, pool counts) are stored values of the graph.
    let mut inputs: Tensors = imported.values.clone().into_iter().collect();
    for input in imported
        .graph
        .inputs
        .iter()
        .filter(|i| ["x", "w"].contains(&i.name.as_str()))
    {
        let n: usize = input.shape.iter().product();
        let values = (0..n)
            .map(|_| f64::from(rng.random_range(-8i32..8)) / 4.0)
            .collect();
        inputs.insert(
            input.name.clone(),
            Tensor::from_values(DType::F32, &input.shape, values).unwrap(),
        );
    }
    let (shape, values) = window.direct(&inputs["x"], inputs.get("w"));
    let want = Tensor::from_values(DType::F32, &shape, values).unwrap();
    Ok((imported.graph, inputs, want))
}

/// `window` run on the reference evaluator and the CPU, against [`Window::direct`].
fn agrees(window: &Window, seed: u64) -> Result<(), String> {
    let rules = rules();
    let (graph, inputs, want) = case(window, seed)?;
    let got = fusebox::eval::evaluate(&graph, &rules.ops, &inputs).map_err(|e| e.to_string())?;
    assert_same("reference y", &want, &got["y"])?;
    let mut prepared =
        prepare(&graph, rules, &Options::default(), compiler()).map_err(|e| e.to_string())?;
    let got = prepared
        .executable
        .run_tensors(&inputs)
        .map_err(|e| e.to_string())?;
    assert_same("cpu y", &want, &got["y"])
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::random_graph::cases(64),
        ..ProptestConfig::default()
    })]

    /// Random convolutions, pools and transposed convolutions equal their definition on
    /// the reference and the CPU.
    #[test]
    fn random_windows_match_their_definition(window in windows(), seed in 0u64..1000) {
        prop_assume!(window.op != 3 || window.transposed_geometry().is_some());
        agrees(&window, seed).map_err(|e| TestCaseError::fail(format!("{e}\n{window:?}")))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::random_graph::cases(24),
        ..ProptestConfig::default()
    })]

    /// Random convolutions of the size the GEMM reads where they lie equal their definition
    /// on the reference and the CPU.
    #[test]
    fn large_convolutions_match_their_definition(window in large_windows(), seed in 0u64..1000) {
        agrees(&window, seed).map_err(|e| TestCaseError::fail(format!("{e}\n{window:?}")))?;
    }
}

/// Most large windows are read where they lie, over every spatial rank, padded or not, at
/// stride 1 and above, with and without groups, and some with a last strip narrower than 48
/// or several column blocks.
#[test]
fn large_windows_are_mostly_read_where_they_lie() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = large_windows();
    let all: Vec<Window> = (0..400)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    let direct: Vec<&Window> = all.iter().filter(|w| w.read_where_it_lies()).collect();
    let positions = |w: &Window| w.geometry().iter().map(|g| g.2).product::<usize>();
    assert!(direct.len() > 200, "{}", direct.len());
    for rank in 1..=3 {
        assert!(
            direct.iter().filter(|w| w.spatial.len() == rank).count() > 20,
            "rank {rank}"
        );
    }
    assert!(direct.iter().filter(|w| w.groups > 1).count() > 50);
    assert!(direct.iter().filter(|w| w.per_group > 8).count() > 50);
    assert!(direct.iter().filter(|w| positions(w) > 384).count() > 30);
    assert!(direct.iter().filter(|w| positions(w) % 48 != 0).count() > 150);
    assert!(
        direct
            .iter()
            .filter(|w| w.dilations.iter().any(|&d| d > 1))
            .count()
            > 50
    );
    let strided = |w: &&&Window| w.strides.iter().any(|&s| s > 1);
    assert!(direct.iter().filter(strided).count() > 50);
    let bare = |w: &&&Window| {
        w.pads
            .as_ref()
            .is_some_and(|p| p.iter().all(|&(b, a)| b + a == 0))
    };
    assert!(direct.iter().filter(bare).filter(|w| !strided(w)).count() > 20);
}

/// The geometry the generator covers, in fair numbers over 400 windows: each op, two spatial
/// axes, groups, strides and dilations above 1, `auto_pad` both ways, `ceil_mode` and
/// `count_include_pad`.
#[test]
fn random_windows_cover_their_forms() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = windows();
    let all: Vec<Window> = (0..400)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    let count = |f: &dyn Fn(&Window) -> bool| all.iter().filter(|w| f(w)).count();
    for op in 0..4 {
        assert!(count(&|w| w.op == op) > 70, "op {op}");
    }
    assert!(count(&|w| w.op == 3 && w.groups > 1) > 20);
    assert!(count(&|w| w.op == 3 && w.pads.is_none()) > 20);
    assert!(count(&|w| w.output_padding.iter().any(|&p| p > 0)) > 20);
    assert!(count(&|w| w.spatial.len() == 2) > 100);
    assert!(count(&|w| w.groups > 1) > 40);
    assert!(count(&|w| w.strides.iter().any(|&s| s > 1)) > 100);
    assert!(count(&|w| w.dilations.iter().any(|&d| d > 1)) > 100);
    assert!(count(&|w| w.pads.is_none() && w.same_lower) > 40);
    assert!(count(&|w| w.pads.is_none() && !w.same_lower) > 40);
    assert!(count(&|w| w.ceil) > 60);
    assert!(count(&|w| w.op == 2 && w.include_pad) > 30);
}

impl Window {
    /// The convolution cuDNN runs for this Conv where its symmetric padding (the padding
    /// before, on both sides) gives the same output: what the CUDA plan's recognizer must
    /// find, with a kernel axis of one offset at dilation 1 and an axis of one output position
    /// at the stride past the room after its first window (both say nothing of those).
    fn cudnn_geometry(&self) -> Option<ConvGeometry> {
        let geometry = self.geometry();
        let mut g = ConvGeometry {
            image: [self.batch, self.channels]
                .into_iter()
                .chain(self.spatial.iter().copied())
                .collect(),
            out_channels: self.per_group * self.groups,
            groups: self.groups,
            kernel: self.kernel.clone(),
            pads: Vec::new(),
            strides: self.strides.clone(),
            dilations: self.dilations.clone(),
            out: geometry.iter().map(|g| g.2).collect(),
        };
        for (i, &(before, _, out)) in geometry.iter().enumerate() {
            let span = (self.kernel[i] - 1) * self.dilations[i] + 1;
            let room = (self.spatial[i] + 2 * before).checked_sub(span)?;
            if self.kernel[i] == 1 {
                g.dilations[i] = 1;
            }
            if out == 1 {
                g.strides[i] = room + 1;
            }
            if room / g.strides[i] + 1 != out {
                return None;
            }
            g.pads.push(before);
        }
        Some(g)
    }
}

/// The first `count` windows that `keep` accepts, drawn by [`windows`] and [`large_windows`]
/// in turn from a fixed seed.
fn sampled_windows(count: usize, keep: impl Fn(&Window) -> bool) -> Vec<Window> {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (small, large) = (windows(), large_windows());
    (0..)
        .map(|i| match i % 2 {
            0 => small.new_tree(&mut runner).unwrap().current(),
            _ => large.new_tree(&mut runner).unwrap().current(),
        })
        .filter(|w| keep(w))
        .take(count)
        .collect()
}

/// On the GPU a Conv is one cuDNN convolution of exactly its geometry, in f32 and under bf16
/// AMP, wherever its product reads the image through windows and cuDNN's symmetric padding
/// gives its output; never a convolution of another geometry. Checked on the device plan
/// (no GPU needed) over 500 random convolutions; they run on a GPU in
/// [`gpu_convolutions_match_their_definition`].
#[test]
fn cuda_plans_each_convolution_for_cudnn_with_its_geometry() {
    let all = sampled_windows(500, |w| w.op == 0);
    let rules = rules();
    let dir = std::env::temp_dir().join(format!("fusebox-cudnn-plans-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut expected, mut found) = (0, 0);
    let mut covered = std::collections::BTreeSet::new();
    for (i, window) in all.iter().enumerate() {
        let path = dir.join(format!("w{i}.onnx"));
        std::fs::write(&path, window.model().write_to_bytes().unwrap()).unwrap();
        let imported = onnx::import(&path, &rules.ops, &rules.onnx).unwrap();
        let want = window.cudnn_geometry();
        let plan_for = |amp: Option<&str>| {
            let options = Options {
                amp: amp.map(String::from),
                profile: "h200".into(),
                ..Options::default()
            };
            let (program, _, _) =
                fusebox::runner::lower_graph(&imported.graph, rules, &options).unwrap();
            let plan = DevicePlan::new(&program, &EmitOptions::default(), 132, CUDNN).unwrap();
            let off = DevicePlan::new(&program, &EmitOptions::default(), 132, Libraries::default())
                .unwrap();
            (plan, off)
        };
        // f16 convolutions stay GEMMs (`conv::convolves`).
        assert_eq!(plan_for(Some("f16")).0.convolutions().count(), 0);
        for amp in [None, Some("bf16")] {
            let (plan, off) = plan_for(amp);
            let convs: Vec<(ConvGeometry, DType)> =
                plan.convolutions().map(|(g, d)| (g.clone(), d)).collect();
            let what = format!("{window:?} amp {amp:?}: {convs:?}");
            let dtype = if amp.is_some() {
                DType::BF16
            } else {
                DType::F32
            };
            match (&want, &convs[..]) {
                (Some(want), [(got, d)]) => {
                    assert_eq!((got, *d), (want, dtype), "{what}");
                    found += 1;
                    covered.insert((
                        window.spatial.len(),
                        window.groups > 1,
                        window.strides.iter().any(|&s| s > 1),
                        want.pads.iter().any(|&p| p > 0),
                    ));
                }
                (_, []) => {}
                _ => panic!("a convolution cuDNN cannot run as it is, or two: {what}"),
            }
            expected += usize::from(want.is_some());
            // With cuDNN off, every product is a GEMM again.
            assert_eq!(off.convolutions().count(), 0);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    // Those left to cuBLAS read their image without windows (a 1x1 kernel at stride 1
    // without padding, or a 1-D one whose columns are one stride).
    eprintln!("cuDNN plans {found} of {expected} convolutions it could run");
    assert!(found * 10 > expected * 8, "{found} of {expected}");
    for rank in 1..=3 {
        for form in [
            (false, false, false),
            (true, true, true),
            (false, true, true),
        ] {
            let key = (rank, form.0, form.1, form.2);
            assert!(covered.contains(&key), "{key:?} not covered: {covered:?}");
        }
    }
}

/// On a GPU (`--ignored`): random convolutions and transposed convolutions, through cuDNN
/// (plain and replayed from a CUDA graph) and as im2col GEMMs through cuBLAS
/// (`gemm_convolutions`), in f32 and under bf16 and f16 AMP, equal their definition: exactly
/// up to f32 rounding (the sums are exact in f32, so only an inexact algorithm such as
/// Winograd's could move them) and, under AMP, the definition rounded once to the narrow
/// dtype, within one of its steps; and cuDNN takes every convolution the plan gives it.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_convolutions_match_their_definition() {
    use fusebox::backend::cuda::runtime::CudaOptions;
    let all = sampled_windows(48, |w| {
        w.op == 0 || (w.op == 3 && w.transposed_geometry().is_some())
    });
    let rules = rules();
    let (mut cases, mut through_cudnn) = (0, 0);
    for (seed, window) in all.iter().enumerate() {
        let (graph, inputs, want) = case(window, seed as u64).unwrap();
        for amp in [None, Some(DType::BF16), Some(DType::F16)] {
            let options = Options {
                amp: amp.map(|d| d.to_string()),
                profile: "h200".into(),
                ..Options::default()
            };
            let (want, rtol) = match amp {
                None => (want.clone(), common::random_graph::tolerance(DType::F32)),
                Some(narrow) => {
                    let rounded = want.values().iter().map(|&v| narrow.round(v)).collect();
                    let t = Tensor::from_values(DType::F32, want.shape(), rounded).unwrap();
                    (t, common::random_graph::tolerance(narrow))
                }
            };
            let (program, _, _) = fusebox::runner::lower_graph(&graph, rules, &options).unwrap();
            let planned = DevicePlan::new(&program, &EmitOptions::default(), 132, CUDNN)
                .unwrap()
                .convolutions()
                .count();
            for (gemm_convolutions, cuda_graph) in [(false, false), (false, true), (true, false)] {
                let cuda = CudaOptions {
                    gemm_convolutions,
                    cuda_graph,
                    ..CudaOptions::default()
                };
                let what =
                    format!("{window:?} amp {amp:?} gemm {gemm_convolutions} graph {cuda_graph}");
                let mut prepared = prepare(&graph, rules, &options, &cuda)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let convs = prepared.executable.plan().convolutions().count();
                // cuDNN took every convolution planned for it (none fell back to a GEMM).
                let want_convs = if gemm_convolutions { 0 } else { planned };
                assert_eq!(convs, want_convs, "{what}");
                if !gemm_convolutions && !cuda_graph {
                    through_cudnn += usize::from(convs > 0);
                    cases += 1;
                }
                // Twice: a capture replayed, and the plain run before it.
                for run in 0..2 {
                    let got = prepared
                        .executable
                        .run_tensors(&inputs)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    common::random_graph::assert_close("gpu y", &want, &got["y"], rtol)
                        .unwrap_or_else(|e| panic!("{what}, run {run}: {e}"));
                }
            }
        }
    }
    eprintln!("{cases} GPU runs, {through_cudnn} through cuDNN");
    assert!(
        through_cudnn * 3 > cases,
        "{through_cudnn} of {cases} through cuDNN"
    );
}
