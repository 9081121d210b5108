//! Pricing one candidate of the producer-consumer pass: node `n` joining some of its producers'
//! kernels (the members).
//!
//! [`Builder::plan`] is called for every producer kernel alone, for growing unions of them and
//! for all of them at once, so it is where the partitioner spends its time, and the legality
//! rules of the module doc in `greedy.rs` are all checked here. Each phase below checks one of
//! those rules or accounts for one part of the merged kernel's statistics (its operands and
//! edges, its domain, its inputs, its outputs), so they read one at a time; `plan` runs them in
//! order, and any failure rejects the candidate. Phases that need to know whether a kernel is a
//! member read the marks `plan` sets with a fresh epoch.

use super::{Builder, Plan, emitted_terms, one_axis};
use crate::dag::Value;
use crate::partition::fits;
use crate::rules::Role;
use crate::shape::{IndexMap, Shape, broadcast};

/// Where the node's operands and the members' edges fall once the members and the node merge.
struct Edges {
    /// Producer nodes whose uses move inside the merged kernel, once per use.
    internal_uses: Vec<usize>,
    /// Values that stop being inputs because they are produced inside the merged kernel.
    internal_inputs: Vec<Value>,
    /// Kernels producing operands of the node that stay outside.
    outside: Vec<u32>,
    /// Whether a `Rows` result is consumed inside: the merged kernel is a row kernel.
    consumes_rows: bool,
}

/// The merged kernel's iteration domain and the shape of its loop.
struct Domain {
    domain: Shape,
    /// Whether an `End` or `Rows` node fixes the domain.
    fixed: bool,
    rows: bool,
    other_end: bool,
    /// Bytes its view loads move beyond their values' per pass.
    gather: f64,
    /// The row pass computing the node.
    level: u32,
    passes: u32,
}

