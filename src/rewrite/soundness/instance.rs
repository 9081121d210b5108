//! Instances: drawing dtypes, shapes, attribute values and constants that satisfy a rule's
//! conditions, and building both sides as graphs.

use super::*;

/// What a tensor variable is bound to.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TensorVar {
    pub(super) ty: TensorType,
    /// `Some(v)`: a constant (a `const` node, broadcast to the shape); `None`: a graph input.
    pub(super) constant: Option<f64>,
}

/// One assignment of every variable of a rule.
#[derive(Debug, Clone, Default)]
pub(super) struct Instance {
    pub(super) tensors: BTreeMap<Var, TensorVar>,
    pub(super) attrs: BTreeMap<Var, Leaf>,
}

/// Where a variable first occurs, which says what kind of value suits it.
#[derive(Debug, Clone)]
pub(super) enum Slot {
    /// An operand, with the dtype class the op accepts there.
    Operand(Option<DtypeClass>),
    /// An attribute, by name (`shape`, `axes`, `perm`, `axis`, `value`, …), and whether the
    /// op lets it be absent (`sum` without `axes` reduces everything).
    Attr(String, bool),
}

/// Why a draw was discarded.
pub(super) struct Reject {
    pub(super) kind: &'static str,
    pub(super) detail: String,
}

pub(super) fn reject(kind: &'static str, detail: impl Into<String>) -> Reject {
    Reject {
        kind,
        detail: detail.into(),
    }
}

/// The left-hand side of an instance, checked, matched and with its conditions satisfied.
pub(super) struct Prepared {
    graph: Graph,
    ty: TensorType,
}

/// Everything about a rule direction that does not change between draws.
pub(super) struct Plan<'r> {
    rule: &'r Rule,
    catalogue: &'r Catalogue,
    pub(super) from: &'r Pattern<ENode>,
    pub(super) to: &'r Pattern<ENode>,
    tensor_vars: Vec<Var>,
    attr_vars: Vec<(Var, AttrType)>,
    slots: HashMap<Var, Slot>,
    /// Values a condition wants a tensor variable to be constant with (empty: any constant).
    constants: HashMap<Var, Vec<f64>>,
    /// Op applications in both sides: each may round once, which sizes the tolerance.
    ops: usize,
    /// Whether either side sums (reductions, matmul): the sign of a zero sum is the
    /// accumulator's convention, not a property of the rule.
    sums: bool,
}

