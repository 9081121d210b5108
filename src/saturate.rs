//! The saturation runner: applies the rewrite rules to the e-graph in phases, within limits.
//!
//! Phase `k` runs every rule whose phase is at most `k`, so cheap simplifications (algebra,
//! casts) reach a fixpoint before the rules that add many alternatives (sum_to_size, broadcast)
//! join in. egg's [`BackoffScheduler`] bans a rule for a while when it matches too often, which
//! keeps one prolific rule from crowding out the rest. Hitting a limit is not an error: the
//! e-graph so far still holds the input graph and every form proven equal to it, and extraction
//! uses it; the report says which limit stopped the run.

use crate::egraph::{ENode, FuseGraph, TypeAnalysis};
use crate::error::{Error, ErrorKind, Result, Site};
use crate::rewrite::Rule;
use egg::{BackoffScheduler, Rewrite, Runner};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Bounds on one saturation run, shared by all its phases.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Stop once the e-graph holds this many e-nodes. egg's own default (10,000) is smaller than
    /// the graphs fusebox is meant for; this allows roughly 25 forms per node of a 10,000-node
    /// graph.
    pub nodes: usize,
    /// Iterations per phase.
    pub iterations: usize,
    /// Wall time for the whole run.
    pub time: Duration,
    /// BackoffScheduler: matches a rule may make in one iteration before it is banned.
    pub match_limit: usize,
    /// BackoffScheduler: iterations a banned rule sits out (doubling on every ban).
    pub ban_length: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            nodes: 250_000,
            iterations: 30,
            time: Duration::from_millis(1500),
            match_limit: 2_000,
            ban_length: 3,
        }
    }
}

/// Why saturation (or one phase of it) stopped. Serialized as the words `Display` prints, so
/// the JSON report reads `"stop_reason": "node limit"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// No rule could add anything new: every form the rules reach is in the e-graph.
    Saturated,
    NodeLimit,
    IterationLimit,
    TimeLimit,
    /// Saturation did not run (the pipeline ran without fusion).
    NotRun,
    /// egg stopped for a reason of its own, in its words.
    Other(String),
}

impl Stop {
    /// Whether a limit, rather than saturation, ended the run: the e-graph may be missing
    /// forms the rules would have reached.
    pub fn is_limit(&self) -> bool {
        !matches!(self, Stop::Saturated | Stop::NotRun)
    }

    fn of(reason: Option<&egg::StopReason>) -> Stop {
        match reason {
            Some(egg::StopReason::Saturated) | None => Stop::Saturated,
            Some(egg::StopReason::NodeLimit(_)) => Stop::NodeLimit,
            Some(egg::StopReason::IterationLimit(_)) => Stop::IterationLimit,
            Some(egg::StopReason::TimeLimit(_)) => Stop::TimeLimit,
            Some(egg::StopReason::Other(why)) => Stop::Other(why.clone()),
        }
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stop::Saturated => "saturated",
            Stop::NodeLimit => "node limit",
            Stop::IterationLimit => "iteration limit",
            Stop::TimeLimit => "time limit",
            Stop::NotRun => "not run",
            Stop::Other(why) => why,
        })
    }
}

impl Serialize for Stop {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What one phase did.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    pub phase: u32,
    pub rules: usize,
    pub iterations: usize,
    pub stop_reason: Stop,
}

/// What saturation did, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct Saturation {
    pub nodes: usize,
    pub classes: usize,
    pub iterations: usize,
    /// Why the last phase stopped.
    pub stop_reason: Stop,
    /// Whether a limit (rather than saturation) ended some phase.
    pub limited: bool,
    pub time_ms: f64,
    /// Times each rule was applied (unions it made, both directions under one name each).
    pub firings: BTreeMap<String, usize>,
    pub phases: Vec<PhaseReport>,
}

impl Saturation {
    /// The report of a pipeline that did not saturate (fusion off).
    pub fn not_run() -> Saturation {
        Saturation {
            nodes: 0,
            classes: 0,
            iterations: 0,
            stop_reason: Stop::NotRun,
            limited: false,
            time_ms: 0.0,
            firings: BTreeMap::new(),
            phases: Vec::new(),
        }
    }
}