impl Builder<'_> {
    /// Prices `n` joining `members`, or `None` when that is illegal.
    pub(super) fn plan(&mut self, n: usize, members: &[u32]) -> Option<Plan> {
        let epoch = self.next_epoch();
        for &m in members {
            self.member_mark[m as usize] = epoch;
        }
        let terms = self.within_budgets(n, members)?;
        if !self.gathers_stay_loads(n, members) {
            return None;
        }
        let view = self.view_read(n, members, epoch)?;
        // All concats of a kernel select along one axis.
        let select = one_axis(
            members
                .iter()
                .map(|&m| self.group(m).select)
                .chain([self.select[n]]),
        )
        .ok()?;
        if self.select[n].is_some() && !self.segment_kernels(n, members) {
            return None;
        }
        let mut edges = self.edges(n, members, epoch)?;
        let view_map = view.as_ref().map(|(_, map)| map);
        let shape = self.domain(n, members, view_map, &edges, epoch)?;
        let (in_bytes, in_count) = self.inputs(n, members, &edges.internal_inputs, epoch);
        let (out_count, out_bytes) = self.outputs(n, members, &mut edges.internal_uses);
        if in_count + out_count > self.max_args {
            return None;
        }
        // The body budget again, now counting what the emitter writes per segment.
        let segment_count = members
            .iter()
            .map(|&m| self.group(m).segments)
            .sum::<usize>()
            .saturating_add(self.segments_of(n));
        let views = members.iter().map(|&m| self.group(m).views).sum::<usize>()
            + usize::from(self.view_plan[n].is_some());
        let args = in_count + views + out_count;
        if emitted_terms(terms, segment_count, args) > self.max_terms {
            return None;
        }

        // Convexity.
        for &g in &edges.outside {
            self.outside_mark[g as usize] = epoch;
        }
        let top_rank = members
            .iter()
            .chain(&edges.outside)
            .map(|&g| self.group(g).rank)
            .max()
            .expect("a plan has members");
        let moved = self.between(members, top_rank, epoch, true, usize::MAX)?;

        let per_element: f64 = members
            .iter()
            .map(|&m| self.group(m).per_element)
            .sum::<f64>()
            + self.facts.flops_per_element[n];
        let flops = self.kernel_flops(
            members,
            Some(n),
            &shape.domain,
            per_element,
            select,
            shape.rows,
        )?;
        let reduction_threads = members
            .iter()
            .filter_map(|&m| self.group(m).reduction_threads)
            .chain(self.facts.reduction_threads(self.profile, n))
            .reduce(f64::min);
        let total_us = self.fused_total_us(
            in_bytes + out_bytes,
            self.read_extra(shape.gather, shape.passes),
            flops,
            reduction_threads,
            shape.rows,
        );
        let before: f64 = members.iter().map(|&m| self.group(m).total_us).sum();
        Some(Plan {
            members: members.to_vec(),
            view,
            domain: shape.domain,
            fixed: shape.fixed,
            rows: shape.rows,
            other_end: shape.other_end,
            reduction_threads,
            select,
            gather: shape.gather,
            passes: shape.passes,
            level: shape.level,
            in_bytes,
            in_count,
            out_count,
            out_bytes,
            per_element,
            terms,
            segments: segment_count,
            views,
            total_us,
            delta: total_us - before,
            internal_uses: edges.internal_uses,
            internal_inputs: edges.internal_inputs,
            top_rank,
            moved,
        })
    }

    /// Whether kernel `g` is a member of the candidate marked with `epoch`.
    fn is_member(&self, g: u32, epoch: u32) -> bool {
        self.member_mark[g as usize] == epoch
    }

    /// Whether `p` is a node (not a literal) computed in a member of the candidate.
    fn made_inside(&self, p: usize, epoch: u32) -> bool {
        !self.facts.literal[p] && self.is_member(self.group_of[p], epoch)
    }

    /// Whether a kernel led by a gather ([`Role::leads`]) stays one the lowering reads the
    /// gather in as a load at a computed index: what joins it is a pointwise node or a
    /// reduction (an embedding's LayerNorm or mean pool reads the table at the ids where
    /// it needs an element), no member selects along a concat (a select's operand is
    /// evaluated per segment, and its range loads and a gather's computed index do not
    /// compose), and neither the node nor a member computes a gather's data or indices,
    /// which it reads from memory. True when no member holds a gather.
    fn gathers_stay_loads(&self, n: usize, members: &[u32]) -> bool {
        if !members.iter().any(|&m| self.group(m).gathers) {
            return true;
        }
        let joins = match self.dag.nodes[n].op.kind() {
            crate::rules::OpKind::Pointwise => self.role[n] == Role::Join,
            crate::rules::OpKind::Reduction => matches!(self.role[n], Role::End | Role::Rows),
            _ => false,
        };
        if !joins || members.iter().any(|&m| self.group(m).select.is_some()) {
            return false;
        }
        let inside = |p: usize| {
            p == n
                || (!self.facts.literal[p]
                    && !self.absorbed[p]
                    && self.group_of[p] != u32::MAX
                    && members.contains(&self.find(self.group_of[p])))
        };
        members
            .iter()
            .flat_map(|&m| self.group(m).nodes.iter().copied())
            .filter(|&g| self.leads[g])
            .flat_map(|g| self.dag.nodes[g].args.iter().copied())
            .all(|arg| !matches!(arg, Value::Node(p) if inside(p)))
    }

    /// The op budget (the members' nodes and `n`) and the body budget (their formula terms),
    /// checked first since they are the cheapest to check and what cuts long chains. Returns
    /// the merged kernel's terms.
    fn within_budgets(&self, n: usize, members: &[u32]) -> Option<usize> {
        let ops: usize = members.iter().map(|&m| self.group(m).nodes.len()).sum();
        if ops + 1 > self.max_ops {
            return None;
        }
        let terms = members
            .iter()
            .map(|&m| self.group(m).terms)
            .sum::<usize>()
            .saturating_add(self.facts.terms[n]);
        (terms <= self.max_terms).then_some(terms)
    }

    /// What `n` reads through its view, `Some(None)` when it is no view. A view reads memory:
    /// its operand must not be computed in the merged kernel unless it is a view too. Nor may
    /// a merge take in the producer of a value some member reads through a view. `None` when
    /// either rule is broken.
    fn view_read(
        &self,
        n: usize,
        members: &[u32],
        epoch: u32,
    ) -> Option<Option<(Value, IndexMap)>> {
        let node = &self.dag.nodes[n];
        let view = match self.view_plan[n] {
            Some(_) => {
                let inside = match node.args[0] {
                    Value::Node(p) => self.made_inside(p, epoch),
                    Value::Input(_) => false,
                };
                Some(self.resolve_view(n, inside)?)
            }
            None => None,
        };
        for &m in members {
            for &source in &self.group(m).view_sources {
                if let Value::Node(s) = source
                    && self.made_inside(s, epoch)
                {
                    return None;
                }
            }
        }
        Some(view)
    }

    /// For a concat `n` read by ranges: whether every member is a segment kernel, one that fits
    /// the operands it produces and writes nothing once the concat reads them inside.
    fn segment_kernels(&self, n: usize, members: &[u32]) -> bool {
        let node = &self.dag.nodes[n];
        for &m in members {
            let g = self.group(m);
            if g.fixed || g.rows {
                return false;
            }
            let mut freed = 0;
            let mut seen: Vec<usize> = Vec::new();
            for &arg in &node.args {
                let Value::Node(p) = arg else { continue };
                if self.facts.literal[p] || self.group_of[p] != m {
                    continue;
                }
                if !fits(&g.domain, &self.dag.ty(arg).shape) {
                    return false;
                }
                if !seen.contains(&p) {
                    seen.push(p);
                    let uses = node.args.iter().filter(|&&a| a == arg).count();
                    if !self.facts.graph_output[p] && self.ext[p] == uses {
                        freed += 1;
                    }
                }
            }
            if freed != g.outputs {
                return false;
            }
        }
        true
    }

    /// `n`'s operands (uses moving inside, producer kernels staying outside) and the edges
    /// between members, which become internal. `None` when one of them would consume an `End`
    /// result inside the kernel.
    fn edges(&self, n: usize, members: &[u32], epoch: u32) -> Option<Edges> {
        let mut internal_uses = Vec::new();
        let mut outside = Vec::new();
        let mut consumes_rows = false;
        for &arg in &self.dag.nodes[n].args {
            if let Value::Node(p) = arg
                && !self.facts.literal[p]
            {
                let g = self.group_of[p];
                if self.is_member(g, epoch) {
                    // A concat read by ranges evaluates its operands per segment, where no
                    // row reduction of the kernel is computed: an operand from a kernel that
                    // consumes one (a row kernel) would read a result that is not there.
                    let selects = self.select[n].is_some();
                    if !self.consumable(p)
                        || (selects && (self.role[p] == Role::Rows || self.group(g).rows))
                    {
                        return None;
                    }
                    consumes_rows |= self.role[p] == Role::Rows;
                    internal_uses.push(p);
                } else if !outside.contains(&g) {
                    outside.push(g);
                }
            }
        }
        let mut internal_inputs: Vec<Value> = Vec::new();
        if members.len() > 1 {
            for &a in members {
                for (&k, producers) in &self.group(a).succ {
                    let c = self.find(k);
                    if c == a || !self.is_member(c, epoch) {
                        continue;
                    }
                    // A concat read by ranges evaluates its operands at other points of
                    // the domain than its own, where a row reduction's result is not
                    // computed: such a kernel would read the row of another point.
                    // The same for a producer that consumes a row reduction inside its own
                    // kernel (a row kernel): its values depend on results the segment
                    // evaluation does not compute.
                    let selects = self.group(c).select.is_some();
                    let row_kernel = self.group(a).rows;
                    for &p in producers {
                        if !self.consumable(p)
                            || (selects && (self.role[p] == Role::Rows || row_kernel))
                        {
                            return None;
                        }
                        consumes_rows |= self.role[p] == Role::Rows;
                        internal_uses.push(p);
                        if !internal_inputs.contains(&Value::Node(p)) {
                            internal_inputs.push(Value::Node(p));
                        }
                    }
                }
            }
        }
        Some(Edges {
            internal_uses,
            internal_inputs,
            outside,
            consumes_rows,
        })
    }

    /// The merged kernel's iteration domain, its row passes and its extra reads. `None` when
    /// the domains do not agree: two fixed ones differ, they do not broadcast, or a row kernel
    /// would hold another reduction.
    fn domain(
        &self,
        n: usize,
        members: &[u32],
        view_map: Option<&IndexMap>,
        edges: &Edges,
        epoch: u32,
    ) -> Option<Domain> {
        let node = &self.dag.nodes[n];
        let shape = self.facts.iter_shape(n);
        let rows = edges.consumes_rows || members.iter().any(|&m| self.group(m).rows);
        let other_end = self.other_end(n) || members.iter().any(|&m| self.group(m).other_end);
        if rows && other_end {
            return None;
        }
        let mut fixed: Option<&Shape> =
            matches!(self.role[n], Role::End | Role::Rows).then_some(shape);
        // A view extending a kernel of views that then writes nothing (every value of it is
        // read only by `n`) takes that kernel over: its views become loads of `n`'s, so its
        // old domain (the shape of a view `n` reshapes) no longer says anything.
        let dissolved = view_map.is_some() && self.views_dissolve(members, &edges.internal_uses);
        let shaping: &[u32] = if dissolved { &[] } else { members };
        // Reads beyond bytes: the members' view loads (gone when `n` dissolves them into its
        // own load) and `n`'s, if it is a view; each row pass reads them again where the
        // profile says rows are re-read.
        let mut gather: f64 = shaping.iter().map(|&m| self.group(m).gather).sum();
        if let Some(map) = view_map {
            gather += self.facts.read_extra(self.profile, n, map);
        }
        let level = node
            .args
            .iter()
            .filter_map(|&arg| match arg {
                Value::Node(p) if self.made_inside(p, epoch) => Some(self.level_after(p)),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let passes = members
            .iter()
            .map(|&m| self.group(m).passes)
            .chain(edges.internal_uses.iter().map(|&p| self.level_after(p) + 1))
            .chain([level + 1])
            .max()
            .unwrap_or(1);
        for &m in shaping {
            let g = self.group(m);
            if g.fixed {
                match fixed {
                    None => fixed = Some(&g.domain),
                    Some(f) if *f != g.domain => return None,
                    Some(_) => {}
                }
            }
        }
        let is_fixed = fixed.is_some();
        // A concat's segment kernels iterate over their segments: the concat's shape is the
        // domain.
        let segments = self.select[n].is_some();
        let domain = match fixed {
            Some(f) => f.clone(),
            None if segments => shape.clone(),
            None => {
                let mut d = shape.clone();
                for &m in shaping {
                    d = broadcast(&d, &self.group(m).domain).ok()?;
                }
                d
            }
        };
        if !fits(self.facts.iter_shape(n), &domain)
            || (!segments
                && shaping
                    .iter()
                    .any(|&m| !fits(&self.group(m).domain, &domain)))
        {
            return None;
        }
        Some(Domain {
            domain,
            fixed: is_fixed,
            rows,
            other_end,
            gather,
            level,
            passes,
        })
    }

    /// The merged kernel's input bytes and count: the union of the members' inputs and the
    /// node's, less values made inside. Values outside the largest member's inputs are counted
    /// once each (marked with `epoch`), so the cost is in the smaller members' inputs.
    fn inputs(
        &mut self,
        n: usize,
        members: &[u32],
        internal_inputs: &[Value],
        epoch: u32,
    ) -> (u64, usize) {
        let largest = *members
            .iter()
            .max_by_key(|&&m| self.group(m).inputs.len())
            .expect("a plan has members");
        let inputs_of_largest = self.group(largest).inputs.len();
        let mut in_bytes = self.group(largest).in_bytes;
        let mut extra = 0;
        let mut value_mark = std::mem::take(&mut self.value_mark);
        let mut add = |v: Value| {
            if !self.group(largest).inputs.contains(&v) {
                let slot = self.value_slot(v);
                if value_mark[slot] != epoch {
                    value_mark[slot] = epoch;
                    extra += 1;
                    in_bytes += self.facts.value_bytes(v);
                }
            }
        };
        for &m in members {
            if m != largest {
                self.group(m).inputs.iter().for_each(|&v| add(v));
            }
        }
        for &arg in &self.dag.nodes[n].args {
            let external = match arg {
                Value::Input(_) => true,
                Value::Node(p) => {
                    !self.facts.literal[p] && !self.is_member(self.group_of[p], epoch)
                }
            };
            if external {
                add(arg);
            }
        }
        self.value_mark = value_mark;
        for &v in internal_inputs {
            in_bytes -= self.facts.value_bytes(v);
        }
        (in_bytes, inputs_of_largest + extra - internal_inputs.len())
    }

    /// The merged kernel's output count and bytes: the members' and the node's, less values no
    /// longer used outside. Sorts `internal_uses` (to count the uses of each producer).
    fn outputs(&self, n: usize, members: &[u32], internal_uses: &mut [usize]) -> (usize, u64) {
        let mut out_count: usize = members.iter().map(|&m| self.group(m).outputs).sum();
        let mut out_bytes: u64 = members.iter().map(|&m| self.group(m).out_bytes).sum();
        internal_uses.sort_unstable();
        for run in internal_uses.chunk_by(|a, b| a == b) {
            let p = run[0];
            if !self.facts.graph_output[p] && self.ext[p] == run.len() {
                out_count -= 1;
                out_bytes -= self.facts.node_bytes[p];
            }
        }
        if self.facts.graph_output[n] || !self.facts.users(n).is_empty() {
            out_count += 1;
            out_bytes += self.facts.node_bytes[n];
        }
        (out_count, out_bytes)
    }

    /// What view node `n` reads, and through which index map, when it joins a kernel:
    /// `operand_inside` says whether its operand is computed in that kernel, which is legal only
    /// for a view (the two compose into one view of the first one's source). `None` when the
    /// operand is computed there and is not a view. A reshape that no strides express (merging
    /// the axes of a transposed or sliced view) composes too, as a floor-division/remainder
    /// stage of the map ([`IndexMap::reshape`]): reading through it costs a few integer
    /// divisions per element, far less than a copy kernel's write and read back.
    pub(super) fn resolve_view(&self, n: usize, operand_inside: bool) -> Option<(Value, IndexMap)> {
        let node = &self.dag.nodes[n];
        let plan = self.view_plan[n].as_ref()?;
        let x = node.args[0];
        let x_shape = &self.dag.ty(x).shape;
        let (source, base) = match x {
            Value::Node(p) if operand_inside => self.view_of[p].clone()?,
            _ => (x, IndexMap::contiguous(x_shape)),
        };
        Some((source, plan.index_map(&base, x_shape, &node.ty.shape)?))
    }

    /// Whether `members` hold only view nodes and none of their values is written once the
    /// uses in `internal_uses` (once per use) move inside: they would then be no loop of
    /// their own, only the index maps of the view joining them.
    fn views_dissolve(&self, members: &[u32], internal_uses: &[usize]) -> bool {
        members.iter().all(|&m| {
            self.group(m).nodes.iter().all(|&v| {
                self.view_plan[v].is_some()
                    && !self.facts.graph_output[v]
                    && self.ext[v] == internal_uses.iter().filter(|&&p| p == v).count()
            })
        })
    }

    /// The row pass from which a node of `p`'s kernel may read `p`'s value: `p`'s own pass,
    /// or the next one when `p` is a row reduction (its result is complete only after the pass
    /// that reduces the row).
    fn level_after(&self, p: usize) -> u32 {
        self.level[p] + u32::from(self.role[p] == Role::Rows)
    }

    /// Whether node `p`'s result may be read by another node of its kernel: anything but an
    /// `End` node or a `Rows` node that is not a row reduction. (The row kernel's domain is
    /// then the reduction's input shape: `Rows` fixes it like `End`.)
    fn consumable(&self, p: usize) -> bool {
        match self.role[p] {
            Role::End => false,
            Role::Rows => self.row[p],
            _ => true,
        }
    }
}
