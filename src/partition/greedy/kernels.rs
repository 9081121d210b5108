//! Kernels as the partitioner registers and merges them: a node as a kernel of its own (priced
//! alone, or a library call with the casts and views it absorbs), and the merge carrying out a
//! plan.
//!
//! These are the only places that change a kernel's nodes, inputs and edges, so the
//! bookkeeping that keeps `group_of`, `parent` and the successor edges consistent lives
//! together, apart from the pricing of candidates (`candidate.rs`) that only reads it.

use super::{Builder, Group, Plan};
use crate::dag::Value;
use crate::partition::{KernelKind, kind_of, price};
use crate::rules::Role;
use crate::shape::numel;
use std::collections::{HashMap, HashSet};

impl Builder<'_> {
    /// `n` as a kernel of its own (not yet registered).
    fn singleton(&self, n: usize) -> Group {
        let role = self.role[n];
        let inputs: HashSet<Value> = self.operands(n).collect();
        let (in_bytes, out_bytes, total_us) = self.singleton_cost(n);
        let gather = self.facts.copy_read_extra(self.profile, n);
        Group {
            nodes: vec![n],
            kind: Some(kind_of(role)),
            inputs,
            in_bytes,
            outputs: usize::from(self.written_alone(n)),
            out_bytes,
            per_element: self.facts.flops_per_element[n],
            terms: self.facts.terms[n],
            segments: self.segments_of(n),
            views: usize::from(self.view_plan[n].is_some()),
            domain: self.facts.iter_shape(n).clone(),
            fixed: matches!(role, Role::End | Role::Rows),
            view_sources: Vec::new(),
            rows: false,
            other_end: self.other_end(n),
            reduction_threads: self.facts.reduction_threads(self.profile, n),
            select: self.select[n],
            gather,
            gathers: self.leads[n],
            passes: 1,
            rank: 0,
            total_us,
            succ: HashMap::new(),
        }
    }

    /// `n`'s distinct operands that are read from memory (literals are not).
    pub(super) fn operands(&self, n: usize) -> impl Iterator<Item = Value> + '_ {
        let args = &self.dag.nodes[n].args;
        args.iter().enumerate().filter_map(move |(i, &arg)| {
            let external = match arg {
                Value::Input(_) => true,
                Value::Node(p) => !self.facts.literal[p],
            };
            (external && !args[..i].contains(&arg)).then_some(arg)
        })
    }

    /// Whether `n`'s value is written when nothing shares its kernel.
    fn written_alone(&self, n: usize) -> bool {
        self.facts.graph_output[n] || !self.facts.users(n).is_empty()
    }

    /// Input bytes, output bytes and time of `n` as a kernel of its own (a layout op gathering
    /// its operand through its own map, see [`Facts::copy_read_extra`]).
    pub(super) fn singleton_cost(&self, n: usize) -> (u64, u64, f64) {
        let node = &self.dag.nodes[n];
        let in_bytes: u64 = self.operands(n).map(|v| self.facts.value_bytes(v)).sum();
        let out_bytes = if self.written_alone(n) {
            self.facts.node_bytes[n]
        } else {
            0
        };
        let per_element = self.facts.flops_per_element[n];
        let domain = self.facts.iter_shape(n);
        let total_us = match kind_of(self.role[n]) {
            KernelKind::Library => price(
                self.profile,
                in_bytes + out_bytes,
                0.0,
                self.facts.library_flops[n],
                self.profile.matmul_rate(node.ty.dtype),
            ),
            // Alone, a concat is a copy kernel of one launch per operand, and a reduction
            // runs its reduction passes.
            kind => {
                let cost = price(
                    self.profile,
                    in_bytes + out_bytes,
                    self.facts.copy_read_extra(self.profile, n),
                    per_element * numel(domain) as f64,
                    self.profile.pointwise_gflops,
                )
                .with_launches(self.facts.alone_launches(n), self.profile);
                let threads = self.facts.reduction_threads(self.profile, n);
                cost.with_reduction_passes(
                    threads.filter(|_| kind == KernelKind::Fused),
                    self.profile,
                )
            }
        }
        .total_us;
        (in_bytes, out_bytes, total_us)
    }

    /// Registers `n` as a kernel of its own, ranked after every existing kernel; a library
    /// call takes in the casts and views left for it to absorb.
    pub(super) fn start(&mut self, n: usize) {
        // The absorbed nodes feeding `n`, through chains of them.
        let mut absorbed_nodes: Vec<usize> = Vec::new();
        let mut stack: Vec<usize> = vec![n];
        while let Some(m) = stack.pop() {
            for &arg in &self.dag.nodes[m].args {
                if let Value::Node(c) = arg
                    && self.absorbed[c]
                    && !absorbed_nodes.contains(&c)
                {
                    absorbed_nodes.push(c);
                    stack.push(c);
                }
            }
        }
        absorbed_nodes.sort_unstable();
        absorbed_nodes.dedup();
        let mut group = if absorbed_nodes.is_empty() {
            self.singleton(n)
        } else {
            self.library_with_absorbed(n, &absorbed_nodes)
        };
        if self.view_plan[n].is_some() {
            // Alone, a view reads its operand's (contiguous) buffer.
            self.view_of[n] = self.resolve_view(n, false);
            if let Some((source, _)) = &self.view_of[n] {
                group.view_sources.push(*source);
            }
        }
        let id = self.groups.len() as u32;
        group.rank = self.next_rank;
        self.ranks.insert(self.next_rank, id);
        self.next_rank += self.gap;
        for &m in absorbed_nodes.iter().chain([&n]) {
            for &arg in &self.dag.nodes[m].args {
                if let Value::Node(p) = arg
                    && !self.facts.literal[p]
                    && !self.absorbed[p]
                {
                    let g = self.group_of[p] as usize;
                    self.groups[g].succ.entry(id).or_default().push(p);
                }
            }
        }
        for &c in &absorbed_nodes {
            self.absorbed[c] = false;
            self.group_of[c] = id;
            self.ext[c] = 0;
        }
        self.groups.push(group);
        self.parent.push(id);
        self.member_mark.push(0);
        self.outside_mark.push(0);
        self.visit_mark.push(0);
        self.group_of[n] = id;
    }

    /// Library call `n` as a kernel of its own with the casts and views it absorbed,
    /// `absorbed_nodes`, in it (not yet registered): it reads their sources instead of their
    /// values.
    fn library_with_absorbed(&self, n: usize, absorbed_nodes: &[usize]) -> Group {
        let inputs: HashSet<Value> = absorbed_nodes
            .iter()
            .chain([&n])
            .flat_map(|&m| self.operands(m))
            .filter(|v| !matches!(v, Value::Node(c) if absorbed_nodes.contains(c)))
            .collect();
        let in_bytes: u64 = inputs.iter().map(|&v| self.facts.value_bytes(v)).sum();
        let (_, out_bytes, _) = self.singleton_cost(n);
        let total_us = price(
            self.profile,
            in_bytes + out_bytes,
            0.0,
            self.facts.library_flops[n],
            self.profile.matmul_rate(self.dag.nodes[n].ty.dtype),
        )
        .total_us;
        let mut nodes = absorbed_nodes.to_vec();
        nodes.push(n);
        Group {
            nodes,
            kind: Some(KernelKind::Library),
            inputs,
            in_bytes,
            outputs: usize::from(self.written_alone(n)),
            out_bytes,
            per_element: self.facts.flops_per_element[n],
            terms: absorbed_nodes
                .iter()
                .chain([&n])
                .map(|&m| self.facts.terms[m])
                .sum(),
            segments: 0,
            views: 0,
            domain: self.facts.iter_shape(n).clone(),
            fixed: false,
            view_sources: Vec::new(),
            rows: false,
            other_end: false,
            reduction_threads: None,
            select: None,
            gather: 0.0,
            gathers: false,
            passes: 1,
            rank: 0,
            total_us,
            succ: HashMap::new(),
        }
    }

    /// Carries out a plan: the members become one kernel with `n` in it.
    pub(super) fn merge(&mut self, n: usize, mut plan: Plan) {
        let survivor = self.survivor(&plan.members);
        self.rerank(&plan, survivor);
        for &o in &plan.members {
            if o != survivor {
                self.absorb(survivor, o);
            }
        }
        let internal: Vec<u32> = self
            .group(survivor)
            .succ
            .keys()
            .copied()
            .filter(|&k| self.find(k) == survivor)
            .collect();
        for &p in &plan.internal_uses {
            self.ext[p] -= 1;
        }
        self.group_of[n] = survivor;
        self.level[n] = plan.level;
        if let Some((source, map)) = plan.view.take() {
            let sources = &mut self.groups[survivor as usize].view_sources;
            if !sources.contains(&source) {
                sources.push(source);
            }
            self.view_of[n] = Some((source, map));
        }
        let mut new_edges = Vec::new();
        {
            let s = &mut self.groups[survivor as usize];
            for k in internal {
                s.succ.remove(&k);
            }
            for v in &plan.internal_inputs {
                s.inputs.remove(v);
            }
            s.nodes.push(n);
            for &arg in &self.dag.nodes[n].args {
                let external = match arg {
                    Value::Input(_) => true,
                    Value::Node(p) => {
                        !self.facts.literal[p] && self.group_of[p] != survivor && {
                            new_edges.push((self.group_of[p], p));
                            true
                        }
                    }
                };
                if external {
                    s.inputs.insert(arg);
                }
            }
            s.segments = plan.segments;
            s.views = plan.views;
            s.adopt(&plan);
        }
        for (g, p) in new_edges {
            self.groups[g as usize]
                .succ
                .entry(survivor)
                .or_default()
                .push(p);
        }
    }

    /// The member of a merge that survives it: the one with the most nodes (so union-find
    /// chains stay logarithmic), the lowest id on a tie.
    pub(super) fn survivor(&self, members: &[u32]) -> u32 {
        *members
            .iter()
            .max_by_key(|&&m| (self.group(m).nodes.len(), std::cmp::Reverse(m)))
            .expect("a plan has members")
    }

    /// Moves kernel `o`'s nodes, inputs and outgoing edges into `survivor`; `o` is merged away.
    /// The survivor's statistics are the caller's to set.
    pub(super) fn absorb(&mut self, survivor: u32, o: u32) {
        let absorbed = std::mem::take(&mut self.groups[o as usize]);
        for &node in &absorbed.nodes {
            self.group_of[node] = survivor;
        }
        self.parent[o as usize] = survivor;
        let s = &mut self.groups[survivor as usize];
        s.nodes.extend(absorbed.nodes);
        s.inputs.extend(absorbed.inputs);
        s.gathers |= absorbed.gathers;
        for source in absorbed.view_sources {
            if !s.view_sources.contains(&source) {
                s.view_sources.push(source);
            }
        }
        for (k, producers) in absorbed.succ {
            s.succ.entry(k).or_default().extend(producers);
        }
    }
}
