//! ONNX's recurrent ops (`LSTM`, `GRU`, `RNN`), unrolled over their time steps.
//!
//! Each is written out as the ONNX ops of its equations (the specification's), which the op
//! table imports like any others, so their meaning stays in `rules/onnx.ron` and the
//! catalogue: the input projection of every step is one `MatMul` before the loop, and each
//! step is the recurrent `MatMul` and pointwise gate arithmetic that fusion makes one kernel.
//! Every direction (forward, reverse, bidirectional), initial states, sequence lengths (a
//! batch element past its length keeps its state, and its outputs there are 0), both layouts,
//! `clip`, the activations the specification lists (with their alpha and beta), LSTM's
//! peepholes and `input_forget`, and GRU's `linear_before_reset` are imported.

use super::proto::Attr;
use super::structural::{Attrs, float_attr, int_attr};
use super::{ImportError, Importer, Imports, Val};
use crate::rules::Builtin;
use crate::rules::builtin::BuiltinAttrs;
use onnx_protobuf::NodeProto;
use std::collections::HashMap;

/// The most catalogue nodes one step of one direction imports as (an LSTM with peepholes,
/// `clip` and sequence lengths makes about 50).
const NODES_PER_STEP: usize = 64;

/// Which recurrent cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    /// Gates per step, stacked in the weights: LSTM `iofc`, GRU `zrh`, RNN one.
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }

    /// The activations per direction when the node names none.
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Rnn => &["Tanh"],
        }
    }
}

pub(super) fn lstm(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    unroll(im, node, attrs, out, Cell::Lstm)
}

pub(super) fn gru(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    unroll(im, node, attrs, out, Cell::Gru)
}

pub(super) fn rnn(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
) -> Imports<Vec<Val>> {
    unroll(im, node, attrs, out, Cell::Rnn)
}

/// One activation of the node's list, with its alpha and beta where it takes them.
#[derive(Debug, Clone)]
struct Activation {
    name: String,
    alpha: Option<f64>,
    beta: Option<f64>,
}

/// What every step of one direction reads.
struct Direction {
    /// The input projection of every step, `[seq, batch, gates·hidden]`, biases added.
    projected: Val,
    /// The recurrent weights transposed, `[hidden, gates·hidden]`.
    recurrent: Val,
    /// GRU with `linear_before_reset`: the recurrent bias of the hidden gate, `[hidden]`.
    hidden_bias: Option<Val>,
    /// LSTM peepholes `i`, `o`, `f`, each `[hidden]`.
    peepholes: Option<[Val; 3]>,
    activations: Vec<Activation>,
    reverse: bool,
}

/// A recurrent node's inputs, checked against each other, in the sequence-first layout.
struct Inputs {
    x: Val,
    w: Val,
    r: Val,
    bias: Option<Val>,
    peepholes: Option<Val>,
    h0: Option<Val>,
    c0: Option<Val>,
    /// Per direction, whether it runs backwards.
    directions: Vec<bool>,
    activations: Vec<Vec<Activation>>,
    linear_before_reset: bool,
    /// The batch-first layout (`layout` 1), turned back on the outputs.
    batch_first: bool,
}

