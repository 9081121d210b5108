
#![allow(dead_code)]
use egg::RecExpr;
use fusebox::dtype::DType;
use fusebox::egraph::{ENode, Leaf};
use fusebox::eval::{Tensors, evaluate};
use fusebox::graph::{Graph, GraphBuilder};
use fusebox::rules::Catalogue;
use fusebox::tensor::Tensor;
use rand::{Rng, RngExt, SeedableRng};

fn table() -> Vec<(&'static str, DType, Vec<usize>)> {
    use DType::*;
    vec![
        ("x", F32, vec![2, 3]), ("y", F32, vec![2, 3]), ("h", F16, vec![2, 3]), ("i", I32, vec![4]),
        ("c", Bool, vec![2, 3]), ("v", F32, vec![3]), ("w", F32, vec![2, 1]), ("g", F32, vec![8, 3]),
        ("g2", F32, vec![8, 3]), ("g3", F32, vec![4, 8, 3]), ("cv", Bool, vec![3]), ("p", F32, vec![8, 2]),
        ("q", F32, vec![8, 3]), ("r", F32, vec![8, 4]), ("s", F32, vec![8, 5]),
        ("b", Bool, vec![2, 3]), ("j", I32, vec![2, 3]), ("j2", I32, vec![2, 3]), ("k", I64, vec![2, 3]), ("hb", BF16, vec![2, 3]),
        ("d", F64, vec![2, 3]), ("h2", F16, vec![2, 3]), ("vh", F16, vec![3]), ("vj", I32, vec![3]),
    ]
}

fn to_graph(text: &str, cat: &Catalogue) -> Graph {
    let e: RecExpr<ENode> = text.parse().unwrap();
    let mut b = GraphBuilder::new("t");
    for (n, d, s) in table() { b.input(n, d, &s); }
    let nodes = e.as_ref();
    let mut names: Vec<Option<String>> = vec![None; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        match node {
            ENode::Input(s) => names[i] = Some(s.to_string()),
            ENode::Attr(_) => {}
            ENode::Op(op, ch) => {
                let def = cat.get(op.as_str()).unwrap();
                let na = def.spec.attrs.len();
                let operands: Vec<String> = ch[..ch.len() - na].iter().map(|c| names[usize::from(*c)].clone().unwrap()).collect();
                let mut attrs = Vec::new();
                for (spec, c) in def.spec.attrs.iter().zip(&ch[ch.len() - na..]) {
                    let ENode::Attr(l) = &nodes[usize::from(*c)] else { panic!() };
                    if *l == Leaf::Absent { continue; }
                    attrs.push((spec.name.as_str(), l.to_attr(spec.ty).unwrap()));
                }
                let refs: Vec<&str> = operands.iter().map(String::as_str).collect();
                names[i] = Some(b.op_with(&format!("n{i}"), op.as_str(), &refs, &attrs));
            }
        }
    }
    let last = names.last().unwrap().clone().unwrap();
    if nodes.len() == 1 {
        // An input alone: pass it through a cast to its own dtype (exact).
        let d = table().into_iter().find(|t| t.0 == last).unwrap().1;
        let out = b.op_with("out", "cast", &[&last], &[("dtype", fusebox::attr::AttrValue::DType(d))]);
        return b.finish(&[&out]);
    }
    b.finish(&[&last])
}

fn value(d: DType, rng: &mut impl Rng) -> f64 {
    let specials = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -2.5, 1e-30, -1e-30, 6e-8, 65504.0, 70000.0, 3e38, -3e38, 1e300,
        f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 2147483647.0, -2147483648.0, 1e10, -7.7];
    let v = if rng.random_range(0..3) == 0 { rng.random_range(-5.0..5.0) } else { specials[rng.random_range(0..specials.len())] };
    d.round(v)
}