impl<'r> Plan<'r> {
    pub(super) fn new(rule: &'r Rule, direction: Direction, catalogue: &'r Catalogue) -> Plan<'r> {
        let (from, to) = match direction {
            Direction::Forward => (&rule.lhs, &rule.rhs),
            Direction::Reverse => (&rule.rhs, &rule.lhs),
        };
        let mut tensor_vars = Vec::new();
        let mut attr_vars = Vec::new();
        for (var, kind) in &rule.vars {
            match kind {
                VarKind::Tensor => tensor_vars.push(*var),
                VarKind::Attr(ty) => attr_vars.push((*var, *ty)),
            }
        }
        let mut slots = HashMap::new();
        for pattern in [from, to] {
            collect_slots(pattern, catalogue, &mut slots);
        }
        let mut constants: HashMap<Var, Vec<f64>> = HashMap::new();
        for cond in &rule.when {
            match cond {
                Condition::ConstEq(v, c) => {
                    if let Ok(v) = v.parse() {
                        constants.entry(v).or_default().push(*c);
                    }
                }
                Condition::IsConst(v) => {
                    if let Ok(v) = v.parse() {
                        constants.entry(v).or_default();
                    }
                }
                Condition::ConstPowerOfTwo(v) => {
                    if let Ok(v) = v.parse() {
                        constants.entry(v).or_default().extend([
                            2.0,
                            0.5,
                            4.0,
                            -2.0,
                            0.25,
                            1.0,
                            1024.0,
                            2f64.powi(-20),
                        ]);
                    }
                }
                _ => {}
            }
        }
        let mut ops = 0;
        let mut sums = false;
        for pattern in [from, to] {
            for node in pattern.ast.as_ref() {
                if let ENodeOrVar::ENode(ENode::Op(name, _)) = node {
                    ops += 1;
                    let kind = catalogue.get(name.as_str()).map(|op| op.kind());
                    sums |= matches!(kind, Some(OpKind::Reduction | OpKind::Opaque));
                }
            }
        }
        Plan {
            rule,
            catalogue,
            from,
            to,
            tensor_vars,
            attr_vars,
            slots,
            constants,
            ops,
            sums,
        }
    }

    /// Draws dtypes, shapes, constants and attribute values.
    pub(super) fn generate(&self, rng: &mut ChaCha8Rng) -> Instance {
        let base_dtype = pick_dtype(rng);
        let base_shape = pick_shape(rng);
        let pool = shape_pool(&base_shape);
        let mut instance = Instance::default();
        for &var in &self.tensor_vars {
            let class = match self.slots.get(&var) {
                Some(Slot::Operand(class)) => *class,
                _ => None,
            };
            let dtype = dtype_for(class, base_dtype, rng);
            let shape = if rng.random_bool(0.55) {
                base_shape.clone()
            } else {
                pool[rng.random_range(0..pool.len())].clone()
            };
            let constant = match self.constants.get(&var) {
                Some(wanted) if rng.random_bool(0.85) => {
                    Some(if !wanted.is_empty() && rng.random_bool(0.8) {
                        wanted[rng.random_range(0..wanted.len())]
                    } else {
                        special_constant(rng)
                    })
                }
                _ if rng.random_bool(0.08) => Some(special_constant(rng)),
                _ => None,
            };
            instance.tensors.insert(
                var,
                TensorVar {
                    ty: TensorType { dtype, shape },
                    constant,
                },
            );
        }
        for &(var, ty) in &self.attr_vars {
            let (slot, optional) = match self.slots.get(&var) {
                Some(Slot::Attr(name, optional)) => (name.as_str(), *optional),
                _ => ("", false),
            };
            let leaf = if optional && rng.random_bool(0.15) {
                Leaf::Absent
            } else {
                attr_value(ty, slot, &instance, &pool, base_dtype, rng)
            };
            instance.attrs.insert(var, leaf);
        }
        for cond in &self.rule.when {
            if rng.random_bool(0.8) {
                apply_hint(cond, &mut instance, &base_shape, rng);
            }
        }
        instance
    }

    /// Builds and checks the left-hand side, matches the pattern in the e-graph and decides
    /// the conditions there, exactly as saturation would.
    /// The attributes the rule computes are added to `instance`, for the right-hand side.
    pub(super) fn prepare(&self, instance: &mut Instance) -> Result<Prepared, Reject> {
        let graph = build_graph(self.from, instance, self.catalogue, "lhs")
            .map_err(|e| reject("ill-typed left-hand sides", e.to_string()))?;
        let dag = Dag::from_graph(&graph, self.catalogue)
            .map_err(|e| reject("ill-typed left-hand sides", e.to_string()))?;
        let lhs_eval_size: usize = dag.nodes.iter().map(|n| numel(&n.ty.shape)).sum();
        if lhs_eval_size > 1 << 16 {
            return Err(reject("instances too large", "over 65536 elements"));
        }
        let ty = dag.ty(dag.outputs[0].value).clone();
        let mut egraph = new_egraph(&dag, self.catalogue);
        // Every input counts as fixed: `Fixed` conditions say where work runs, not what a
        // value is, so the rules they guard are checked like any other.
        egraph.analysis.fixed = dag
            .inputs
            .iter()
            .map(|i| egg::Symbol::from(i.name.as_str()))
            .collect();
        let seeded = seed(&mut egraph, &dag);
        egraph.rebuild();
        let root = egraph.find(seeded.outputs[0].1);
        let subst = self.subst(instance, &dag, &seeded, &mut egraph);
        let matched = self.from.search_eclass(&egraph, root).is_some_and(|m| {
            m.substs.iter().any(|s| {
                self.matched_vars()
                    .all(|v| s.get(v).map(|&id| egraph.find(id)) == subst.get(v).copied())
            })
        });
        if !matched {
            return Err(reject(
                "draws the pattern did not match",
                format!("{} in the e-graph", self.from.ast),
            ));
        }
        if !self.rule.conditions_hold(&egraph, root, &subst) {
            return Err(reject(
                "draws failing the conditions",
                format!("{} with {}", describe_instance(self.from, instance), ty),
            ));
        }
        // The computations run on the match as the applier runs them; their leaves are what
        // the right-hand side is built with.
        if !self.rule.compute.is_empty() {
            let Some(extended) = self.rule.compute_attrs(&mut egraph, &subst) else {
                return Err(reject(
                    "draws the computations declined",
                    describe_instance(self.from, instance),
                ));
            };
            for var in self.rule.computed.keys() {
                if let Some(&id) = extended.get(*var)
                    && let crate::egraph::ClassData::Attr(leaf) = &egraph[id].data
                {
                    instance.attrs.insert(*var, leaf.clone());
                }
            }
        }
        Ok(Prepared { graph, ty })
    }

    pub(super) fn matched_vars(&self) -> impl Iterator<Item = Var> + '_ {
        self.from.vars().into_iter()
    }

    /// The e-class of every variable: inputs and constants by their value, attributes by
    /// their leaf.
    pub(super) fn subst(
        &self,
        instance: &Instance,
        dag: &Dag,
        seeded: &crate::egraph::Seeded,
        egraph: &mut FuseGraph,
    ) -> Subst {
        let mut subst = Subst::with_capacity(instance.tensors.len() + instance.attrs.len());
        for (var, binding) in &instance.tensors {
            let name = var_name(*var);
            let id = if binding.constant.is_some() {
                dag.nodes
                    .iter()
                    .position(|n| n.name == name)
                    .map(|i| seeded.node_classes[i])
            } else {
                dag.inputs
                    .iter()
                    .position(|i| i.name == name)
                    .map(|i| seeded.input_classes[i])
            };
            if let Some(id) = id {
                subst.insert(*var, egraph.find(id));
            }
        }
        for (var, leaf) in &instance.attrs {
            let id = egraph.add(ENode::Attr(leaf.clone()));
            subst.insert(*var, egraph.find(id));
        }
        subst
    }

    /// Evaluates both sides on several value sets; the first failure, made small, if any.
    pub(super) fn try_instance(
        &self,
        instance: &Instance,
        prepared: &Prepared,
        options: &CheckOptions,
        rng: &mut ChaCha8Rng,
    ) -> Option<Counterexample> {
        let rhs = match build_graph(self.to, instance, self.catalogue, "rhs") {
            Ok(g) => g,
            Err(why) => {
                return Some(self.counterexample(instance, Failure::RhsIllTyped(why.to_string())));
            }
        };
        let rhs_types = match check(&rhs, self.catalogue) {
            Ok(t) => t,
            Err(e) => {
                return Some(
                    self.counterexample(instance, Failure::RhsIllTyped(e.kind.to_string())),
                );
            }
        };
        let rhs_ty = &rhs_types[&rhs.outputs[0]];
        if *rhs_ty != prepared.ty {
            return Some(self.counterexample(
                instance,
                Failure::TypeChanged {
                    lhs: prepared.ty.clone(),
                    rhs: rhs_ty.clone(),
                },
            ));
        }
        for k in 0..options.values_per_instance.max(1) {
            // A rule claimed for finite values only is not tried on ±Inf and NaN inputs.
            if self.rule.finite_only && k % 4 == 3 {
                continue;
            }
            let inputs = draw_inputs(instance, k, rng);
            if let Outcome::Fails(..) = self.run(prepared, &rhs, &inputs) {
                let inputs = self.shrink(prepared, &rhs, inputs);
                // Evaluation is deterministic and shrinking keeps only failing inputs.
                let Outcome::Fails(failed) = self.run(prepared, &rhs, &inputs) else {
                    continue;
                };
                let (failure, l, r) = *failed;
                let mut cx = self.counterexample(instance, failure);
                cx.inputs = instance
                    .tensors
                    .iter()
                    .map(|(v, b)| {
                        let name = var_name(*v);
                        let t = match b.constant {
                            None => inputs[&name].clone(),
                            Some(c) => Tensor::from_array(
                                b.ty.dtype,
                                ArrayD::from_elem(IxDyn(&b.ty.shape), c),
                            ),
                        };
                        (name, t)
                    })
                    .collect();
                cx.lhs_value = l;
                cx.rhs_value = r;
                return Some(cx);
            }
        }
        None
    }

    /// Runs both sides on one set of inputs.
    pub(super) fn run(&self, prepared: &Prepared, rhs: &Graph, inputs: &Tensors) -> Outcome {
        let Ok(left) = eval::evaluate_all(&prepared.graph, self.catalogue, inputs) else {
            return Outcome::Skipped;
        };
        let right = match eval::evaluate_all(rhs, self.catalogue, inputs) {
            Ok(r) => r,
            Err(e) => {
                return Outcome::Fails(Box::new((
                    Failure::RhsEvalFailed(e.to_string()),
                    left.get(&prepared.graph.outputs[0]).cloned(),
                    None,
                )));
            }
        };
        // Outside a `finite_only` rule's claim (see `Comparison`): a computed value that
        // underflowed.
        let underflows = |values: &Tensors| {
            values
                .iter()
                .any(|(name, t)| !inputs.contains_key(name) && holds_subnormal(t))
        };
        if self.rule.finite_only && (underflows(&left) || underflows(&right)) {
            return Outcome::Skipped;
        }
        let l = &left[&prepared.graph.outputs[0]];
        let r = &right[&rhs.outputs[0]];
        let comparison = Comparison {
            ops: self.ops,
            sums: self.sums,
            finite_only: self.rule.finite_only,
        };
        let terms: Vec<Tensor> = [(&prepared.graph, &left), (rhs, &right)]
            .into_iter()
            .flat_map(|(graph, values)| contraction_terms(graph, values, self.catalogue))
            .collect();
        let values = left.values().chain(right.values()).chain(&terms);
        match comparison.first_difference(l, r, values) {
            Some(failure) => Outcome::Fails(Box::new((failure, Some(l.clone()), Some(r.clone())))),
            None => Outcome::Holds,
        }
    }

    /// Replaces input elements with simple values while the rule still fails.
    pub(super) fn shrink(&self, prepared: &Prepared, rhs: &Graph, mut inputs: Tensors) -> Tensors {
        let mut names: Vec<String> = inputs.keys().cloned().collect();
        names.sort();
        for name in names {
            let len = inputs[&name].len();
            let dtype = inputs[&name].dtype;
            for i in 0..len {
                let current = match &inputs[&name].data {
                    Data::Float(a) => a.as_slice().expect("standard layout")[i],
                    Data::Int(a) => a.as_slice().expect("standard layout")[i] as f64,
                };
                for &candidate in simple_values(dtype) {
                    if candidate.to_bits() == current.to_bits() {
                        break;
                    }
                    let mut trial = inputs.clone();
                    let t = trial.get_mut(&name).expect("present");
                    match &mut t.data {
                        Data::Float(a) => a.as_slice_mut().expect("standard layout")[i] = candidate,
                        Data::Int(a) => {
                            a.as_slice_mut().expect("standard layout")[i] =
                                crate::tensor::float_to_int(dtype, candidate)
                        }
                    }
                    if let Outcome::Fails(..) = self.run(prepared, rhs, &trial) {
                        inputs = trial;
                        break;
                    }
                }
            }
        }
        inputs
    }

    pub(super) fn counterexample(&self, instance: &Instance, failure: Failure) -> Counterexample {
        let mut bindings = Vec::new();
        for (var, b) in &instance.tensors {
            let what = match b.constant {
                Some(c) => format!("the constant {} as {}", element(b.ty.dtype, c), b.ty),
                None => format!("input `{}`: {}", var_name(*var), b.ty),
            };
            bindings.push((var.to_string(), what));
        }
        for (var, leaf) in &instance.attrs {
            bindings.push((var.to_string(), leaf.to_string()));
        }
        Counterexample {
            failure,
            lhs: describe_instance(self.from, instance),
            rhs: describe_instance(self.to, instance),
            bindings,
            inputs: Vec::new(),
            lhs_value: None,
            rhs_value: None,
        }
    }
}