fn unroll(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
    cell: Cell,
) -> Imports<Vec<Val>> {
    let (inputs, options) = read(im, node, attrs, out, cell)?;
    let [seq, batch, _] = inputs.x.shape()[..] else {
        return Err(ImportError::Internal("X of rank 3"));
    };
    let no_state = Val::floats(
        inputs.x.dtype(),
        &[batch, options.hidden],
        vec![0.0; batch * options.hidden],
    )?;
    let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
    for (d, &reverse) in inputs.directions.iter().enumerate() {
        let name = format!("{out}.d{d}");
        let direction = prepare(im, &inputs, &options, d, reverse, &name)?;
        let mut state = |s: &Option<Val>| match s {
            Some(s) => take(im, s, d, &format!("{name}.state")),
            None => Ok(no_state.clone()),
        };
        let (h, c) = (state(&inputs.h0)?, state(&inputs.c0)?);
        let (y, h, c) = steps(im, &options, &direction, h, c, seq, &name)?;
        ys.push(y);
        hs.push(h);
        cs.push(c);
    }
    // Y is [seq, dirs, batch, hidden]; Y_h and Y_c [dirs, batch, hidden].
    let stack = |im: &mut Importer, parts: &[Val], axis: usize, name: &str| -> Imports {
        let mut lifted = Vec::new();
        for p in parts {
            let mut shape = p.shape().to_vec();
            shape.insert(axis, 1);
            lifted.push(im.reshape(p, &shape, name)?);
        }
        im.concat(&lifted, axis, name)
    };
    let mut y = stack(im, &ys, 1, &format!("{out}.y"))?;
    let mut yh = stack(im, &hs, 0, &format!("{out}.y_h"))?;
    let mut yc = stack(im, &cs, 0, &format!("{out}.y_c"))?;
    if inputs.batch_first {
        y = im.transpose(&y, &[2, 0, 1, 3], out)?;
        yh = im.transpose(&yh, &[1, 0, 2], out)?;
        yc = im.transpose(&yc, &[1, 0, 2], out)?;
    }
    let mut outputs = vec![y, yh];
    if cell == Cell::Lstm {
        outputs.push(yc);
    }
    Ok(outputs)
}

/// Direction `d` of `v` (whose first axis is the direction), without that axis.
fn take(im: &mut Importer, v: &Val, d: usize, name: &str) -> Imports {
    let part = im.slice(v, 0, d as i64, d as i64 + 1, 1, name)?;
    let shape = v.shape()[1..].to_vec();
    im.reshape(&part, &shape, name)
}

/// The node's inputs and attributes, checked: shapes that agree, a known direction, the
/// activations, and a sequence short enough to unroll.
fn read(
    im: &mut Importer,
    node: &NodeProto,
    attrs: &Attrs,
    out: &str,
    cell: Cell,
) -> Imports<(Inputs, Options)> {
    let lstm_input = |im: &Importer, i: usize| match cell {
        Cell::Lstm => im.input(node, i),
        _ => Ok(None),
    };
    let mut x = im.required(node, 0)?;
    let (w, r) = (im.required(node, 1)?, im.required(node, 2)?);
    let (bias, lens, mut h0) = (im.input(node, 3)?, im.input(node, 4)?, im.input(node, 5)?);
    let (mut c0, peepholes) = (lstm_input(im, 6)?, lstm_input(im, 7)?);
    let batch_first = int_attr(attrs, "layout").unwrap_or(0) == 1;
    if batch_first {
        x = im.transpose(&x, &[1, 0, 2], out)?;
        h0 = h0.map(|h| im.transpose(&h, &[1, 0, 2], out)).transpose()?;
        c0 = c0.map(|c| im.transpose(&c, &[1, 0, 2], out)).transpose()?;
    }
    let directions = match string_attr(attrs, "direction").unwrap_or("forward") {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => {
            return Err(ImportError::Malformed(format!(
                "unknown direction `{other}`"
            )));
        }
    };
    let [seq, batch, input] = x.shape()[..] else {
        return Err(ImportError::Malformed(format!(
            "X must have rank 3, not {:?}",
            x.shape()
        )));
    };
    let gates = cell.gates();
    let hidden = match (int_attr(attrs, "hidden_size"), r.shape()) {
        (Some(h), _) if h > 0 => h as usize,
        (None, [_, _, h]) => *h,
        _ => {
            return Err(ImportError::Malformed(
                "hidden_size must be positive".into(),
            ));
        }
    };
    let dirs = directions.len();
    // Unrolling is an expansion like a composite's: bounded before it starts.
    let bound = seq
        .saturating_mul(dirs)
        .saturating_mul(NODES_PER_STEP)
        .saturating_add(im.graph.nodes.len());
    if bound > crate::graph::expand::MAX_EXPANDED_NODES {
        return Err(ImportError::Unsupported(format!(
            "unrolling {seq} steps in {dirs} direction(s) may make the graph more than {} nodes",
            crate::graph::expand::MAX_EXPANDED_NODES
        )));
    }
    let expect = |v: &Val, shape: &[usize], what: &str| {
        if v.shape() == shape {
            Ok(())
        } else {
            Err(ImportError::Malformed(format!(
                "{what} has shape {:?}, not {shape:?}",
                v.shape()
            )))
        }
    };
    expect(&w, &[dirs, gates * hidden, input], "W")?;
    expect(&r, &[dirs, gates * hidden, hidden], "R")?;
    if let Some(b) = &bias {
        expect(b, &[dirs, 2 * gates * hidden], "B")?;
    }
    if let Some(p) = &peepholes {
        expect(p, &[dirs, 3 * hidden], "P")?;
    }
    for state in [&h0, &c0].into_iter().flatten() {
        expect(state, &[dirs, batch, hidden], "an initial state")?;
    }
    if let Some(l) = &lens {
        expect(l, &[batch], "sequence_lens")?;
    }
    let options = Options {
        cell,
        hidden,
        clip: float_attr(attrs, "clip"),
        input_forget: int_attr(attrs, "input_forget").unwrap_or(0) != 0,
        lens,
    };
    let inputs = Inputs {
        x,
        w,
        r,
        bias,
        peepholes,
        h0,
        c0,
        activations: activations(attrs, cell, dirs)?,
        directions,
        linear_before_reset: int_attr(attrs, "linear_before_reset").unwrap_or(0) != 0,
        batch_first,
    };
    Ok((inputs, options))
}

