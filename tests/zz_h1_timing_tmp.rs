use fusebox::dag::Dag;
use fusebox::partition;
use fusebox::rules::{Catalogue, CostModel, FusionRules};
#[test]
fn timing() {
    let ops = Catalogue::defaults();
    let g = fusebox::graph::synthetic::pointwise(10_000, 256, 256, 7);
    let dag = Dag::from_graph(&g, &ops).unwrap();
    let fusion = FusionRules::defaults();
    let model = CostModel::defaults();
    for prof in ["cpu", "h200"] {
        let p = model.profile(prof).unwrap();
        let mut best = (f64::MAX, f64::MAX);
        for _ in 0..30 {
            let t = std::time::Instant::now();
            let part = partition::partition(&dag, &fusion, p);
            let e = t.elapsed();
            let t2 = std::time::Instant::now();
            let un = partition::unfused(&dag, p);
            best = (best.0.min(e.as_secs_f64()*1e3), best.1.min(t2.elapsed().as_secs_f64()*1e3));
            if false { eprintln!("{prof}: {} kernels in {e:?} (unfused {:?}); max inputs {} outputs {}; {:.1} -> {:.1}", part.kernels.len(), t2.elapsed(),
                part.kernels.iter().map(|k| k.inputs.len()).max().unwrap(), part.kernels.iter().map(|k| k.outputs.len()).max().unwrap(), un.cost.total_us, part.cost.total_us); }
        }
        eprintln!("{prof}: best partition {:.2} ms, unfused {:.2} ms", best.0, best.1);
    }
}