fn same(a: f64, b: f64) -> bool { (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits() }

#[test]
fn scratch_refused() {
    let cat = Catalogue::defaults();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    for c in refuses() {
        let g1 = to_graph(c.start, &cat);
        let g2 = to_graph(c.target, &cat);
        let mut worst = String::new();
        for _ in 0..300 {
            let mut inputs = Tensors::new();
            for (n, d, s) in table() {
                let k: usize = s.iter().product();
                let vals = (0..k).map(|_| value(d, &mut rng)).collect();
                inputs.insert(n.to_string(), Tensor::from_values(d, &s, vals).unwrap());
            }
            let (Ok(a), Ok(b)) = (evaluate(&g1, &cat, &inputs), evaluate(&g2, &cat, &inputs)) else { worst = "eval error".into(); break };
            let (ta, tb) = (a.values().next().unwrap(), b.values().next().unwrap());
            if ta.shape() != tb.shape() || ta.dtype != tb.dtype { worst = format!("type {:?}{:?} vs {:?}{:?}", ta.dtype, ta.shape(), tb.dtype, tb.shape()); break; }
            for (x, y) in ta.values().iter().zip(tb.values()) {
                if !same(*x, y) && worst.is_empty() { worst = format!("{x:?} vs {y:?}"); }
            }
        }
        println!("REFUSED {}: {} => {}: {}", c.rule, c.start, c.target, if worst.is_empty() { "EXACT".into() } else { worst });
    }
}

#[test]
fn scratch_exactness() {
    let cat = Catalogue::defaults();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut bad = 0;
    for c in fires().into_iter().chain(extra()) {
        let g1 = to_graph(c.start, &cat);
        let g2 = to_graph(c.target, &cat);
        let mut worst = String::new();
        for _ in 0..300 {
            let mut inputs = Tensors::new();
            for (n, d, s) in table() {
                let k: usize = s.iter().product();
                let vals = (0..k).map(|_| value(d, &mut rng)).collect();
                inputs.insert(n.to_string(), Tensor::from_values(d, &s, vals).unwrap());
            }
            let a = evaluate(&g1, &cat, &inputs).unwrap();
            let b = evaluate(&g2, &cat, &inputs).unwrap();
            let (ta, tb) = (a.values().next().unwrap(), b.values().next().unwrap());
            assert_eq!(ta.shape(), tb.shape(), "{}", c.rule);
            assert_eq!(ta.dtype, tb.dtype, "{}", c.rule);
            for (x, y) in ta.values().iter().zip(tb.values()) {
                if !same(*x, y) && worst.is_empty() {
                    worst = format!("{x:?} vs {y:?}");
                }
            }
        }
        if !worst.is_empty() {
            bad += 1;
            println!("NOT EXACT {}: {} => {}: {}", c.rule, c.start, c.target, worst);
        }
    }
    println!("{bad} inexact");
}
struct Case {
    rule: &'static str,
    start: &'static str,
    target: &'static str,
}

const fn case(rule: &'static str, start: &'static str, target: &'static str) -> Case {
    Case {
        rule,
        start,
        target,
    }
}

/// Each default rule on a small term, with the term it must produce, written by hand.
fn fires() -> Vec<Case> {
    let mut cases = vec![
        // algebra
        case("add-neg-zero-right", "(add $x (const -0.0 f32))", "$x"),
        case("add-neg-zero-left", "(add (const -0.0 f32) $x)", "$x"),
        case("add-zero-int-right", "(add $i (const 0 i32))", "$i"),
        case("add-zero-int-left", "(add (const 0 i32) $i)", "$i"),
        case("sub-zero", "(sub $x (const 0 f32))", "$x"),
        case("mul-one-right", "(mul $x (const 1 f32))", "$x"),
        case("mul-one-left", "(mul (const 1 f16) $h)", "$h"),
        case("div-one", "(div $x (const 1 f32))", "$x"),
        case("mul-neg-one-right", "(mul $x (const -1 f32))", "(neg $x)"),
        case("mul-neg-one-left", "(mul (const -1 i32) $i)", "(neg $i)"),
        case("neg-neg", "(neg (neg $x))", "$x"),
        case("sub-add-neg", "(sub $x $y)", "(add $x (neg $y))"),
        case("sub-add-neg", "(add $x (neg $y))", "(sub $x $y)"),
        case("neg-mul", "(neg (mul $x $y))", "(mul (neg $x) $y)"),
        case("neg-mul", "(mul (neg $x) $y)", "(neg (mul $x $y))"),
        case("div-pow2", "(div $x (const 4 f32))", "(mul $x (const 0.25 f32))"),
        case("div-pow2", "(div $h (const 0.125 f16))", "(mul $h (const 8 f16))"),
        case("where-same", "(where $c $x $x)", "$x"),
        case("where-true", "(where (const 1 bool) $x $y)", "$x"),
        case("where-false", "(where (const 0 bool) $x $y)", "$y"),
        case("max-self", "(max $x $x)", "$x"),
        case("min-self", "(min $x $x)", "$x"),
        case("relu-relu", "(relu (relu $x))", "(relu $x)"),
        case("abs-abs", "(abs (abs $x))", "(abs $x)"),
        case("abs-neg", "(abs (neg $x))", "(abs $x)"),
        case("clamp-unbounded", "(clamp $x -inf inf)", "$x"),
        // casts
        case("cast-same", "(cast $x f32)", "$x"),
        case("cast-up-down", "(cast (cast $h f32) f16)", "$h"),
        case("cast-up-down", "(cast (cast $i f64) i32)", "$i"),
        case("cast-exact-first", "(cast (cast $h f32) bf16)", "(cast $h bf16)"),
        case("cast-neg", "(cast (neg $x) f16)", "(neg (cast $x f16))"),
        case("cast-neg", "(neg (cast $x f16))", "(cast (neg $x) f16)"),
        case("cast-relu", "(cast (relu $x) f16)", "(relu (cast $x f16))"),
        case("cast-relu", "(relu (cast $x i32))", "(cast (relu $x) i32)"),
        case("cast-max", "(cast (max $x $y) f16)", "(max (cast $x f16) (cast $y f16))"),
        case("cast-max", "(max (cast $x f16) (cast $y f16))", "(cast (max $x $y) f16)"),
        case("cast-min", "(cast (min $x $y) bf16)", "(min (cast $x bf16) (cast $y bf16))"),
        case("cast-min", "(min (cast $h f32) (cast $h f32))", "(cast (min $h $h) f32)"),
        case("cast-where", "(cast (where $c $x $y) i32)", "(where $c (cast $x i32) (cast $y i32))"),
        case("cast-where", "(where $c (cast $x f16) (cast $y f16))", "(cast (where $c $x $y) f16)"),
        case("cast-broadcast", "(cast (broadcast_to $v [2,3]) f16)", "(broadcast_to (cast $v f16) [2,3])"),
        case("cast-broadcast", "(broadcast_to (cast $v f16) [2,3])", "(cast (broadcast_to $v [2,3]) f16)"),
        // sum_to_size
        case("sum-to-size-mul-right", "(sum_to_size (mul $g $v) [3])", "(mul (sum_to_size $g [3]) $v)"),
        case("sum-to-size-mul-right", "(mul (sum_to_size $g [3]) $v)", "(sum_to_size (mul $g $v) [3])"),
        case("sum-to-size-mul-left", "(sum_to_size (mul $v $g) [3])", "(mul $v (sum_to_size $g [3]))"),
        case("sum-to-size-mul-left", "(mul $v (sum_to_size $g [3]))", "(sum_to_size (mul $v $g) [3])"),
        case("sum-to-size-neg", "(sum_to_size (neg $g) [3])", "(neg (sum_to_size $g [3]))"),
        case("sum-to-size-neg", "(neg (sum_to_size $g [3]))", "(sum_to_size (neg $g) [3])"),
        case("sum-to-size-div", "(sum_to_size (div $g $v) [3])", "(div (sum_to_size $g [3]) $v)"),
        case("sum-to-size-div", "(div (sum_to_size $g [3]) $v)", "(sum_to_size (div $g $v) [3])"),
        case(
            "sum-to-size-where-left",
            "(sum_to_size (where $cv $g (const 0 f32)) [3])",
            "(where $cv (sum_to_size $g [3]) (const 0 f32))",
        ),
        case(
            "sum-to-size-where-left",
            "(where $cv (sum_to_size $g [3]) (const 0 f32))",
            "(sum_to_size (where $cv $g (const 0 f32)) [3])",
        ),
        case(
            "sum-to-size-where-right",
            "(sum_to_size (where $cv (const 0 f32) $g) [3])",
            "(where $cv (const 0 f32) (sum_to_size $g [3]))",
        ),
        case(
            "sum-to-size-where-right",
            "(where $cv (const 0 f32) (sum_to_size $g [3]))",
            "(sum_to_size (where $cv (const 0 f32) $g) [3])",
        ),
        case(
            "sum-to-size-add",
            "(add (sum_to_size $g [3]) (sum_to_size $g2 [3]))",
            "(sum_to_size (add $g $g2) [3])",
        ),
        case("sum-to-size-nested", "(sum_to_size (sum_to_size $g3 [8,3]) [3])", "(sum_to_size $g3 [3])"),
        case("sum-to-size-nested", "(sum_to_size (sum_to_size $g3 [1,3]) [3])", "(sum_to_size $g3 [3])"),
        case("sum-to-size-identity", "(sum_to_size $g [8,3])", "$g"),
        case("sum-to-size-leading-axis", "(sum_to_size $g [3])", "(sum $g [0] false)"),
        case(
            "sum-concat-2",
            "(sum (concat $p $q 1) [0] false)",
            "(concat (sum $p [0] false) (sum $q [0] false) 0)",
        ),
        case(
            "sum-concat-3",
            "(sum (concat $p $q $r 1) [0] false)",
            "(concat (sum $p [0] false) (sum $q [0] false) (sum $r [0] false) 0)",
        ),
        case(
            "sum-concat-4",
            "(sum (concat $p $q $r $s 1) [0] false)",
            "(concat (sum $p [0] false) (sum $q [0] false) (sum $r [0] false) (sum $s [0] false) 0)",
        ),
        // broadcast
        case("broadcast-identity", "(broadcast_to $x [2,3])", "$x"),
        case("broadcast-nested", "(broadcast_to (broadcast_to $v [2,3]) [4,2,3])", "(broadcast_to $v [4,2,3])"),
        case("broadcast-clamp", "(clamp (broadcast_to $v [2,3]) 0 1)", "(broadcast_to (clamp $v 0 1) [2,3])"),
        case("broadcast-clamp", "(broadcast_to (clamp $v 0 1) [2,3])", "(clamp (broadcast_to $v [2,3]) 0 1)"),
    ];
    // Every pointwise unary op commutes with broadcast_to, both ways.
    for op in [
        "neg", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
        "relu", "gelu", "gelu_tanh", "silu", "softplus",
    ] {
        let rule: &'static str = format!("broadcast-{}", op.replace('_', "-")).leak();
        let small: &'static str = format!("(broadcast_to ({op} $v) [2,3])").leak();
        let big: &'static str = format!("({op} (broadcast_to $v [2,3]))").leak();
        cases.push(case(rule, big, small));
        cases.push(case(rule, small, big));
    }
    for op in ["add", "sub", "mul", "div", "max", "min"] {
        let both: &'static str = format!("broadcast-{op}-both").leak();
        cases.push(case(
            both,
            format!("({op} (broadcast_to $v [2,3]) (broadcast_to $w [2,3]))").leak(),
            format!("(broadcast_to ({op} $v $w) [2,3])").leak(),
        ));
        cases.push(case(
            format!("broadcast-{op}-implicit-right").leak(),
            format!("({op} $x (broadcast_to $v [2,3]))").leak(),
            format!("({op} $x $v)").leak(),
        ));
        cases.push(case(
            format!("broadcast-{op}-implicit-left").leak(),
            format!("({op} (broadcast_to $w [2,3]) $y)").leak(),
            format!("({op} $w $y)").leak(),
        ));
    }
    cases
}

fn refuses() -> Vec<Case> {
    vec![
        // x * 1 with x f16 and 1 f32 promotes to f32.
        case("mul-one-right", "(mul $h (const 1 f32))", "$h"),
        // x * 1 where 1 broadcasts x: [3] * [2,3].
        case("mul-one-right", "(mul $v (broadcast_to (const 1 f32) [2,3]))", "$v"),
        // Float x + 0 is not x (-0.0 + 0.0 = +0.0).
        case("add-zero-int-right", "(add $x (const 0 f32))", "$x"),
        case("add-neg-zero-right", "(add $x (const 0 f32))", "$x"),
        // Integer double negation saturates.
        case("neg-neg", "(neg (neg $i))", "$i"),
        case("sub-add-neg", "(sub $x $i)", "(add $x (neg $i))"),
        // Not a power of two; a power of two whose reciprocal overflows f16.
        case("div-pow2", "(div $x (const 3 f32))", "(mul $x (div (const 1 f32) (const 3 f32)))"),
        case(
            "div-pow2",
            "(div $h (const 0.0000152587890625 f16))",
            "(mul $h (div (const 1 f16) (const 0.0000152587890625 f16)))",
        ),
        // The lossy down-then-up trip is never removed.
        case("cast-up-down", "(cast (cast $x f16) f32)", "$x"),
        case("cast-exact-first", "(cast (cast $x f16) bf16)", "(cast $x bf16)"),
        // Integer targets for neg and max, bool targets for relu.
        case("cast-neg", "(cast (neg $x) i32)", "(neg (cast $x i32))"),
        case("cast-max", "(cast (max $x $y) i32)", "(max (cast $x i32) (cast $y i32))"),
        case("cast-relu", "(cast (relu $x) bool)", "(relu (cast $x bool))"),
        // Mixed operand dtypes would be converted before max/where runs.
        case("cast-max", "(cast (max $x $h) bf16)", "(max (cast $x bf16) (cast $h bf16))"),
        case("cast-where", "(cast (where $c $x $h) f16)", "(where $c (cast $x f16) (cast $h f16))"),
        // A factor of the full shape does not leave the sum; a condition of the full shape
        // does not either.
        case("sum-to-size-mul-right", "(sum_to_size (mul $g $g2) [3])", "(mul (sum_to_size $g [3]) $g2)"),
        case(
            "sum-to-size-where-left",
            "(sum_to_size (where (gt $g $g2) $g (const 0 f32)) [3])",
            "(where (gt $g $g2) (sum_to_size $g [3]) (const 0 f32))",
        ),
        // -0.0 is not the zero the where rule needs.
        case(
            "sum-to-size-where-left",
            "(sum_to_size (where $cv $g (const -0.0 f32)) [3])",
            "(where $cv (sum_to_size $g [3]) (const -0.0 f32))",
        ),
        // Two reductions of different shapes.
        case("sum-to-size-add", "(add (sum_to_size $g [3]) (sum_to_size $v [3]))", "(sum_to_size (add $g $v) [3])"),
        // Not the leading axis.
        case("sum-to-size-leading-axis", "(sum_to_size $g3 [3])", "(sum $g3 [0] false)"),
        // Rank 3 pieces.
        case(
            "sum-concat-2",
            "(sum (concat $g3 $g3 1) [0] false)",
            "(concat (sum $g3 [0] false) (sum $g3 [0] false) 0)",
        ),
        // Implicit broadcasting needs the other operand at the full shape.
        case("broadcast-add-implicit-right", "(add $v (broadcast_to $v [2,3]))", "(add $v $v)"),
    ]
}


fn extra() -> Vec<Case> {
    let mut v = vec![
        case("a", "(add $j (const -0.0 i32))", "$j"), case("a", "(add $b (const -0.0 bool))", "$b"),
        case("a", "(add $h (const -0.0 f16))", "$h"), case("a", "(add $x (const -0.0 f16))", "$x"),
        case("a", "(add (const -0.0 bf16) $hb)", "$hb"),
        case("a", "(add $b (const 0 bool))", "$b"), case("a", "(add $k (const 0 i32))", "$k"),
        case("a", "(sub $j (const 0 i32))", "$j"), case("a", "(sub $b (const 0 bool))", "$b"), case("a", "(sub $h (const 0 f16))", "$h"),
        case("a", "(sub $d (const 0 f32))", "$d"),
        case("a", "(mul $b (const 1 bool))", "$b"), case("a", "(mul $j (const 1 i32))", "$j"), case("a", "(mul $x (const 1 bf16))", "$x"),
        case("a", "(div $h (const 1 f16))", "$h"), case("a", "(div $d (const 1 f32))", "$d"),
        case("a", "(mul $b (const -1 bool))", "(neg $b)"), case("a", "(mul $j (const -1 i32))", "(neg $j)"),
        case("a", "(mul $h (const -1 f16))", "(neg $h)"), case("a", "(mul $x (const -1 i32))", "(neg $x)"),
        case("a", "(mul $k (const -1 i64))", "(neg $k)"),
        case("a", "(neg (neg $h))", "$h"), case("a", "(neg (neg $hb))", "$hb"),
        case("a", "(sub $j $x)", "(add $j (neg $x))"), case("a", "(sub $h $hb)", "(add $h (neg $hb))"), case("a", "(sub $b $h)", "(add $b (neg $h))"),
        case("a", "(sub $h $h2)", "(add $h (neg $h2))"), case("a", "(sub $h $d)", "(add $h (neg $d))"),
        case("a", "(neg (mul $h $x))", "(mul (neg $h) $x)"), case("a", "(neg (mul $x $j))", "(mul (neg $x) $j)"),
        case("a", "(neg (mul $h $hb))", "(mul (neg $h) $hb)"), case("a", "(neg (mul $h $h2))", "(mul (neg $h) $h2)"),
        case("a", "(div $j (const 4 f16))", "(mul $j (div (const 1 f16) (const 4 f16)))"),
        case("a", "(div $x (const 32768 f16))", "(mul $x (div (const 1 f16) (const 32768 f16)))"),
        case("a", "(div $h (const 0.000030517578125 f16))", "(mul $h (div (const 1 f16) (const 0.000030517578125 f16)))"),
        case("a", "(div $h (const 32768 f16))", "(mul $h (div (const 1 f16) (const 32768 f16)))"),
        case("a", "(div $hb (const 8 bf16))", "(mul $hb (div (const 1 bf16) (const 8 bf16)))"),
        case("a", "(div $d (const 0.5 f32))", "(mul $d (div (const 1 f32) (const 0.5 f32)))"),
        case("a", "(div $h (const -0.25 f32))", "(mul $h (div (const 1 f32) (const -0.25 f32)))"),
        case("a", "(div $b (const 2 f16))", "(mul $b (div (const 1 f16) (const 2 f16)))"),
        case("a", "(where (const 1 bool) $h $h2)", "$h"), case("a", "(where (const 0 bool) $j $j2)", "$j2"),
        case("a", "(relu (relu $j))", "(relu $j)"), case("a", "(relu (relu $h))", "(relu $h)"), case("a", "(relu (relu $b))", "(relu $b)"),
        case("a", "(abs (abs $j))", "(abs $j)"), case("a", "(abs (neg $h))", "(abs $h)"), case("a", "(abs (abs $b))", "(abs $b)"),
        case("a", "(clamp $j -inf inf)", "$j"), case("a", "(clamp $h -inf inf)", "$h"),
        case("a", "(max $j $j)", "$j"), case("a", "(min $h $h)", "$h"),
        case("a", "(cast $j i32)", "$j"), case("a", "(cast $b bool)", "$b"),
        case("a", "(cast (cast $b f16) bool)", "$b"), case("a", "(cast (cast $j i64) i32)", "$j"),
        case("a", "(cast (cast $hb f64) bf16)", "$hb"), case("a", "(cast (cast $x f64) f32)", "$x"),
        case("a", "(cast (cast $h f32) f16)", "$h"), case("a", "(cast (cast $b i32) bool)", "$b"),
        case("a", "(cast (cast $h f64) i32)", "(cast $h i32)"), case("a", "(cast (cast $j f64) f16)", "(cast $j f16)"),
        case("a", "(cast (cast $b i32) f32)", "(cast $b f32)"), case("a", "(cast (cast $hb f32) f16)", "(cast $hb f16)"),
        case("a", "(cast (cast $h f32) bool)", "(cast $h bool)"), case("a", "(cast (cast $hb f32) i32)", "(cast $hb i32)"),
        case("a", "(cast (neg $d) f16)", "(neg (cast $d f16))"), case("a", "(cast (neg $h) bf16)", "(neg (cast $h bf16))"),
        case("a", "(cast (neg $x) f64)", "(neg (cast $x f64))"), case("a", "(cast (neg $d) bf16)", "(neg (cast $d bf16))"),
        case("a", "(cast (relu $x) i32)", "(relu (cast $x i32))"), case("a", "(cast (relu $j) f16)", "(relu (cast $j f16))"),
        case("a", "(cast (relu $d) f16)", "(relu (cast $d f16))"), case("a", "(cast (relu $b) f32)", "(relu (cast $b f32))"),
        case("a", "(cast (relu $h) i64)", "(relu (cast $h i64))"), case("a", "(cast (relu $k) i32)", "(relu (cast $k i32))"),
        case("a", "(cast (relu $d) bf16)", "(relu (cast $d bf16))"), case("a", "(cast (relu $x) i64)", "(relu (cast $x i64))"),
        case("a", "(cast (max $h $h2) bf16)", "(max (cast $h bf16) (cast $h2 bf16))"),
        case("a", "(cast (max $j $j2) f16)", "(max (cast $j f16) (cast $j2 f16))"),
        case("a", "(cast (min $j $j2) f16)", "(min (cast $j f16) (cast $j2 f16))"),
        case("a", "(cast (min $x $y) f16)", "(min (cast $x f16) (cast $y f16))"),
        case("a", "(cast (max $b $c) f16)", "(max (cast $b f16) (cast $c f16))"),
        case("a", "(cast (where $c $x $y) bool)", "(where $c (cast $x bool) (cast $y bool))"),
        case("a", "(cast (where $c $h $h2) i32)", "(where $c (cast $h i32) (cast $h2 i32))"),
        case("a", "(cast (where $cv $x $y) f16)", "(where $cv (cast $x f16) (cast $y f16))"),
        case("a", "(cast (broadcast_to $vh [2,3]) i32)", "(broadcast_to (cast $vh i32) [2,3])"),
        case("a", "(sum_to_size (where $cv $g (const 0 f32)) [3])", "(where $cv (sum_to_size $g [3]) (const 0 f32))"),
        case("a", "(sum_to_size $g3 [8,3])", "(sum $g3 [0] false)"),
        case("a", "(sum_to_size $j [2,3])", "(sum_to_size $j [2,3])"),
    ];
    for op in ["neg", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "softplus"] {
        for x in ["vh", "vj"] {
            v.push(case("a", format!("({op} (broadcast_to ${x} [2,3]))").leak(), format!("(broadcast_to ({op} ${x}) [2,3])").leak()));
        }
    }
    for op in ["add", "sub", "mul", "div", "max", "min"] {
        v.push(case("a", format!("({op} (broadcast_to $vh [2,3]) (broadcast_to $vj [2,3]))").leak(), format!("(broadcast_to ({op} $vh $vj) [2,3])").leak()));
        v.push(case("a", format!("({op} $j (broadcast_to $vh [2,3]))").leak(), format!("({op} $j $vh)").leak()));
    }
    v
}