pub(super) enum Outcome {
    Holds,
    /// The left-hand side could not be evaluated on these values (nothing to compare).
    Skipped,
    /// How, with both sides' values where they exist (boxed: the other variants are empty).
    Fails(Box<(Failure, Option<Tensor>, Option<Tensor>)>),
}

/// Records where each variable first occurs, to draw values that suit it.
pub(super) fn collect_slots(
    pattern: &Pattern<ENode>,
    catalogue: &Catalogue,
    slots: &mut HashMap<Var, Slot>,
) {
    let ast = pattern.ast.as_ref();
    for node in ast {
        let ENodeOrVar::ENode(ENode::Op(name, children)) = node else {
            continue;
        };
        let Some(op) = catalogue.get(name.as_str()) else {
            continue;
        };
        let Some((operands, attrs)) = split_children(op, children) else {
            continue;
        };
        for (i, id) in operands.iter().enumerate() {
            if let ENodeOrVar::Var(v) = &ast[usize::from(*id)] {
                let class = op.spec.accepts.get(op.operand_name(i)).copied();
                slots.entry(*v).or_insert(Slot::Operand(class));
            }
        }
        for (spec, id) in op.spec.attrs.iter().zip(attrs) {
            if let ENodeOrVar::Var(v) = &ast[usize::from(*id)] {
                slots
                    .entry(*v)
                    .or_insert_with(|| Slot::Attr(spec.name.clone(), spec.optional));
            }
        }
    }
}

