//! cuBLASLt's epilogues, planned without a GPU (`src/backend/cuda/runtime/lt.rs`): every
//! epilogue of a form cuBLASLt computes is moved into its GEMM, and every epilogue moved there
//! computes, by cuBLASLt's formula `activation(alpha·P + C + bias)` (ReLU, GELU's tanh form or
//! none) applied to the reference's values, what the graph computes.

use crate::common;

use common::epilogue_graphs;
use common::random_graph::{self, rules};
use fusebox::backend::cuda::emit::EmitOptions;
use fusebox::backend::cuda::runtime::lt::Activation;
use fusebox::backend::cuda::runtime::plan::{Buf, DevicePlan, Libraries, Op};
use fusebox::dag::Value;
use fusebox::dtype::DType;
use fusebox::eval::Tensors;
use fusebox::optimize::{Options, optimize};
use fusebox::tensor::Tensor;

const LT: Libraries = Libraries {
    cudnn: false,
    lt_epilogues: true,
};

/// The value of buffer `buf` among the reference's values of every node.
fn value_of<'a>(dag: &fusebox::dag::Dag, values: &'a Tensors, buf: Buf) -> &'a Tensor {
    let Buf::Value(v) = buf else {
        panic!("an epilogue operand in a temporary: {buf:?}")
    };
    &values[dag.value_name(v)]
}

#[test]
fn lt_epilogues_are_planned_exactly_where_cublaslt_computes_them() {
    let cases = random_graph::cases(160) as usize;
    let (mut moved, mut expressible, mut refused_inexpressible) = (0, 0, 0);
    for seed in 0..cases as u64 {
        let case = epilogue_graphs::case(seed);
        let options = Options {
            profile: "h200".into(),
            ..Options::default()
        };
        let optimized = optimize(&case.graph, rules(), &options)
            .unwrap_or_else(|e| panic!("{}: {e}", case.what));
        let program = fusebox::lower::lower(&optimized.dag, &optimized.partition).unwrap();
        let plan = DevicePlan::new(&program, &EmitOptions::default(), 132, LT).unwrap();
        let without =
            DevicePlan::new(&program, &EmitOptions::default(), 132, Libraries::default()).unwrap();
        assert_eq!(without.lt_epilogues(), 0);
        // One kernel fewer per epilogue moved.
        assert_eq!(
            plan.launches() + plan.lt_epilogues(),
            without.launches(),
            "{}",
            case.what
        );
        let epilogues = plan.lt_epilogues();
        assert_eq!(plan.unwritten.len(), epilogues, "{}", case.what);
        if case.expressible {
            expressible += 1;
            assert_eq!(epilogues, 1, "{} (seed {seed}): not moved", case.what);
        } else if epilogues == 0 {
            refused_inexpressible += 1;
        }
        if epilogues == 0 {
            continue;
        }
        moved += 1;
        let inputs = random_graph::inputs(&case.graph, seed, false);
        let values = fusebox::eval::evaluate_all(&optimized.graph, &rules().ops, &inputs)
            .unwrap_or_else(|e| panic!("{}: {e}", case.what));
        // The moved epilogues in order, each with its product (the matmul node the GEMM
        // belongs to, as the reference computed it).
        let moved = plan.ops.iter().filter_map(|op| match op {
            Op::Gemm {
                c,
                epilogue: Some(e),
                ..
            } => Some((c, e)),
            _ => None,
        });
        for ((c, e), &product) in moved.zip(&plan.unwritten) {
            let product = Buf::Value(Value::Node(product));
            let p = value_of(&optimized.dag, &values, product).floats();
            let want = value_of(&optimized.dag, &values, *c);
            assert_eq!(want.dtype, e.out_dtype, "{}", case.what);
            let want = want.floats();
            let bias = e
                .bias
                .map(|(b, _)| value_of(&optimized.dag, &values, b).floats());
            let residual = e
                .residual
                .map(|r| value_of(&optimized.dag, &values, r).floats());
            let cols = *p.shape().last().unwrap();
            let scale = bias
                .as_ref()
                .map_or(0.0, |b| b.iter().fold(0.0f64, |m, v| m.max(v.abs())));
            for (i, (&pv, &w)) in p.iter().zip(want.iter()).enumerate() {
                let r = residual
                    .as_ref()
                    .map_or(0.0, |r| r.as_slice_memory_order().unwrap()[i]);
                let b = bias
                    .as_ref()
                    .map_or(0.0, |b| b.as_slice_memory_order().unwrap()[i % cols]);
                let mut got = f64::from(e.alpha) * pv + r + b;
                got = match e.activation {
                    Activation::None => got,
                    Activation::Relu => got.max(0.0),
                    Activation::GeluTanh => {
                        let inner = 0.7978845608028654 * (got + 0.044715 * got * got * got);
                        0.5 * got * (1.0 + inner.tanh())
                    }
                };
                let got = e.out_dtype.round(got);
                // cuBLASLt keeps f32 between the steps that the graph rounds to a 16-bit
                // dtype: a few of its units apart at most.
                let ulp = match e.out_dtype {
                    DType::F32 => 1e-6,
                    DType::F16 => 2e-3,
                    _ => 1.6e-2,
                };
                let tol =
                    ulp * (pv.abs() * f64::from(e.alpha).abs() + r.abs() + scale + w.abs()) + 1e-30;
                assert!(
                    (got - w).abs() <= tol,
                    "{} (seed {seed}): element {i}: cuBLASLt's formula gives {got}, the graph {w}",
                    case.what
                );
            }
        }
    }
    // The generator reaches both sides.
    assert!(
        expressible >= cases / 8,
        "{expressible} of {cases} expressible"
    );
    assert!(moved >= expressible);
    assert!(
        refused_inexpressible >= cases / 8,
        "{refused_inexpressible} refused"
    );
}