/// What the steps of direction `d` read: the input projection of every step with the biases
/// added, the recurrent weights transposed, the peepholes.
fn prepare(
    im: &mut Importer,
    inputs: &Inputs,
    o: &Options,
    d: usize,
    reverse: bool,
    name: &str,
) -> Imports<Direction> {
    let (hidden, gates) = (o.hidden, o.cell.gates());
    let [seq, batch, input] = inputs.x.shape()[..] else {
        return Err(ImportError::Internal("X of rank 3"));
    };
    let range = |im: &mut Importer, v: &Val, from: usize, to: usize| {
        im.slice(v, 0, from as i64, to as i64, 1, name)
    };
    let wd = take(im, &inputs.w, d, &format!("{name}.w"))?;
    let rd = take(im, &inputs.r, d, &format!("{name}.r"))?;
    let wt = im.transpose(&wd, &[1, 0], name)?;
    let rt = im.transpose(&rd, &[1, 0], name)?;
    let flat = im.reshape(&inputs.x, &[seq * batch, input], name)?;
    let mut projected = im.onnx("MatMul", &[&flat, &wt], &[], &format!("{name}.xw"))?;
    let mut hidden_bias = None;
    if let Some(b) = &inputs.bias {
        let bd = take(im, b, d, &format!("{name}.b"))?;
        let wb = range(im, &bd, 0, gates * hidden)?;
        let mut rb = range(im, &bd, gates * hidden, 2 * gates * hidden)?;
        if o.cell == Cell::Gru && inputs.linear_before_reset {
            // The hidden gate's recurrent bias is added inside the reset product.
            let rb_zr = range(im, &rb, 0, 2 * hidden)?;
            hidden_bias = Some(range(im, &rb, 2 * hidden, 3 * hidden)?);
            let none = Val::floats(bd.dtype(), &[hidden], vec![0.0; hidden])?;
            rb = im.concat(&[rb_zr, none], 0, name)?;
        }
        let both = im.onnx("Add", &[&wb, &rb], &[], &format!("{name}.bias"))?;
        projected = im.onnx("Add", &[&projected, &both], &[], &format!("{name}.xwb"))?;
    }
    let projected = im.reshape(&projected, &[seq, batch, gates * hidden], name)?;
    let peepholes = match &inputs.peepholes {
        Some(p) => {
            let pd = take(im, p, d, &format!("{name}.p"))?;
            let part = |im: &mut Importer, k: usize| range(im, &pd, k * hidden, (k + 1) * hidden);
            Some([part(im, 0)?, part(im, 1)?, part(im, 2)?])
        }
        None => None,
    };
    Ok(Direction {
        projected,
        recurrent: rt,
        hidden_bias,
        peepholes,
        activations: inputs.activations[d].clone(),
        reverse,
    })
}

/// What every step of every direction shares.
struct Options {
    cell: Cell,
    hidden: usize,
    clip: Option<f64>,
    input_forget: bool,
    lens: Option<Val>,
}