/// The graph name of a variable: `?x` is `x`.
pub(super) fn var_name(var: Var) -> String {
    let s = var.to_string();
    s.strip_prefix('?').unwrap_or(&s).to_string()
}

/// Mostly the common float types, now and then integers and bool (rules must hold, or
/// exclude them by their conditions, for every dtype).
pub(super) fn pick_dtype(rng: &mut ChaCha8Rng) -> DType {
    pub(super) const WEIGHTED: [(DType, u32); 12] = [
        (DType::F32, 16),
        (DType::F16, 8),
        (DType::BF16, 6),
        (DType::F64, 4),
        (DType::I32, 2),
        (DType::I64, 2),
        (DType::Bool, 2),
        (DType::I8, 1),
        (DType::U8, 1),
        (DType::I16, 1),
        (DType::U16, 1),
        (DType::U32, 1),
    ];
    let total: u32 = WEIGHTED.iter().map(|(_, w)| w).sum();
    let mut k = rng.random_range(0..total);
    for (d, w) in WEIGHTED {
        if k < w {
            return d;
        }
        k -= w;
    }
    DType::F32
}

pub(super) const ALL_DTYPES: [DType; 12] = DType::ALL;
pub(super) const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

pub(super) fn dtype_for(class: Option<DtypeClass>, base: DType, rng: &mut ChaCha8Rng) -> DType {
    let admitted = |d: DType| class.is_none_or(|c| c.admits(d));
    if admitted(base) && rng.random_bool(0.8) {
        return base;
    }
    let choices: Vec<DType> = ALL_DTYPES.into_iter().filter(|&d| admitted(d)).collect();
    if choices.is_empty() {
        return base;
    }
    choices[rng.random_range(0..choices.len())]
}

