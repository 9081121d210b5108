//! Rendering an optimization for people: the `--explain` report and the `--emit dot` drawing.
//!
//! Both are deterministic (no timings, stable order), so the book can show them verbatim and a
//! test can fail when they drift.

use crate::dag::Value;
use crate::optimize::{Optimized, Report};
use crate::partition::KernelKind;
use crate::rules::{Builtin, BuiltinAttrs};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// A human-readable size: `512 B`, `4.0 KiB`, `12.5 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// "1 node", "2 nodes".
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Microseconds with sensible precision.
pub fn micros(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn flops(n: u64) -> String {
    match n {
        0..1_000 => format!("{n} flop"),
        1_000..1_000_000 => format!("{:.1} kflop", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} Mflop", n as f64 / 1e6),
        _ => format!("{:.1} Gflop", n as f64 / 1e9),
    }
}

/// The `--explain` text: what the cost model compared, which rules fired, the e-graph, and
/// every kernel with its ops, reads and writes.
pub fn explain(optimized: &Optimized) -> String {
    // The nodes of the graph as given: with AMP, the casts the policy inserted are not the
    // rewrites' doing.
    let names: BTreeSet<String> = optimized
        .input
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .collect();
    let input_nodes = &names;
    let r: &Report = &optimized.report;
    let mut out = String::new();
    let _ = writeln!(out, "graph `{}`, cost profile `{}`", r.graph, r.profile);
    if let Some(policy) = &r.amp {
        let _ = writeln!(
            out,
            "AMP policy `{policy}` inserted {}; the figures below are for the graph with them",
            count(r.casts_inserted, "cast")
        );
    }
    let _ = writeln!(out);
    write_costs(&mut out, r);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "e-graph: {} e-nodes in {} classes after {} iterations ({})",
        r.egraph.nodes, r.egraph.classes, r.egraph.iterations, r.egraph.stop_reason
    );
    if r.rules.is_empty() {
        let _ = writeln!(out, "rules fired: none");
    } else {
        let _ = writeln!(out, "rules fired:");
        let mut fired: Vec<(&String, &usize)> = r.rules.iter().collect();
        fired.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (name, count) in fired {
            let _ = writeln!(out, "  {count:>5}  {name}");
        }
    }
    let _ = writeln!(
        out,
        "extraction: {} ({} candidate graphs costed)",
        r.extraction
            .method
            .map_or_else(|| "none".to_string(), |m| m.to_string()),
        r.extraction.evaluations
    );
    if r.extraction.kept_input {
        let _ = writeln!(
            out,
            "the extracted form fused worse than the input as written, so the input was kept"
        );
    }
    let new_values: Vec<String> = optimized
        .dag
        .nodes
        .iter()
        .filter(|n| !input_nodes.contains(&n.name))
        .map(|n| format!("{} = {}", n.name, n.op.name()))
        .collect();
    if !new_values.is_empty() {
        let _ = writeln!(
            out,
            "values the rewrites introduced: {}",
            new_values.join(", ")
        );
    }
    write_kernels(&mut out, optimized);
    out
}

/// The cost comparison: one kernel per op, the input fused as written and the optimized graph
/// (kernels, bytes, modeled time), what the rewrites saved, and how many casts there are.
fn write_costs(out: &mut String, r: &Report) {
    let _ = writeln!(
        out,
        "modeled cost (kernel launches + bytes at kernel boundaries + arithmetic):"
    );
    let _ = writeln!(
        out,
        "  one kernel per op:      {:>4} {:<7}  {:>10}  {:>10}{}",
        r.kernels_before,
        kernel_noun(r.kernels_before),
        bytes(r.bytes_before),
        micros(r.cost_before),
        library_suffix(r.library_calls_before)
    );
    let _ = writeln!(
        out,
        "  input fused as written:                          {:>10}",
        micros(r.cost_unrewritten)
    );
    let _ = writeln!(
        out,
        "  optimized and fused:    {:>4} {:<7}  {:>10}  {:>10}{}",
        r.kernels_after,
        kernel_noun(r.kernels_after),
        bytes(r.bytes_after),
        micros(r.cost_after),
        library_suffix(r.library_calls_after)
    );
    let saved_by_rules = r.cost_unrewritten - r.cost_after;
    if saved_by_rules > 0.0 {
        let _ = writeln!(
            out,
            "  rewrites saved {} over fusing the input as written",
            micros(saved_by_rules)
        );
    } else {
        let _ = writeln!(
            out,
            "  no rewrite made the fused graph cheaper; the input's form was kept"
        );
    }
    if !r.hoisted.is_empty() {
        let _ = writeln!(
            out,
            "computed once from the stored values, read by the kernels as inputs:"
        );
        for h in &r.hoisted {
            let _ = writeln!(
                out,
                "  {} from {}: {}",
                h.name,
                list(&h.reads),
                list(&h.ops)
            );
        }
    }
    if r.amp.is_some() {
        // Casts fused into a computing kernel or absorbed by a library call cost no launch of
        // their own; the ones that still do are what AMP's cast placement failed to hide.
        let _ = writeln!(
            out,
            "casts: {} -> {}, standalone cast kernels: {}",
            r.casts_before, r.casts_after, r.cast_kernels_after
        );
    } else {
        let _ = writeln!(out, "casts: {} -> {}", r.casts_before, r.casts_after);
    }
}