/// The steps of one direction from states `h` and `c`: the outputs stacked `[seq, batch,
/// hidden]` and the last states.
fn steps(
    im: &mut Importer,
    o: &Options,
    d: &Direction,
    mut h: Val,
    mut c: Val,
    seq: usize,
    name: &str,
) -> Imports<(Val, Val, Val)> {
    let batch = h.shape()[0];
    let hidden = o.hidden;
    let mut ys: Vec<Option<Val>> = vec![None; seq];
    let order: Vec<usize> = if d.reverse {
        (0..seq).rev().collect()
    } else {
        (0..seq).collect()
    };
    for t in order {
        let at = format!("{name}.t{t}");
        let xt = im.slice(&d.projected, 0, t as i64, t as i64 + 1, 1, &at)?;
        let xt = im.reshape(&xt, &[batch, o.cell.gates() * hidden], &at)?;
        let hr = im.onnx("MatMul", &[&h, &d.recurrent], &[], &format!("{at}.hr"))?;
        let gate = |im: &mut Importer, v: &Val, k: usize| {
            im.slice(v, 1, (k * hidden) as i64, ((k + 1) * hidden) as i64, 1, &at)
        };
        let (h_new, c_new) = match o.cell {
            Cell::Lstm => {
                let pre = im.onnx("Add", &[&xt, &hr], &[], &format!("{at}.gates"))?;
                let part = |im: &mut Importer, k: usize, peep: Option<(&Val, &Val)>| -> Imports {
                    let mut g = gate(im, &pre, k)?;
                    if let Some((p, state)) = peep {
                        let pc = im.onnx("Mul", &[p, state], &[], &at)?;
                        g = im.onnx("Add", &[&g, &pc], &[], &at)?;
                    }
                    Ok(g)
                };
                let peep = |k: usize| d.peepholes.as_ref().map(|p| &p[k]);
                let gi = part(im, 0, peep(0).map(|p| (p, &c)))?;
                let i = activate(im, o, &d.activations[0], &gi, &at)?;
                let f = if o.input_forget {
                    let one = Val::floats(h.dtype(), &[], vec![1.0])?;
                    im.onnx("Sub", &[&one, &i], &[], &at)?
                } else {
                    let gf = part(im, 2, peep(2).map(|p| (p, &c)))?;
                    activate(im, o, &d.activations[0], &gf, &at)?
                };
                let gc = part(im, 3, None)?;
                let cand = activate(im, o, &d.activations[1], &gc, &at)?;
                let fc = im.onnx("Mul", &[&f, &c], &[], &at)?;
                let ic = im.onnx("Mul", &[&i, &cand], &[], &at)?;
                let c_new = im.onnx("Add", &[&fc, &ic], &[], &format!("{at}.c"))?;
                let go = part(im, 1, peep(1).map(|p| (p, &c_new)))?;
                let out_gate = activate(im, o, &d.activations[0], &go, &at)?;
                let hc = activate(im, o, &d.activations[2], &c_new, &at)?;
                (
                    im.onnx("Mul", &[&out_gate, &hc], &[], &format!("{at}.h"))?,
                    c_new,
                )
            }
            Cell::Gru => {
                let xz = gate(im, &xt, 0)?;
                let xr = gate(im, &xt, 1)?;
                let xh = gate(im, &xt, 2)?;
                let hz = gate(im, &hr, 0)?;
                let hrr = gate(im, &hr, 1)?;
                let sz = im.onnx("Add", &[&xz, &hz], &[], &at)?;
                let z = activate(im, o, &d.activations[0], &sz, &at)?;
                let sr = im.onnx("Add", &[&xr, &hrr], &[], &at)?;
                let rg = activate(im, o, &d.activations[0], &sr, &at)?;
                let recurrent_h = match &d.hidden_bias {
                    // linear_before_reset: r ⊙ (H·Rhᵀ + Rbh).
                    Some(rbh) => {
                        let hh = gate(im, &hr, 2)?;
                        let hb = im.onnx("Add", &[&hh, rbh], &[], &at)?;
                        im.onnx("Mul", &[&rg, &hb], &[], &at)?
                    }
                    // (r ⊙ H)·Rhᵀ: the hidden gate's third of the recurrent weights.
                    None => {
                        let rh = im.onnx("Mul", &[&rg, &h], &[], &at)?;
                        let rt_h = im.slice(
                            &d.recurrent,
                            1,
                            (2 * hidden) as i64,
                            (3 * hidden) as i64,
                            1,
                            &at,
                        )?;
                        im.onnx("MatMul", &[&rh, &rt_h], &[], &format!("{at}.rh"))?
                    }
                };
                let sh = im.onnx("Add", &[&xh, &recurrent_h], &[], &at)?;
                let cand = activate(im, o, &d.activations[1], &sh, &at)?;
                // (1 - z) ⊙ h~ + z ⊙ H = h~ + z ⊙ (H - h~).
                let diff = im.onnx("Sub", &[&h, &cand], &[], &at)?;
                let zd = im.onnx("Mul", &[&z, &diff], &[], &at)?;
                (
                    im.onnx("Add", &[&cand, &zd], &[], &format!("{at}.h"))?,
                    c.clone(),
                )
            }
            Cell::Rnn => {
                let s = im.onnx("Add", &[&xt, &hr], &[], &at)?;
                (activate(im, o, &d.activations[0], &s, &at)?, c.clone())
            }
        };
        let y = match &o.lens {
            // Past its length a batch element keeps its states and outputs 0.
            Some(lens) => {
                let step = Val::ints(lens.dtype(), &[], vec![t as i64])?;
                let valid = im.onnx("Less", &[&step, lens], &[], &at)?;
                let valid = im.reshape(&valid, &[batch, 1], &at)?;
                let none = Val::floats(h.dtype(), &[], vec![0.0])?;
                h = im.onnx("Where", &[&valid, &h_new, &h], &[], &at)?;
                c = im.onnx("Where", &[&valid, &c_new, &c], &[], &at)?;
                im.onnx("Where", &[&valid, &h_new, &none], &[], &at)?
            }
            None => {
                h = h_new.clone();
                c = c_new;
                h_new
            }
        };
        ys[t] = Some(im.reshape(&y, &[1, batch, hidden], &at)?);
    }
    let ys: Vec<Val> = ys.into_iter().flatten().collect();
    let y = im.concat(&ys, 0, &format!("{name}.y"))?;
    Ok((y, h, c))
}