/// A base shape: mostly rank 1–3 with small dims, sometimes a scalar, now and then an empty
/// or an all-ones dimension.
pub(super) fn pick_shape(rng: &mut ChaCha8Rng) -> Shape {
    let rank = match rng.random_range(0..20) {
        0..2 => 0,
        2..7 => 1,
        7..16 => 2,
        _ => 3,
    };
    (0..rank)
        .map(|_| match rng.random_range(0..40) {
            0 => 0,
            1..4 => 1,
            _ => rng.random_range(2..=4),
        })
        .collect()
}

/// Shapes related to `base` by broadcasting: itself, each dim set to 1, its suffixes, `[1]`,
/// `[]` and all ones.
pub(super) fn shape_pool(base: &[usize]) -> Vec<Shape> {
    let mut pool = vec![base.to_vec()];
    for i in 0..base.len() {
        let mut s = base.to_vec();
        s[i] = 1;
        pool.push(s);
        pool.push(base[i + 1..].to_vec());
    }
    pool.push(vec![1]);
    pool.push(Vec::new());
    pool.push(vec![1; base.len()]);
    pool.dedup();
    pool
}

/// Constants rules care about: the identities, signs, powers of two and extremes.
pub(super) fn special_constant(rng: &mut ChaCha8Rng) -> f64 {
    pub(super) const VALUES: [f64; 14] = [
        0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -2.0, 3.0, 0.25, 1e30, -1e30, 1e-30, 0.1, 1.5,
    ];
    if rng.random_bool(0.85) {
        VALUES[rng.random_range(0..VALUES.len())]
    } else {
        rng.random_range(-4.0..4.0)
    }
}