/// Every kernel with its domain and cost, the values it reads and writes (each written value
/// with why it leaves the kernel), its ops, and how each concat in it is done.
fn write_kernels(out: &mut String, optimized: &Optimized) {
    let r: &Report = &optimized.report;
    let writes = written_because(optimized);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "kernels (a value is written because it is a graph output or read by a later kernel):"
    );
    for (i, k) in r.kernels.iter().enumerate() {
        let _ = writeln!(
            out,
            "  #{} {} over {:?}: {}, {}, {}",
            i + 1,
            k.kind,
            k.domain,
            bytes(k.bytes),
            flops(k.flops),
            micros(k.cost_us)
        );
        let _ = writeln!(out, "     reads  {}", list(&k.inputs));
        let mut written = writes[i].clone();
        written.extend(k.writes_in_place.iter().map(|w| format!("{w} (in place)")));
        let _ = writeln!(out, "     writes {}", list(&written));
        let _ = writeln!(out, "     ops    {}", list(&k.ops));
        if !k.epilogue.is_empty() {
            let _ = writeln!(out, "     epilogue {}", list(&k.epilogue));
        }
        for c in &k.concats {
            let how = match c.strategy {
                "copy" => "copied, one copy per operand".to_string(),
                "stacked view" => format!(
                    "a stacked view: its {} operands are views of one buffer at an even \
                     spacing, read by the library call as one strided view (a copy would \
                     move {})",
                    c.segments,
                    bytes(c.copy_bytes)
                ),
                "in place" => format!(
                    "written in place: this kernel stores {} segment(s) into its buffer, \
                     no kernel copies it (a copy would move {})",
                    c.segments,
                    bytes(c.copy_bytes)
                ),
                _ => format!(
                    "read in place: {} segments selected by index, {} (a copy would move {})",
                    c.segments,
                    // Pieces run per segment, per row of one loop nest or per point (the
                    // backend decides); each way a point evaluates one operand.
                    if c.per_segment {
                        "each segment's operand evaluated over its segment only"
                    } else {
                        "every segment's operand evaluated at every point"
                    },
                    bytes(c.copy_bytes)
                ),
            };
            let _ = writeln!(out, "     concat {}: {how}", c.node);
        }
    }
}

/// Each kernel's outputs, each with why it leaves the kernel: `name (output)` for a graph
/// output, `name (-> #2, #3)` for a value later kernels read.
fn written_because(optimized: &Optimized) -> Vec<Vec<String>> {
    let dag = &optimized.dag;
    let kernel_of = optimized.partition.kernel_of(dag.nodes.len());
    let users = dag.users();
    let outputs = dag.output_mask();
    optimized
        .partition
        .kernels
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            kernel
                .outputs
                .iter()
                .map(|&v| {
                    let name = dag.value_name(v).to_string();
                    let Value::Node(n) = v else {
                        return name;
                    };
                    let mut readers: Vec<usize> = users[n]
                        .iter()
                        .filter_map(|&u| kernel_of[u])
                        .filter(|&r| r != k)
                        .collect();
                    readers.sort_unstable();
                    readers.dedup();
                    let mut why: Vec<String> = Vec::new();
                    if outputs[n] {
                        why.push("output".into());
                    }
                    if !readers.is_empty() {
                        let to: Vec<String> =
                            readers.iter().map(|r| format!("#{}", r + 1)).collect();
                        why.push(format!("-> {}", to.join(", ")));
                    }
                    if why.is_empty() {
                        name
                    } else {
                        format!("{name} ({})", why.join("; "))
                    }
                })
                .collect()
        })
        .collect()
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "(nothing)".into()
    } else {
        items.join(", ")
    }
}