/// `activation` of `x`, after `clip` where the node asks for it, as the ONNX op of that name.
fn activate(im: &mut Importer, o: &Options, a: &Activation, x: &Val, name: &str) -> Imports {
    let x = match o.clip {
        Some(clip) => {
            let low = Val::floats(x.dtype(), &[], vec![-clip])?;
            let high = Val::floats(x.dtype(), &[], vec![clip])?;
            im.onnx("Clip", &[x, &low, &high], &[], name)?
        }
        None => x.clone(),
    };
    let alpha = |default: f64| ("alpha", Attr::Float(a.alpha.unwrap_or(default)));
    let beta = |default: f64| ("beta", Attr::Float(a.beta.unwrap_or(default)));
    match a.name.as_str() {
        "Sigmoid" | "Tanh" | "Relu" | "Softsign" | "Softplus" => im.onnx(&a.name, &[&x], &[], name),
        "LeakyRelu" => im.onnx("LeakyRelu", &[&x], &[alpha(0.01)], name),
        "ThresholdedRelu" => {
            // x where x > alpha, else 0.
            let threshold = Val::floats(x.dtype(), &[], vec![a.alpha.unwrap_or(1.0)])?;
            let above = im.onnx("Greater", &[&x, &threshold], &[], name)?;
            let none = Val::floats(x.dtype(), &[], vec![0.0])?;
            im.onnx("Where", &[&above, &x, &none], &[], name)
        }
        "Elu" => im.onnx("Elu", &[&x], &[alpha(1.0)], name),
        "HardSigmoid" => im.onnx("HardSigmoid", &[&x], &[alpha(0.2), beta(0.5)], name),
        // alpha·x + beta, and alpha·tanh(beta·x): the two activations of the recurrent ops'
        // specification that are no ONNX ops.
        "Affine" => {
            let s = Val::floats(x.dtype(), &[], vec![a.alpha.unwrap_or(1.0)])?;
            let b = Val::floats(x.dtype(), &[], vec![a.beta.unwrap_or(0.0)])?;
            let sx = im.onnx("Mul", &[&s, &x], &[], name)?;
            im.onnx("Add", &[&sx, &b], &[], name)
        }
        "ScaledTanh" => {
            let s = Val::floats(x.dtype(), &[], vec![a.alpha.unwrap_or(1.0)])?;
            let b = Val::floats(x.dtype(), &[], vec![a.beta.unwrap_or(1.0)])?;
            let bx = im.onnx("Mul", &[&b, &x], &[], name)?;
            let t = im.onnx("Tanh", &[&bx], &[], name)?;
            im.onnx("Mul", &[&s, &t], &[], name)
        }
        other => Err(ImportError::Unsupported(format!("activation `{other}`"))),
    }
}