/// Runs `rules` over `egraph` in phases. Fails only when a rule proves two values of different
/// types (or two different constants) equal: that rule is unsound, and the graph it would
/// produce cannot be trusted.
pub fn saturate(
    egraph: FuseGraph,
    rules: &[&Rule],
    limits: &Limits,
    progress: bool,
) -> Result<(FuseGraph, Saturation)> {
    let start = Instant::now();
    let mut phases: Vec<u32> = rules.iter().map(|r| r.phase).collect();
    phases.sort_unstable();
    phases.dedup();
    let bar = progress.then(|| Progress::new(start));
    let mut egraph = egraph;
    let mut report = Saturation {
        nodes: 0,
        classes: 0,
        iterations: 0,
        stop_reason: Stop::Saturated,
        limited: false,
        time_ms: 0.0,
        firings: BTreeMap::new(),
        phases: Vec::new(),
    };
    // egg's rewrites are built once and shared by the phases (a phase-1 rule runs in every
    // phase): building one clones its patterns and conditions, which on a small graph cost
    // as much as the matching.
    let built: Vec<(u32, Rewrite<ENode, TypeAnalysis>)> = rules
        .iter()
        .flat_map(|r| r.rewrites().into_iter().map(|w| (r.phase, w)))
        .collect();
    for &phase in &phases {
        let rewrites: Vec<&Rewrite<ENode, TypeAnalysis>> = built
            .iter()
            .filter(|(p, _)| *p <= phase)
            .map(|(_, w)| w)
            .collect();
        let rule_count = rewrites.len();
        let remaining = limits.time.saturating_sub(start.elapsed());
        if remaining.is_zero() {
            report.stop_reason = Stop::TimeLimit;
            report.limited = true;
            break;
        }
        let bar_for_hook = bar.clone();
        let runner = Runner::<ENode, TypeAnalysis, ()>::new(TypeAnalysis::new(
            egraph.analysis.catalogue.clone(),
            egraph.analysis.inputs.clone(),
        ))
        .with_egraph(egraph)
        .with_node_limit(limits.nodes)
        .with_iter_limit(limits.iterations)
        .with_time_limit(remaining)
        .with_scheduler(
            BackoffScheduler::default()
                .with_initial_match_limit(limits.match_limit)
                .with_ban_length(limits.ban_length),
        )
        .with_hook(move |runner| {
            if let Some(bar) = &bar_for_hook {
                bar.update(
                    phase,
                    runner.iterations.len(),
                    runner.egraph.total_number_of_nodes(),
                );
            }
            match runner.egraph.analysis.conflicts.first() {
                Some(conflict) => Err(conflict.clone()),
                None => Ok(()),
            }
        })
        .run(rewrites);
        egraph = runner.egraph;
        if let Some(conflict) = egraph.analysis.conflicts.first() {
            return Err(Error::new(
                Site::default(),
                ErrorKind::Rule(format!("unsound rewrite: {conflict}")),
            ));
        }
        for iteration in &runner.iterations {
            for (name, count) in &iteration.applied {
                let base = name.as_str().trim_end_matches(" (reverse)").to_string();
                *report.firings.entry(base).or_default() += count;
            }
        }
        let reason = Stop::of(runner.stop_reason.as_ref());
        report.iterations += runner.iterations.len();
        report.limited |= reason.is_limit();
        report.stop_reason = reason.clone();
        report.phases.push(PhaseReport {
            phase,
            rules: rule_count,
            iterations: runner.iterations.len(),
            stop_reason: reason,
        });
    }
    egraph.rebuild();
    if let Some(bar) = bar {
        bar.finish();
    }
    report.nodes = egraph.total_number_of_nodes();
    report.classes = egraph.number_of_classes();
    report.time_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok((egraph, report))
}

/// A spinner on stderr that appears only on a terminal and only once a run has taken half a
/// second, so short runs and piped output stay clean.
#[derive(Clone)]
struct Progress {
    start: Instant,
    bar: ProgressBar,
    terminal: bool,
}

impl Progress {
    fn new(start: Instant) -> Progress {
        let bar = ProgressBar::hidden();
        bar.set_style(
            ProgressStyle::with_template("{spinner} saturating {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        Progress {
            start,
            bar,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn update(&self, phase: u32, iteration: usize, nodes: usize) {
        if !self.terminal || self.start.elapsed() < Duration::from_millis(500) {
            return;
        }
        if self.bar.is_hidden() {
            self.bar
                .set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        // Numbers only: no name from a graph or rule file reaches the spinner, so it needs
        // none of the escaping the CLI gives what it prints (`cli::terminal`).
        self.bar.set_message(format!(
            "phase {phase}, iteration {iteration}, {nodes} e-nodes"
        ));
        self.bar.tick();
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