fn quote(s: &str) -> String {
    format!("\"{}\"", escape(s))
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A multi-line Graphviz label: each line escaped, joined by DOT's `\n` line break (escaping
/// the joined text would turn that break into a literal backslash and `n`).
fn label(lines: &[&str]) -> String {
    let lines: Vec<String> = lines.iter().map(|l| escape(l)).collect();
    format!("\"{}\"", lines.join("\\n"))
}

/// Graphviz: one cluster per kernel, inputs as ellipses, graph outputs double-circled.
pub fn to_dot(optimized: &Optimized) -> String {
    let dag = &optimized.dag;
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quote(&dag.name));
    let _ = writeln!(out, "  rankdir=TB;");
    let _ = writeln!(out, "  node [shape=box, fontname=\"monospace\"];");
    for input in &dag.inputs {
        let _ = writeln!(
            out,
            "  {} [shape=ellipse, label={}];",
            quote(&format!("in:{}", input.name)),
            label(&[&input.name, &input.ty.to_string()])
        );
    }
    let outputs = dag.output_mask();
    let id = |v: Value| match v {
        Value::Input(i) => quote(&format!("in:{}", dag.inputs[i].name)),
        Value::Node(i) => quote(&format!("n{i}")),
    };
    for (k, kernel) in optimized.partition.kernels.iter().enumerate() {
        let report = &optimized.report.kernels[k];
        let _ = writeln!(out, "  subgraph {} {{", quote(&format!("cluster_{k}")));
        let _ = writeln!(
            out,
            "    label={}; style=rounded; color={};",
            quote(&format!(
                "kernel {} ({}, {})",
                k + 1,
                report.kind,
                micros(report.cost_us)
            )),
            if report.kind == KernelKind::Fused {
                "blue"
            } else {
                "gray"
            }
        );
        // A library call's epilogue is drawn as a fused cluster inside the call's.
        let epilogue = match kernel.kind {
            KernelKind::Library => crate::partition::LibraryParts::of(dag, &kernel.nodes).epilogue,
            _ => Vec::new(),
        };
        let node_line = |out: &mut String, i: usize, indent: &str| {
            let node = &dag.nodes[i];
            let shape = if outputs[i] { ", peripheries=2" } else { "" };
            let _ = writeln!(
                out,
                "{indent}{} [label={}{shape}];",
                id(Value::Node(i)),
                label(&[
                    &format!("{} = {}", node.name, node.op.name()),
                    &node.ty.to_string()
                ])
            );
        };
        for &i in kernel.nodes.iter().filter(|i| !epilogue.contains(i)) {
            node_line(&mut out, i, "    ");
        }
        if !epilogue.is_empty() {
            let _ = writeln!(
                out,
                "    subgraph {} {{",
                quote(&format!("cluster_{k}_epilogue"))
            );
            let _ = writeln!(out, "      label=\"epilogue\"; style=rounded; color=blue;");
            for &i in &epilogue {
                node_line(&mut out, i, "      ");
            }
            let _ = writeln!(out, "    }}");
        }
        let _ = writeln!(out, "  }}");
    }
    for (i, node) in dag.nodes.iter().enumerate() {
        if node.op.is_literal() {
            // The const built-in shows its value; another literal op, its name.
            let what = match node.op.builtin() {
                Some(Builtin::Const) => match BuiltinAttrs::read(Builtin::Const, &node.attrs) {
                    Ok(BuiltinAttrs::Const { value, .. }) => value,
                    _ => f64::NAN,
                }
                .to_string(),
                _ => node.op.name().to_string(),
            };
            let _ = writeln!(
                out,
                "  {} [shape=plain, label={}];",
                id(Value::Node(i)),
                quote(&format!("{what} {}", node.ty.dtype))
            );
        }
        for &arg in &node.args {
            let _ = writeln!(out, "  {} -> {};", id(arg), id(Value::Node(i)));
        }
    }
    let _ = writeln!(out, "}}");
    out
}

/// "kernel" or "kernels" for a count, padded by the table to one width so the columns
/// after it stay aligned.
fn kernel_noun(n: usize) -> &'static str {
    if n == 1 { "kernel" } else { "kernels" }
}

/// The library calls of a row of the `--explain` cost table, after its columns: the table's
/// kernel column counts generated kernels only, as every report does
/// ([`crate::partition::KernelCount`]).
fn library_suffix(calls: usize) -> String {
    if calls == 0 {
        String::new()
    } else {
        format!("  + {}", count(calls, "library call"))
    }
}

/// The library calls beside the summary's kernel counts: ` (+2 library calls)`, or
/// ` (+2 -> 1 library calls)` where rewrites changed how many there are; empty without any.
fn library_calls(r: &Report) -> String {
    let (before, after) = (r.library_calls_before, r.library_calls_after);
    match (before, after) {
        (0, 0) => String::new(),
        _ if before == after => format!(" (+{})", count(after, "library call")),
        _ => format!(" (+{before} -> {})", count(after, "library call")),
    }
}

/// The default `fusebox optimize` output: three lines, and a fourth with AMP.
pub fn summary(r: &Report) -> String {
    let amp = match &r.amp {
        Some(policy) => format!(
            "amp `{policy}`: {} inserted, {} standalone cast {} after fusion\n",
            count(r.casts_inserted, "cast"),
            r.cast_kernels_after,
            if r.cast_kernels_after == 1 {
                "kernel"
            } else {
                "kernels"
            }
        ),
        None => String::new(),
    };
    format!(
        "graph `{}` (profile `{}`)\nkernels: {} -> {}{}   casts: {} -> {}   bytes: {} -> {}\nmodeled cost: {} -> {} ({} iterations, {})\n",
        r.graph,
        r.profile,
        r.kernels_before,
        r.kernels_after,
        library_calls(r),
        r.casts_before,
        r.casts_after,
        bytes(r.bytes_before),
        bytes(r.bytes_after),
        micros(r.cost_before),
        micros(r.cost_after),
        r.egraph.iterations,
        r.egraph.stop_reason
    ) + &amp
        + &hoisted_line(r)
}

/// `hoisted: N values computed once from the stored values (names)`, or nothing.
fn hoisted_line(r: &Report) -> String {
    match r.hoisted.len() {
        0 => String::new(),
        n => format!(
            "hoisted: {} computed once from the stored values ({})\n",
            count(n, "value"),
            r.hoisted
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
