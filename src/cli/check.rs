//! `fusebox check`: a graph validated, each value's inferred dtype and shape in a table.

use super::{CheckArgs, load_rules, model};
use crate::error::Result;
use crate::explain::count;
use crate::graph::{Graph, TypeMap};
use std::fmt::Write as _;

/// `check`: loads the graph (a RON file or an ONNX model), which validates and infers it, and
/// describes it.
pub(super) fn check(args: &CheckArgs) -> Result<String> {
    let rules = load_rules(args.rules.as_deref())?;
    let loaded = model::load_sized(&args.graph, &rules, model::Stored::All, &args.dims)?;
    Ok(describe(&loaded.graph, &loaded.types))
}

/// One line per value: name, op, dtype, shape.
pub fn describe(graph: &Graph, types: &TypeMap) -> String {
    let mut rows: Vec<[String; 4]> = Vec::new();
    for input in &graph.inputs {
        let t = &types[&input.name];
        rows.push([
            input.name.clone(),
            "input".into(),
            t.dtype.to_string(),
            format!("{:?}", t.shape),
        ]);
    }
    for node in &graph.nodes {
        let t = &types[&node.name];
        rows.push([
            node.name.clone(),
            node.op.clone(),
            t.dtype.to_string(),
            format!("{:?}", t.shape),
        ]);
    }
    let mut out = format!(
        "graph `{}`: {}, {}, {}\n",
        graph.name,
        count(graph.inputs.len(), "input"),
        count(graph.nodes.len(), "node"),
        count(graph.outputs.len(), "output")
    );
    out += &table(&rows);
    let _ = writeln!(out, "outputs: {}", graph.outputs.join(", "));
    out
}

/// The widest a padded column gets: a longer cell (a 70,000-character node name) overflows its
/// row instead of widening every row, and `format!`'s width, which panics past 65,535, is
/// never used.
const MAX_COLUMN: usize = 48;

/// Rows of four cells, the first three padded to their column's width (up to
/// [`MAX_COLUMN`]), as `check` and `ops` print them.
pub(super) fn table(rows: &[[String; 4]]) -> String {
    let mut widths = [0; 4];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count().min(MAX_COLUMN));
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::from(" ");
        for (cell, width) in row.iter().zip(widths).take(3) {
            line.push(' ');
            line += cell;
            let pad = width.saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad + 1));
        }
        line.push(' ');
        line += &row[3];
        out += line.trim_end();
        out.push('\n');
    }
    out
}