/// The activations of each direction: the node's list (each direction's in turn), else the
/// cell's defaults, with the alphas and betas consumed in the list's order.
fn activations(attrs: &Attrs, cell: Cell, dirs: usize) -> Imports<Vec<Vec<Activation>>> {
    let per = cell.default_activations().len();
    let names: Vec<String> = match attrs.get("activations") {
        Some(Attr::Strs(names)) => names.clone(),
        Some(Attr::Str(name)) => vec![name.clone()],
        _ => (0..dirs)
            .flat_map(|_| cell.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per * dirs {
        return Err(ImportError::Malformed(format!(
            "{} activations given where {} directions need {}",
            names.len(),
            dirs,
            per * dirs
        )));
    }
    let floats = |key: &str| match attrs.get(key) {
        Some(Attr::Floats(v)) => v.clone(),
        Some(Attr::Float(v)) => vec![*v],
        _ => Vec::new(),
    };
    let (alphas, betas) = (floats("activation_alpha"), floats("activation_beta"));
    let list: Vec<Activation> = names
        .into_iter()
        .enumerate()
        .map(|(k, name)| Activation {
            name,
            alpha: alphas.get(k).copied(),
            beta: betas.get(k).copied(),
        })
        .collect();
    Ok(list.chunks(per).map(<[Activation]>::to_vec).collect())
}

fn string_attr<'a>(attrs: &'a Attrs, name: &str) -> Option<&'a str> {
    match attrs.get(name) {
        Some(Attr::Str(s)) => Some(s),
        _ => None,
    }
}

impl Importer<'_> {
    /// The first output of ONNX op `op` on `args` with `attrs`, imported as a node of the
    /// model would be (through the op table, or the importer's own handler).
    pub(super) fn onnx(
        &mut self,
        op: &str,
        args: &[&Val],
        attrs: &[(&str, Attr)],
        name: &str,
    ) -> Imports {
        let mut node = NodeProto::new();
        node.op_type = op.to_string();
        let mut bound = Vec::new();
        for (k, &arg) in args.iter().enumerate() {
            // Names no ONNX model gives a value: a NUL cannot be written in one.
            let key = format!("\u{0}{name}\u{0}{k}");
            self.env.insert(key.clone(), arg.clone());
            node.input.push(key.clone());
            bound.push(key);
        }
        node.output.push(name.to_string());
        let attrs: HashMap<String, Attr> = attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let result = self.apply(&node, &attrs, name);
        for key in bound {
            self.env.remove(&key);
        }
        result?
            .into_iter()
            .next()
            .ok_or(ImportError::Internal("an op without outputs"))
    }

    fn transpose(&mut self, x: &Val, perm: &[i64], name: &str) -> Imports {
        let attrs = BuiltinAttrs::Transpose {
            perm: Some(perm.to_vec()),
        };
        self.emit_builtin(
            Builtin::Transpose,
            std::slice::from_ref(x),
            attrs,
            name,
            false,
        )
    }

    fn concat(&mut self, parts: &[Val], axis: usize, name: &str) -> Imports {
        if let [only] = parts {
            return Ok(only.clone());
        }
        let attrs = BuiltinAttrs::Concat { axis: axis as i64 };
        self.emit_builtin(Builtin::Concat, parts, attrs, name, false)
    }
}
