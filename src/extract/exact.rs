//! The exact extractor: every acyclic choice, costed one by one.
//!
//! The cost of a candidate is a black box (the fusion partition's modeled time), so there is no
//! objective an ILP could optimise; enumerating is what "exact under the supplied cost" means.
//! Only classes the outputs actually reach under a choice get chosen, so choices that differ
//! only in classes nobody uses are never counted twice.
//!
//! The enumeration is a depth-first search over a worklist of pending classes: take one that
//! has no choice yet, branch on each of its e-nodes, queue its operand classes. A branch that
//! would close a cycle is cut when its last edge is added, which is cheap because only classes
//! already chosen have edges: a candidate closes a cycle exactly when an operand that is already
//! chosen reaches the class being chosen. The search keeps its own stack, so a 10,000-class
//! chain with one choice per class does not overflow the thread's.
//!
//! A first pass only counts (no graph is built), with [`ExtractOptions::exact_work`] bounding
//! its steps, so an e-graph with too many choices is recognised quickly and handed to greedy;
//! the same bound applies to choices × classes, the work of building every candidate.

use super::space::{Choice, Space};
use super::{ExtractOptions, Extraction, Method, original_choice, strictly_cheaper};
use crate::dag::Dag;
use crate::egraph::{FuseGraph, Seeded};

/// The cheapest acyclic choice under `cost`, or `None` when there are more than
/// `options.exact_limit` choices, or counting them takes more than `options.exact_work` steps,
/// or building them all would (choices × classes above `options.exact_work`).
pub fn exact(
    egraph: &FuseGraph,
    seeded: &Seeded,
    cost: &dyn Fn(&Dag) -> f64,
    options: &ExtractOptions,
) -> Option<Extraction> {
    let space = Space::new(egraph, seeded);
    let limits = Limits {
        choices: options.exact_limit,
        work: options.exact_work,
    };
    let count = enumerate(&space, limits, &mut |_| {})?;
    if count.saturating_mul(space.len()) > options.exact_work {
        // Each choice is built and costed: on a large graph even a few hundred are too slow.
        return None;
    }

    let mut evaluations = 0;
    let mut evaluate = |dag: &Dag| {
        evaluations += 1;
        cost(dag)
    };
    // The original graph is the incumbent; it is among the enumerated choices too, but starting
    // from it means a tie keeps the graph as it was.
    let original = space.choice_of(&original_choice(egraph, seeded));
    let mut best: Option<(Dag, f64, Choice)> = space.build(seeded, &original).ok().map(|dag| {
        let c = evaluate(&dag);
        (dag, c, original)
    });
    let original_cost = best.as_ref().map_or(f64::INFINITY, |b| b.1);
    let unlimited = Limits {
        choices: usize::MAX,
        work: usize::MAX,
    };
    enumerate(&space, unlimited, &mut |choice| {
        let Ok(dag) = space.build(seeded, choice) else {
            return;
        };
        let c = evaluate(&dag);
        if best.as_ref().is_none_or(|b| strictly_cheaper(c, b.1)) {
            best = Some((dag, c, choice.to_vec()));
        }
    });
    let (dag, cost, choice) = best?;
    Some(Extraction {
        choice: space.to_map(&choice),
        dag,
        cost,
        original_cost,
        method: Method::Exact,
        evaluations,
    })
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    choices: usize,
    work: usize,
}

/// One class being branched on.
struct Frame {
    class: usize,
    /// The next candidate to try.
    next: usize,
    /// The pending list's length before this frame queued its operands.
    base: usize,
    /// What was popped off the pending list to find `class` (`class` last), to put back when
    /// the frame is abandoned.
    popped: Vec<usize>,
}

/// Calls `visit` with every complete acyclic choice; returns how many there were, or `None`
/// as soon as the limits are exceeded.
fn enumerate(
    space: &Space<'_>,
    limits: Limits,
    visit: &mut dyn FnMut(&[Option<usize>]),
) -> Option<usize> {
    let n = space.len();
    let mut choice: Choice = vec![None; n];
    let mut pending: Vec<usize> = space.outputs.iter().rev().copied().collect();
    let mut frames: Vec<Frame> = Vec::new();
    let mut count = 0usize;
    let mut work = 0usize;
    let mut seen = vec![0u32; n];
    let mut epoch = 0u32;
    loop {
        // Descend: find the next class without a choice.
        let mut popped = Vec::new();
        let mut open = None;
        while let Some(c) = pending.pop() {
            popped.push(c);
            work += 1;
            if choice[c].is_none() {
                open = Some(c);
                break;
            }
        }
        match open {
            Some(class) => frames.push(Frame {
                class,
                next: 0,
                base: pending.len(),
                popped,
            }),
            None => {
                count += 1;
                if count > limits.choices {
                    return None;
                }
                visit(&choice);
                pending.extend(popped.into_iter().rev());
            }
        }
        // Advance: the next acyclic candidate of the innermost frame, backtracking as needed.
        loop {
            if work > limits.work {
                return None;
            }
            let Some(frame) = frames.last_mut() else {
                return Some(count);
            };
            let c = frame.class;
            choice[c] = None;
            pending.truncate(frame.base);
            let candidates = &space.candidates[c];
            let mut found = None;
            while frame.next < candidates.len() {
                let k = frame.next;
                frame.next += 1;
                epoch = epoch.wrapping_add(1);
                if epoch == 0 {
                    seen.iter_mut().for_each(|s| *s = 0);
                    epoch = 1;
                }
                let closes = closes_cycle(space, &choice, c, k, &mut seen, epoch, &mut work);
                if !closes {
                    found = Some(k);
                    break;
                }
            }
            match found {
                Some(k) => {
                    choice[c] = Some(k);
                    for &x in candidates[k].children.iter().rev() {
                        if choice[x].is_none() {
                            pending.push(x);
                        }
                    }
                    break;
                }
                None => {
                    let frame = frames.pop().expect("checked above");
                    pending.truncate(frame.base);
                    pending.extend(frame.popped.into_iter().rev());
                }
            }
        }
    }
}

/// Whether candidate `k` of `class` reaches `class` through the classes already chosen.
fn closes_cycle(
    space: &Space<'_>,
    choice: &[Option<usize>],
    class: usize,
    k: usize,
    seen: &mut [u32],
    epoch: u32,
    work: &mut usize,
) -> bool {
    let mut stack: Vec<usize> = Vec::new();
    let mut children = &space.candidates[class][k].children;
    loop {
        for &y in children {
            if y == class {
                return true;
            }
            if choice[y].is_some() && seen[y] != epoch {
                seen[y] = epoch;
                stack.push(y);
            }
        }
        let Some(x) = stack.pop() else {
            return false;
        };
        *work += 1;
        let kx = choice[x].expect("only chosen classes are pushed");
        children = &space.candidates[x][kx].children;
    }
}