/// A value for an attribute variable, suited to the attribute it fills.
pub(super) fn attr_value(
    ty: AttrType,
    slot: &str,
    instance: &Instance,
    pool: &[Shape],
    base_dtype: DType,
    rng: &mut ChaCha8Rng,
) -> Leaf {
    let tensor_shapes: Vec<&Shape> = instance.tensors.values().map(|t| &t.ty.shape).collect();
    let some_rank = if tensor_shapes.is_empty() {
        2
    } else {
        tensor_shapes[rng.random_range(0..tensor_shapes.len())].len()
    };
    match ty {
        AttrType::Float => Leaf::num(special_constant(rng)),
        AttrType::Bool => Leaf::Bool(rng.random_bool(0.5)),
        AttrType::DType => Leaf::DType(if rng.random_bool(0.5) {
            base_dtype
        } else {
            ALL_DTYPES[rng.random_range(0..ALL_DTYPES.len())]
        }),
        AttrType::Int => {
            let r = some_rank.max(1) as i64;
            Leaf::num(match slot {
                "axis" => rng.random_range(-r..r),
                "step" => rng.random_range(1..=3),
                "start" | "end" => rng.random_range(-3..=4),
                _ => rng.random_range(-2..=3),
            } as f64)
        }
        AttrType::Ints => Leaf::Ints(match slot {
            "axes" => {
                let r = some_rank as i64;
                let mut axes: Vec<i64> = (0..r).filter(|_| rng.random_bool(0.5)).collect();
                if rng.random_bool(0.3) {
                    for a in &mut axes {
                        *a -= r;
                    }
                }
                axes
            }
            "perm" => {
                let mut perm: Vec<i64> = (0..some_rank as i64).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, rng.random_range(0..=i));
                }
                perm
            }
            _ => {
                let mut choices: Vec<&Shape> = pool.iter().collect();
                choices.extend(tensor_shapes.iter().copied());
                let s = choices[rng.random_range(0..choices.len())];
                let mut s: Vec<i64> = s.iter().map(|&d| d as i64).collect();
                // Reshape targets keep the element count: the dims reversed, flattened, or
                // with one inferred (-1).
                if slot == "shape" {
                    match rng.random_range(0..10) {
                        0 => s.reverse(),
                        1 => s = vec![s.iter().product()],
                        2 if !s.is_empty() => {
                            let i = rng.random_range(0..s.len());
                            s[i] = -1;
                        }
                        _ => {}
                    }
                }
                s
            }
        }),
    }
}

