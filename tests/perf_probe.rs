#[test]
fn probe() {
    let rules = fusebox::rules::RuleSet::defaults();
    let g = fusebox::graph::synthetic::pointwise(10_000, 256, 256, 1);
    let t = std::time::Instant::now();
    let out = fusebox::optimize::optimize(&g, &rules, &Default::default()).unwrap();
    let r = &out.report;
    eprintln!("{} ms total; kernels {} -> {}; egraph {} nodes {} classes {} iters {}; sat {:.1} ms; extract {} {} evals {:.1} ms; cost {} -> {} (unrewritten {}) kept {}",
        t.elapsed().as_millis(), r.kernels_before, r.kernels_after, r.egraph.nodes, r.egraph.classes, r.egraph.iterations, r.egraph.stop_reason, r.egraph.time_ms,
        r.extraction.method, r.extraction.evaluations, r.extraction.time_ms, r.cost_before, r.cost_after, r.cost_unrewritten, r.extraction.kept_input);
}