/// The dtype of a tensor variable or a dtype attribute variable.
pub(super) fn dtype_of(instance: &Instance, var: Var) -> Option<DType> {
    if let Some(t) = instance.tensors.get(&var) {
        return Some(t.ty.dtype);
    }
    match instance.attrs.get(&var) {
        Some(Leaf::DType(d)) => Some(*d),
        _ => None,
    }
}

pub(super) fn set_dtype(instance: &mut Instance, var: Var, dtype: DType) {
    if let Some(t) = instance.tensors.get_mut(&var) {
        t.ty.dtype = dtype;
    } else if let Some(leaf @ Leaf::DType(_)) = instance.attrs.get_mut(&var) {
        *leaf = Leaf::DType(dtype);
    }
}

/// The shape of a tensor variable or an `Ints` attribute variable (when non-negative).
pub(super) fn shape_of(instance: &Instance, var: Var) -> Option<Shape> {
    if let Some(t) = instance.tensors.get(&var) {
        return Some(t.ty.shape.clone());
    }
    match instance.attrs.get(&var) {
        Some(Leaf::Ints(v)) => v.iter().map(|&d| usize::try_from(d).ok()).collect(),
        _ => None,
    }
}

pub(super) fn set_shape(instance: &mut Instance, var: Var, shape: &[usize]) {
    if let Some(t) = instance.tensors.get_mut(&var) {
        t.ty.shape = shape.to_vec();
    } else if let Some(leaf @ Leaf::Ints(_)) = instance.attrs.get_mut(&var) {
        *leaf = Leaf::Ints(shape.iter().map(|&d| d as i64).collect());
    }
}

/// Steers a draw toward satisfying one condition. Only a nudge: whether the condition holds
/// is decided afterwards by the rule's own code.
pub(super) fn apply_hint(
    cond: &Condition,
    instance: &mut Instance,
    base: &[usize],
    rng: &mut ChaCha8Rng,
) {
    let var = |s: &String| s.parse::<Var>().ok();
    match cond {
        Condition::SameDtype(a, b) => {
            if let (Some(a), Some(b)) = (var(a), var(b))
                && let Some(d) = dtype_of(instance, a)
            {
                set_dtype(instance, b, d);
            }
        }
        Condition::SameShape(a, b) => {
            if let (Some(a), Some(b)) = (var(a), var(b))
                && let Some(s) = shape_of(instance, a)
            {
                set_shape(instance, b, &s);
            }
        }
        Condition::BroadcastsTo(a, b) => {
            if let (Some(a), Some(b)) = (var(a), var(b))
                && let Some(s) = shape_of(instance, b)
            {
                let pool = shape_pool(&s);
                set_shape(instance, a, &pool[rng.random_range(0..pool.len())]);
            }
        }
        Condition::Rank(v, n) => {
            if let Some(v) = var(v) {
                let shape: Shape = (0..*n).map(|i| base.get(i).copied().unwrap_or(2)).collect();
                set_shape(instance, v, &shape);
            }
        }
        Condition::DtypeIn(v, list) => {
            if let Some(v) = var(v)
                && !list.is_empty()
            {
                set_dtype(instance, v, list[rng.random_range(0..list.len())]);
            }
        }
        Condition::IsFloat(v) => {
            if let Some(v) = var(v)
                && !dtype_of(instance, v).is_some_and(DType::is_float)
            {
                set_dtype(instance, v, FLOATS[rng.random_range(0..FLOATS.len())]);
            }
        }
        Condition::Wider(a, b) => {
            const PAIRS: [(DType, DType); 9] = [
                (DType::F32, DType::F16),
                (DType::F32, DType::BF16),
                (DType::F64, DType::F32),
                (DType::F64, DType::F16),
                (DType::F64, DType::BF16),
                (DType::F64, DType::I32),
                (DType::I64, DType::I32),
                (DType::F32, DType::Bool),
                (DType::F16, DType::Bool),
            ];
            if let (Some(a), Some(b)) = (var(a), var(b)) {
                let (wide, narrow) = PAIRS[rng.random_range(0..PAIRS.len())];
                set_dtype(instance, a, wide);
                set_dtype(instance, b, narrow);
            }
        }
        // A number attribute (`(clamp ?x ?lo ?hi)`, `(const ?c ?t)`); tensor variables were
        // made constant when drawn.
        Condition::ConstEq(v, c) => {
            if let Some(v) = var(v)
                && let Some(leaf @ Leaf::Num(_)) = instance.attrs.get_mut(&v)
            {
                *leaf = Leaf::num(*c);
            }
        }
        Condition::ConstPowerOfTwo(v) => {
            if let Some(v) = var(v)
                && let Some(leaf @ Leaf::Num(_)) = instance.attrs.get_mut(&v)
            {
                let k = rng.random_range(-6..=6);
                let sign = if rng.random_bool(0.3) { -1.0 } else { 1.0 };
                *leaf = Leaf::num(sign * 2f64.powi(k));
            }
        }
        Condition::IdentityPerm(p, x) => {
            if let (Some(p), Some(x)) = (var(p), var(x))
                && let Some(rank) = shape_of(instance, x).map(|s| s.len())
                && let Some(leaf) = instance.attrs.get_mut(&p)
            {
                *leaf = Leaf::Ints((0..rank as i64).collect());
            }
        }
        Condition::ConstantAlongLastAxis(a, b) => {
            if let (Some(a), Some(b)) = (var(a), var(b))
                && let Some(s) = shape_of(instance, b)
            {
                let pool: Vec<Shape> = shape_pool(&s)
                    .into_iter()
                    .filter(|p| crate::rewrite::condition::constant_along_last_axis(p, &s))
                    .collect();
                if !pool.is_empty() {
                    set_shape(instance, a, &pool[rng.random_range(0..pool.len())]);
                }
            }
        }
        Condition::DropsLeadingAxis(s, x) => {
            if let (Some(s), Some(x)) = (var(s), var(x)) {
                let mut shape = shape_of(instance, x).unwrap_or_default();
                if shape.is_empty() {
                    shape = vec![2, 3];
                    set_shape(instance, x, &shape);
                }
                set_shape(instance, s, &shape[1..]);
            }
        }
        _ => {}
    }
}

/// For every matrix product in `graph`, the product of its operands' magnitudes, `|a| @ |b|`:
/// the size of the terms each element of the product sums. The comparison's tolerance scales
/// with the magnitudes involved at each element, and a product's operands do not show them
/// (an operand of the product's own shape is read elementwise, though the product sums along
/// its rows), so a sound rule about products (a row scale moved out of one) would otherwise be
/// held to the rounding of values far smaller than the sums it reorders.
fn contraction_terms(graph: &Graph, values: &Tensors, catalogue: &Catalogue) -> Vec<Tensor> {
    let mut terms = Vec::new();
    for node in &graph.nodes {
        let is_product = catalogue
            .get(&node.op)
            .is_some_and(|op| op.builtin() == Some(crate::rules::Builtin::MatMul));
        if !is_product {
            continue;
        }
        let (Some(a), Some(b)) = (
            node.args.first().and_then(|a| values.get(a)),
            node.args.get(1).and_then(|b| values.get(b)),
        ) else {
            continue;
        };
        if !a.dtype.is_float() || !b.dtype.is_float() {
            continue;
        }
        let magnitude = |t: &Tensor| {
            Tensor::from_array(
                DType::F64,
                t.floats()
                    .mapv(|x| if x.is_finite() { x.abs() } else { 0.0 }),
            )
        };
        let mut g = crate::graph::GraphBuilder::new("terms");
        let ia = g.input("a", DType::F64, a.shape());
        let ib = g.input("b", DType::F64, b.shape());
        let out = g.op("terms", &node.op, &[&ia, &ib]);
        let graph = g.finish(&[&out]);
        let inputs: Tensors = [
            ("a".to_string(), magnitude(a)),
            ("b".to_string(), magnitude(b)),
        ]
        .into();
        if let Ok(mut result) = eval::evaluate_all(&graph, catalogue, &inputs) {
            terms.extend(result.remove(&out));
        }
    }
    terms
}
