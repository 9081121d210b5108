//! Rewrite rules as data: load errors with exact positions, every default rule firing on a
//! small e-graph with the term it should produce (and refusing where its conditions say so),
//! and the checked applier catching a type-changing rule.

use egg::{Id, RecExpr, Runner, Symbol};
use fusebox::dag::Dag;
use fusebox::dtype::DType;
use fusebox::egraph::{ENode, FuseGraph, TypeAnalysis, new_egraph, seed};
use fusebox::graph::TensorType;
use fusebox::rewrite::{self, Rule, load_rule_set, load_rules};
use fusebox::rules::{Catalogue, RuleSet};
use std::collections::{BTreeSet, HashMap};

fn catalogue() -> Catalogue {
    Catalogue::defaults()
}

fn load_err(text: &str) -> String {
    load_rules(text, "r.ron", &catalogue())
        .expect_err("the rule file is invalid")
        .to_string()
}

/// A one-rule file whose fields start on separate lines, so positions are easy to check:
/// `lhs` is on line 3 with its string content starting at column 11, `rhs` on line 4 at
/// column 11, `when` on line 5.
fn rule_text(lhs: &str, rhs: &str, when: &str, extra: &str) -> String {
    format!(
        "[\n  Rule(name: \"r1\",\n    lhs: \"{lhs}\",\n    rhs: \"{rhs}\",\n    when: [{when}],{extra}\n  ),\n]\n"
    )
}

#[test]
fn pattern_errors_point_inside_the_string() {
    // Unclosed parenthesis: at the `(` that is never closed (column 10 is the quote).
    let e = load_err(&rule_text("(neg (neg ?x)", "?x", "", ""));
    assert_eq!(e, "r.ron:3:11: invalid rule: this `(` is never closed");

    // Unknown op, with a suggestion, at the op name.
    let e = load_err(&rule_text("(neg (mull ?x ?y))", "?x", "", ""));
    assert_eq!(e, "r.ron:3:17: unknown op `mull` (did you mean `mul`?)");

    // Wrong child count: the op's operands and attributes in order.
    let e = load_err(&rule_text("(neg ?x)", "(cast ?x)", "", ""));
    assert_eq!(
        e,
        "r.ron:4:12: invalid rule: `cast` takes (x, dtype), got 1 child: every attribute is \
         written out, in order, after the operands"
    );
    let e = load_err(&rule_text("(sum ?x [0])", "?x", "", ""));
    assert!(
        e.starts_with("r.ron:3:12: invalid rule: `sum` takes (x, axes, keepdim), got 2 children"),
        "{e}"
    );

    // A literal that does not fit the attribute's type.
    let e = load_err(&rule_text("(cast ?x 1.5)", "?x", "", ""));
    assert_eq!(
        e,
        "r.ron:3:20: invalid rule: attribute `dtype` of `cast` must be a dtype name, not `1.5`"
    );
    let e = load_err(&rule_text("(sum ?x [0] 3)", "?x", "", ""));
    assert_eq!(
        e,
        "r.ron:3:23: invalid rule: attribute `keepdim` of `sum` must be true or false, not `3`"
    );

    // A tensor position holding a leaf.
    let e = load_err(&rule_text("(mul ?x 2)", "?x", "", ""));
    assert_eq!(
        e,
        "r.ron:3:19: invalid rule: operand `b` of `mul` is a tensor, but `2` is an attribute \
         value: write a constant as `(const 2 f32)`"
    );

    // A variable used both as a tensor and as an attribute.
    let e = load_err(&rule_text("(cast (neg ?t) ?t)", "?t", "", ""));
    assert_eq!(
        e,
        "r.ron:3:26: invalid rule: `?t` is an attribute (a dtype name) here (attribute `dtype` \
         of `cast`) but a tensor at its first use (operand `x` of `neg`); a variable is one or \
         the other"
    );

    // A right-hand variable the left-hand side does not bind.
    let e = load_err(&rule_text("(neg ?x)", "(add ?x ?y)", "", ""));
    assert!(
        e.starts_with("r.ron:4:19: invalid rule: `?y` is not bound by the left-hand side"),
        "{e}"
    );
    // Bound, but as another kind.
    let e = load_err(&rule_text("(cast ?x ?t)", "(neg ?t)", "", ""));
    assert!(
        e.starts_with("r.ron:4:16: invalid rule: `?t` is a tensor here"),
        "{e}"
    );

    // A bare variable on the left matches everything.
    let e = load_err(&rule_text("?x", "(neg (neg ?x))", "", ""));
    assert!(
        e.starts_with("r.ron:3:11: invalid rule: the left-hand side must be an op pattern"),
        "{e}"
    );
}

#[test]
fn condition_errors_point_at_the_argument() {
    // `when: [` starts at column 5 of line 5; the first condition at column 12.
    let e = load_err(&rule_text("(neg ?x)", "?x", "IsFloat(\"?y\")", ""));
    assert_eq!(
        e,
        "r.ron:5:20: invalid rule: `?y` in `IsFloat` is not bound by the left-hand side"
    );
    let e = load_err(&rule_text("(cast ?x ?t)", "?x", "IsConst(\"?t\")", ""));
    assert_eq!(
        e,
        "r.ron:5:20: invalid rule: `IsConst` needs a tensor here, but `?t` is an attribute (a \
         dtype name)"
    );
    let e = load_err(&rule_text("(neg ?x)", "?x", "SameDtype(\"?x\", \"x\")", ""));
    assert!(
        e.starts_with("r.ron:5:28: invalid rule: `SameDtype` takes pattern variables"),
        "{e}"
    );
    // Inside Not(...): the inner condition's argument.
    let e = load_err(&rule_text(
        "(broadcast_to ?x ?s)",
        "?x",
        "Not(KeepsType(\"?s\"))",
        "",
    ));
    assert!(
        e.starts_with("r.ron:5:26: invalid rule: `KeepsType` needs a tensor here, but `?s` is"),
        "{e}"
    );
    // Shape conditions accept shape attributes; dtype conditions do not.
    let e = load_err(&rule_text(
        "(broadcast_to ?x ?s)",
        "?x",
        "SameShape(\"?x\", \"?s\"), IsFloat(\"?s\")",
        "",
    ));
    assert!(
        e.starts_with("r.ron:5:43: invalid rule: `IsFloat` needs a tensor or a dtype"),
        "{e}"
    );
    // An unknown condition is a RON error, located by ron.
    let e = load_err(&rule_text("(neg ?x)", "?x", "IsFlot(\"?x\")", ""));
    assert!(e.starts_with("r.ron:5:"), "{e}");
    assert!(e.contains("IsFlot"), "{e}");
}

#[test]
fn rule_level_errors() {
    // Bidirectional with a bare variable on the right.
    let e = load_err(&rule_text(
        "(neg (neg ?x))",
        "?x",
        "",
        "\n    bidirectional: true,",
    ));
    assert!(
        e.starts_with("r.ron:4:11: invalid rule: a bidirectional rule needs an op pattern on the right-hand side"),
        "{e}"
    );
    // Bidirectional with fewer variables on the right.
    let e = load_err(&rule_text(
        "(mul ?x ?y)",
        "(neg ?x)",
        "",
        "\n    bidirectional: true,",
    ));
    assert!(e.starts_with("r.ron:4:11: invalid rule: a bidirectional rule's right-hand side must bind every variable"), "{e}");
    assert!(e.contains("`?y`"), "{e}");
    // Phase 0.
    let e = load_err(&rule_text("(neg ?x)", "?x", "", "\n    phase: 0,"));
    assert!(
        e.starts_with("r.ron:6:12: invalid rule: phase must be 1 or more"),
        "{e}"
    );
    // An unknown field (deny_unknown_fields), located by ron.
    let e = load_err(&rule_text("(neg ?x)", "?x", "", "\n    phse: 2,"));
    assert!(e.starts_with("r.ron:6:"), "{e}");
    assert!(e.contains("phse"), "{e}");
    // Duplicate names in one file: at the second name, naming the first.
    let text = "[\n  Rule(name: \"a\", lhs: \"(neg ?x)\", rhs: \"?x\"),\n  Rule(name: \"a\", lhs: \"(abs ?x)\", rhs: \"?x\"),\n]";
    assert_eq!(
        load_err(text),
        "r.ron:3:14: invalid rule: duplicate rule name `a` (first defined at r.ron:2:14)"
    );
    // A name may not end in the reverse suffix.
    let text = "[Rule(name: \"a (reverse)\", lhs: \"(neg ?x)\", rhs: \"?x\")]";
    assert!(load_err(text).starts_with("r.ron:1:13: invalid rule: rule names may not end in"));
}

#[test]
fn duplicate_names_across_files_and_user_overrides() {
    let cat = catalogue();
    // A user file that redefines a default rule's name.
    let user = vec![(
        "mine.ron".to_string(),
        "[\n  Rule(name: \"neg-neg\", lhs: \"(neg (neg ?x))\", rhs: \"?x\", when: [IsFloat(\"?x\")]),\n]"
            .to_string(),
        "dir/rewrites/mine.ron".to_string(),
    )];
    let e = load_rule_set(&cat, &user).unwrap_err().to_string();
    assert!(
        e.starts_with("dir/rewrites/mine.ron:2:14: invalid rule: duplicate rule name `neg-neg` (first defined at rules/rewrites/algebra.ron:"),
        "{e}"
    );
    // Replacing algebra.ron removes its rules, so the same name is fine there.
    let user = vec![(
        "algebra.ron".to_string(),
        "[Rule(name: \"neg-neg\", lhs: \"(neg (neg ?x))\", rhs: \"?x\", when: [IsFloat(\"?x\")])]"
            .to_string(),
        "dir/rewrites/algebra.ron".to_string(),
    )];
    let rules = load_rule_set(&cat, &user).unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r.name == "neg-neg" && r.file == "dir/rewrites/algebra.ron")
    );
    assert!(!rules.iter().any(|r| r.name == "mul-one-right"));
    assert!(rules.iter().any(|r| r.name == "cast-same"));
}

#[test]
fn rule_set_reads_a_rewrites_directory() {
    let dir = std::env::temp_dir().join(format!("fusebox-rewrites-{}", std::process::id()));
    let rewrites = dir.join("rewrites");
    std::fs::create_dir_all(&rewrites).unwrap();
    std::fs::write(
        rewrites.join("casts.ron"),
        "[Rule(name: \"only-cast-rule\", lhs: \"(cast ?x ?t)\", rhs: \"?x\", when: [SameDtype(\"?x\", \"?t\")])]",
    )
    .unwrap();
    std::fs::write(
        rewrites.join("extra.ron"),
        "[Rule(name: \"extra-rule\", lhs: \"(neg (neg ?x))\", rhs: \"?x\", when: [IsFloat(\"?x\")], phase: 3)]",
    )
    .unwrap();
    let rules = RuleSet::load_dir(&dir).unwrap();
    let names: BTreeSet<&str> = rules.rewrites.iter().map(|r| r.name.as_str()).collect();
    assert!(names.contains("only-cast-rule"));
    assert!(names.contains("extra-rule"));
    assert!(!names.contains("cast-up-down"), "casts.ron was replaced");
    assert!(
        names.contains("mul-one-right"),
        "algebra.ron is still the default"
    );
    let extra = rules
        .rewrites
        .iter()
        .find(|r| r.name == "extra-rule")
        .unwrap();
    assert_eq!(extra.phase, 3);

    // A broken user rule file is reported with its path and position.
    std::fs::write(
        rewrites.join("extra.ron"),
        "[Rule(name: \"x\", lhs: \"(neg ?x)\", rhs: \"(nega ?x)\")]",
    )
    .unwrap();
    let e = RuleSet::load_dir(&dir).unwrap_err().to_string();
    let path = rewrites.join("extra.ron").display().to_string();
    assert_eq!(
        e,
        format!("{path}:1:42: unknown op `nega` (did you mean `neg`?)")
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn defaults_load_with_phases_and_docs() {
    let rules = RuleSet::defaults().rewrites;
    assert!(rules.len() >= 70, "{} rules", rules.len());
    for rule in &rules {
        assert!(
            !rule.doc.trim().is_empty(),
            "rule `{}` has no doc",
            rule.name
        );
        // layout.ron collapses chains in phase 1 and moves pointwise ops in phase 2.
        // The `-broadcast` slice moves compute their operands' slices, so they run one way.
        let collapses = rule.file.ends_with("layout.ron")
            && !rule.bidirectional
            && !rule.name.ends_with("-broadcast");
        // matmul.ron moves a transpose onto the operands: phase 2, like layout's moves.
        let expected = if rule.file.ends_with("algebra.ron")
            || rule.file.ends_with("casts.ron")
            || collapses
        {
            1
        } else {
            2
        };
        assert_eq!(rule.phase, expected, "phase of `{}`", rule.name);
    }
    let files: BTreeSet<&str> = rules.iter().map(|r| r.file.as_str()).collect();
    assert_eq!(
        files,
        BTreeSet::from([
            "rules/rewrites/algebra.ron",
            "rules/rewrites/broadcast.ron",
            "rules/rewrites/casts.ron",
            "rules/rewrites/layout.ron",
            "rules/rewrites/matmul.ron",
            "rules/rewrites/normalization.ron",
            "rules/rewrites/sum_to_size.ron",
        ])
    );
}

// ------------------------------------------------------------------ applying rules

/// A fresh e-graph whose inputs have these types.
fn egraph_with(inputs: &[(&str, DType, &[usize])]) -> FuseGraph {
    let inputs: HashMap<Symbol, TensorType> = inputs
        .iter()
        .map(|(name, dtype, shape)| {
            (
                Symbol::from(*name),
                TensorType {
                    dtype: *dtype,
                    shape: shape.to_vec(),
                },
            )
        })
        .collect();
    let mut analysis = TypeAnalysis::new(catalogue(), inputs);
    // Every input is a stored weight here, so the rules that move work onto weights
    // (`Fixed` conditions) apply; `work_moves_onto_weights_only` checks the other case.
    analysis.fixed = analysis.inputs.keys().copied().collect();
    FuseGraph::new(analysis)
}

fn expr(text: &str) -> RecExpr<ENode> {
    text.parse()
        .unwrap_or_else(|e| panic!("`{text}` parses: {e}"))
}

fn rule(name: &str) -> Rule {
    RuleSet::defaults()
        .rewrites
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no default rule `{name}`"))
}

/// Adds `start`, runs only `rules`, and says whether `target` ended up in `start`'s class.
fn proves(egraph: FuseGraph, rules: &[Rule], start: &str, target: &str) -> (bool, FuseGraph) {
    let mut egraph = egraph;
    let root = egraph.add_expr(&expr(start));
    egraph.rebuild();
    assert!(
        egraph[root].data.tensor().is_some(),
        "{start} is {}",
        egraph[root].data.describe()
    );
    let rewrites: Vec<_> = rules.iter().flat_map(Rule::rewrites).collect();
    let runner =
        Runner::<ENode, TypeAnalysis, ()>::new(TypeAnalysis::new(catalogue(), HashMap::new()))
            .with_egraph(egraph)
            .with_iter_limit(6)
            .with_node_limit(10_000)
            .run(&rewrites);
    let egraph = runner.egraph;
    let found = egraph.lookup_expr(&expr(target));
    (found == Some(egraph.find(root)), egraph)
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

/// The inputs every case may use.
fn inputs() -> FuseGraph {
    use DType::*;
    egraph_with(&[
        ("x", F32, &[2, 3]),
        ("y", F32, &[2, 3]),
        ("h", F16, &[2, 3]),
        ("i", I32, &[4]),
        ("j", I32, &[2, 3]),
        ("z", F32, &[]),
        ("b11", F32, &[1, 1]),
        ("x31", F32, &[3, 1]),
        ("c", Bool, &[2, 3]),
        ("v", F32, &[3]),
        ("w", F32, &[2, 1]),
        ("g", F32, &[8, 3]),
        ("g2", F32, &[8, 3]),
        ("g3", F32, &[4, 8, 3]),
        ("cv", Bool, &[3]),
        ("p", F32, &[8, 2]),
        ("q", F32, &[8, 3]),
        ("r", F32, &[8, 4]),
        ("s", F32, &[8, 5]),
    ])
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
        case(
            "div-pow2",
            "(div $x (const 4 f32))",
            "(mul $x (const 0.25 f32))",
        ),
        case(
            "div-pow2",
            "(div $h (const 0.125 f16))",
            "(mul $h (const 8 f16))",
        ),
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
        case(
            "cast-exact-first",
            "(cast (cast $h f32) bf16)",
            "(cast $h bf16)",
        ),
        case("cast-neg", "(cast (neg $x) f16)", "(neg (cast $x f16))"),
        case("cast-neg", "(neg (cast $x f16))", "(cast (neg $x) f16)"),
        case("cast-relu", "(cast (relu $x) f16)", "(relu (cast $x f16))"),
        case("cast-relu", "(relu (cast $x i64))", "(cast (relu $x) i64)"),
        case(
            "cast-max",
            "(cast (max $x $y) f16)",
            "(max (cast $x f16) (cast $y f16))",
        ),
        case(
            "cast-max",
            "(max (cast $x f16) (cast $y f16))",
            "(cast (max $x $y) f16)",
        ),
        case(
            "cast-min",
            "(cast (min $x $y) bf16)",
            "(min (cast $x bf16) (cast $y bf16))",
        ),
        case(
            "cast-min",
            "(min (cast $h f32) (cast $h f32))",
            "(cast (min $h $h) f32)",
        ),
        case(
            "cast-where",
            "(cast (where $c $x $y) i32)",
            "(where $c (cast $x i32) (cast $y i32))",
        ),
        case(
            "cast-where",
            "(where $c (cast $x f16) (cast $y f16))",
            "(cast (where $c $x $y) f16)",
        ),
        case(
            "cast-broadcast",
            "(cast (broadcast_to $v [2,3]) f16)",
            "(broadcast_to (cast $v f16) [2,3])",
        ),
        case(
            "cast-broadcast",
            "(broadcast_to (cast $v f16) [2,3])",
            "(cast (broadcast_to $v [2,3]) f16)",
        ),
        // sum_to_size
        case(
            "sum-to-size-mul-right",
            "(sum_to_size (mul $g $v) [3])",
            "(mul (sum_to_size $g [3]) $v)",
        ),
        case(
            "sum-to-size-mul-right",
            "(mul (sum_to_size $g [3]) $v)",
            "(sum_to_size (mul $g $v) [3])",
        ),
        case(
            "sum-to-size-mul-left",
            "(sum_to_size (mul $v $g) [3])",
            "(mul $v (sum_to_size $g [3]))",
        ),
        case(
            "sum-to-size-mul-left",
            "(mul $v (sum_to_size $g [3]))",
            "(sum_to_size (mul $v $g) [3])",
        ),
        case(
            "sum-to-size-neg",
            "(sum_to_size (neg $g) [3])",
            "(neg (sum_to_size $g [3]))",
        ),
        case(
            "sum-to-size-neg",
            "(neg (sum_to_size $g [3]))",
            "(sum_to_size (neg $g) [3])",
        ),
        case(
            "sum-to-size-div",
            "(sum_to_size (div $g $v) [3])",
            "(div (sum_to_size $g [3]) $v)",
        ),
        case(
            "sum-to-size-div",
            "(div (sum_to_size $g [3]) $v)",
            "(sum_to_size (div $g $v) [3])",
        ),
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
        case(
            "sum-to-size-nested",
            "(sum_to_size (sum_to_size $g3 [8,3]) [3])",
            "(sum_to_size $g3 [3])",
        ),
        case(
            "sum-to-size-nested",
            "(sum_to_size (sum_to_size $g3 [1,3]) [3])",
            "(sum_to_size $g3 [3])",
        ),
        case("sum-to-size-identity", "(sum_to_size $g [8,3])", "$g"),
        case(
            "sum-to-size-leading-axis",
            "(sum_to_size $g [3])",
            "(sum $g [0] false)",
        ),
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
        case(
            "broadcast-nested",
            "(broadcast_to (broadcast_to $v [2,3]) [4,2,3])",
            "(broadcast_to $v [4,2,3])",
        ),
        case(
            "broadcast-clamp",
            "(clamp (broadcast_to $v [2,3]) 0 1)",
            "(broadcast_to (clamp $v 0 1) [2,3])",
        ),
        case(
            "broadcast-clamp",
            "(broadcast_to (clamp $v 0 1) [2,3])",
            "(clamp (broadcast_to $v [2,3]) 0 1)",
        ),
    ];
    // Every pointwise unary op commutes with broadcast_to, both ways.
    for op in [
        "neg",
        "abs",
        "exp",
        "log",
        "log1p",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "relu",
        "gelu",
        "gelu_tanh",
        "silu",
        "softplus",
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
    cases.extend(layout_cases());
    cases
}

/// layout.ron: composed transposes and slices with their attributes computed by hand, slices
/// of concats, reshapes, and each pointwise op across each layout op in both directions.
fn layout_cases() -> Vec<Case> {
    let mut cases = vec![
        // g3 [4,8,3]: [1,2,0] then [2,0,1] is the identity; [1,0,2] then [0,2,1] sends output
        // axis i to input axis p[q[i]] = [1,2,0].
        case(
            "transpose-transpose",
            "(transpose (transpose $g3 [1,2,0]) [2,0,1])",
            "(transpose $g3 [0,1,2])",
        ),
        case(
            "transpose-transpose",
            "(transpose (transpose $g3 [1,0,2]) [0,2,1])",
            "(transpose $g3 [1,2,0])",
        ),
        // Absent perms reverse: reversing twice is the identity permutation.
        case(
            "transpose-transpose",
            "(transpose (transpose $x none) none)",
            "(transpose $x [0,1])",
        ),
        // matmul: g3 [4,8,3] @ (transpose x) [3,2] is [4,8,2]; its
        // last two axes swapped is x @ g3^T, x broadcast over g3's batch. An absent perm
        // reverses all three axes, which moves the batch axis: no rewrite (see
        // `transpose_matmul_declines`).
        case(
            "transpose-matmul",
            "(transpose (matmul $g3 (transpose $x [1,0])) [0,2,1])",
            "(matmul (transpose (transpose $x [1,0]) [1,0]) (transpose $g3 [0,2,1]))",
        ),
        case(
            "transpose-matmul",
            "(transpose (matmul $p $w) [-1,-2])",
            "(matmul (transpose $w [1,0]) (transpose $p [1,0]))",
        ),
        // x [2,3] scaled per row by w [2,1], times x31 [3,1].
        case(
            "matmul-row-scale-out",
            "(matmul (mul $x $w) $x31)",
            "(mul (matmul $x $x31) $w)",
        ),
        case(
            "matmul-row-divide-out",
            "(matmul (div $x $w) $x31)",
            "(div (matmul $x $x31) $w)",
        ),
        case(
            "matmul-row-scale-in",
            "(mul (matmul $x $x31) $w)",
            "(matmul (mul $x $w) $x31)",
        ),
        case(
            "matmul-column-scale-in",
            "(matmul (mul $x $v) $x31)",
            "(matmul $x (mul $x31 (reshape $v [3,1])))",
        ),
        // x [2,3] reshaped to [2,3,1]: x31 [3,1] varies along the split axis whole.
        case(
            "reshape-mul-broadcast",
            "(mul (reshape $x [2,3,1]) $x31)",
            "(reshape (mul $x (reshape $x31 [3])) [2,3,1])",
        ),
        case(
            "normalize-affine",
            "(add (mul (div (sub $x $v) $w) $z) $v)",
            "(add (mul $x (div $z $w)) (sub $v (mul (div $v $w) $z)))",
        ),
        case("transpose-identity", "(transpose $x [0,1])", "$x"),
        case("transpose-identity", "(transpose $x [-2,-1])", "$x"),
        case("transpose-identity", "(transpose $v none)", "$v"),
        // g [8,3]: rows 1:7:2 are 1,3,5; of those [-2:] are 3,5: rows 3:6:2.
        case(
            "slice-slice",
            "(slice (slice $g 0 1 -1 2) 0 -2 none 1)",
            "(slice $g 0 3 6 2)",
        ),
        // Rows ::2 are 0,2,4,6; of those 1::2 are 2,6: rows 2:7:4.
        case(
            "slice-slice",
            "(slice (slice $g -2 0 none 2) -2 1 none 2)",
            "(slice $g -2 2 7 4)",
        ),
        // One element left: the step is 1. Nothing left: 0:0.
        case(
            "slice-slice",
            "(slice (slice $g 0 2 none 3) 0 1 2 1)",
            "(slice $g 0 5 6 1)",
        ),
        case(
            "slice-slice",
            "(slice (slice $g 0 2 none 3) 0 5 9 1)",
            "(slice $g 0 0 0 1)",
        ),
        case("slice-whole", "(slice $x 1 0 3 1)", "$x"),
        case("slice-whole", "(slice $x 0 -5 none 1)", "$x"),
        // g [8,3] + v [3]: columns 1:3 of the sum are columns 1:3 of g plus elements 1:3 of v.
        case(
            "slice-add-broadcast",
            "(slice (add $g $v) 1 1 3 1)",
            "(add (slice $g 1 1 3 1) (slice $v 0 1 3 1))",
        ),
        // v [3] - g [8,3], columns 0:2.
        case(
            "slice-sub-broadcast",
            "(slice (sub $v $g) 1 0 2 1)",
            "(sub (slice $v 0 0 2 1) (slice $g 1 0 2 1))",
        ),
        // x [2,3] * w [2,1], columns 0:2: w is broadcast along axis 1 and keeps its column.
        case(
            "slice-mul-broadcast",
            "(slice (mul $x $w) 1 0 2 1)",
            "(mul (slice $x 1 0 2 1) (slice $w 1 0 1 1))",
        ),
        // x31 [3,1] / v [3] is [3,3]; columns ::2 are 0 and 2, resolved as 0:3:2.
        case(
            "slice-div-broadcast",
            "(slice (div $x31 $v) 1 0 none 2)",
            "(div (slice $x31 1 0 1 1) (slice $v 0 0 3 2))",
        ),
        // p [8,2] ++ q [8,3] along axis 1 is 5 columns: 0:2 is p, -3: is q's 0:3.
        case(
            "slice-concat2-first",
            "(slice (concat $p $q 1) 1 0 2 1)",
            "(slice $p 1 0 2 1)",
        ),
        case(
            "slice-concat2-second",
            "(slice (concat $p $q 1) 1 -3 none 1)",
            "(slice $q 1 0 3 1)",
        ),
        // p ++ q ++ r along axis 1 is 2 + 3 + 4 columns.
        case(
            "slice-concat3-first",
            "(slice (concat $p $q $r 1) 1 0 1 1)",
            "(slice $p 1 0 1 1)",
        ),
        case(
            "slice-concat3-second",
            "(slice (concat $p $q $r 1) 1 2 5 2)",
            "(slice $q 1 0 3 2)",
        ),
        case(
            "slice-concat3-third",
            "(slice (concat $p $q $r 1) 1 5 9 3)",
            "(slice $r 1 0 4 3)",
        ),
        case(
            "reshape-reshape",
            "(reshape (reshape $x [6]) [3,2])",
            "(reshape $x [3,2])",
        ),
        case(
            "reshape-reshape",
            "(reshape (reshape $x [3,2]) [-1])",
            "(reshape $x [-1])",
        ),
        case("reshape-identity", "(reshape $x [2,3])", "$x"),
    ];
    for (layout, attrs) in [
        ("transpose", "[1,0]"),
        ("slice", "1 0 2 1"),
        ("reshape", "[3,2]"),
    ] {
        for op in [
            "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "silu",
        ] {
            let rule: &'static str = format!("{layout}-{op}").leak();
            let after: &'static str = format!("({layout} ({op} $x) {attrs})").leak();
            let before: &'static str = format!("({op} ({layout} $x {attrs}))").leak();
            cases.push(case(rule, before, after));
            cases.push(case(rule, after, before));
        }
        let rule: &'static str = format!("{layout}-cast").leak();
        let after: &'static str = format!("({layout} (cast $x f16) {attrs})").leak();
        let before: &'static str = format!("(cast ({layout} $x {attrs}) f16)").leak();
        cases.push(case(rule, before, after));
        cases.push(case(rule, after, before));
        for op in ["add", "sub", "mul", "div", "max", "min"] {
            let rule: &'static str = format!("{layout}-{op}-both").leak();
            let after: &'static str = format!("({layout} ({op} $x $y) {attrs})").leak();
            let before: &'static str =
                format!("({op} ({layout} $x {attrs}) ({layout} $y {attrs}))").leak();
            cases.push(case(rule, before, after));
            cases.push(case(rule, after, before));
        }
    }
    cases
}

#[test]
fn every_default_rule_fires_and_gives_the_expected_term() {
    let cases = fires();
    let mut covered = BTreeSet::new();
    for case in &cases {
        let (found, egraph) = proves(inputs(), &[rule(case.rule)], case.start, case.target);
        assert!(
            found,
            "rule `{}` did not rewrite {} into {}",
            case.rule, case.start, case.target
        );
        assert!(
            egraph.analysis.conflicts.is_empty(),
            "rule `{}`: {:?}",
            case.rule,
            egraph.analysis.conflicts
        );
        // The conditions exclude every instance whose right-hand side would be ill-typed.
        assert!(
            egraph.analysis.ill_typed.is_empty(),
            "rule `{}` on {}: {:?}",
            case.rule,
            case.start,
            egraph.analysis.ill_typed
        );
        covered.insert(case.rule);
    }
    let all: BTreeSet<String> = RuleSet::defaults()
        .rewrites
        .iter()
        .map(|r| r.name.clone())
        .collect();
    let missing: Vec<&String> = all
        .iter()
        .filter(|n| !covered.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "default rules without a case: {missing:?}"
    );
    // Every bidirectional rule has a case in each direction.
    for r in RuleSet::defaults()
        .rewrites
        .iter()
        .filter(|r| r.bidirectional)
    {
        let n = cases.iter().filter(|c| c.rule == r.name).count();
        assert!(
            n >= 2,
            "bidirectional rule `{}` needs a reverse case",
            r.name
        );
    }
}

/// Terms a rule must leave alone: its conditions exclude them. `target` must not appear in
/// the start term's class, and nothing may be flagged unsound.
fn refuses() -> Vec<Case> {
    vec![
        // x * 1 with x f16 and 1 f32 promotes to f32.
        case("mul-one-right", "(mul $h (const 1 f32))", "$h"),
        // x * 1 where 1 broadcasts x: [3] * [2,3].
        case(
            "mul-one-right",
            "(mul $v (broadcast_to (const 1 f32) [2,3]))",
            "$v",
        ),
        // Float x + 0 is not x (-0.0 + 0.0 = +0.0).
        case("add-zero-int-right", "(add $x (const 0 f32))", "$x"),
        case("add-neg-zero-right", "(add $x (const 0 f32))", "$x"),
        // Integer double negation saturates.
        case("neg-neg", "(neg (neg $i))", "$i"),
        case("sub-add-neg", "(sub $x $j)", "(add $x (neg $j))"),
        // Not a power of two; a power of two whose reciprocal overflows f16.
        case(
            "div-pow2",
            "(div $x (const 3 f32))",
            "(mul $x (div (const 1 f32) (const 3 f32)))",
        ),
        case(
            "div-pow2",
            "(div $h (const 0.0000152587890625 f16))",
            "(mul $h (div (const 1 f16) (const 0.0000152587890625 f16)))",
        ),
        // The lossy down-then-up trip is never removed.
        case("cast-up-down", "(cast (cast $x f16) f32)", "$x"),
        case(
            "cast-exact-first",
            "(cast (cast $x f16) bf16)",
            "(cast $x bf16)",
        ),
        // Integer targets for neg and max, bool targets for relu.
        case("cast-neg", "(cast (neg $x) i32)", "(neg (cast $x i32))"),
        case(
            "cast-max",
            "(cast (max $x $y) i32)",
            "(max (cast $x i32) (cast $y i32))",
        ),
        case(
            "cast-relu",
            "(cast (relu $x) bool)",
            "(relu (cast $x bool))",
        ),
        // Nor i32 targets: i64 -> i32 wraps, which is not monotone.
        case(
            "cast-relu",
            "(relu (cast (cast $j i64) i32))",
            "(cast (relu (cast $j i64)) i32)",
        ),
        // Mixed operand dtypes would be converted before max/where runs.
        case(
            "cast-max",
            "(cast (max $x $h) bf16)",
            "(max (cast $x bf16) (cast $h bf16))",
        ),
        case(
            "cast-where",
            "(cast (where $c $x $h) f16)",
            "(where $c (cast $x f16) (cast $h f16))",
        ),
        // A factor of the full shape does not leave the sum; a condition of the full shape
        // does not either.
        case(
            "sum-to-size-mul-right",
            "(sum_to_size (mul $g $g2) [3])",
            "(mul (sum_to_size $g [3]) $g2)",
        ),
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
        case(
            "sum-to-size-add",
            "(add (sum_to_size $g [3]) (sum_to_size $v [3]))",
            "(sum_to_size (add $g $v) [3])",
        ),
        // Not the leading axis.
        case(
            "sum-to-size-leading-axis",
            "(sum_to_size $g3 [3])",
            "(sum $g3 [0] false)",
        ),
        // Rank 3 pieces.
        case(
            "sum-concat-2",
            "(sum (concat $g3 $g3 1) [0] false)",
            "(concat (sum $g3 [0] false) (sum $g3 [0] false) 0)",
        ),
        // -0.0 stored as an integer is +0 (and -0.0 + +0 = +0); -1 stored as bool is 1.
        case("add-neg-zero-right", "(add $x (const -0.0 i32))", "$x"),
        case("mul-neg-one-right", "(mul $x (const -1 bool))", "(neg $x)"),
        // s must broadcast to x itself, not only to the product (x [] * b [1,1]).
        case(
            "sum-to-size-mul-right",
            "(sum_to_size (mul $z $b11) [1,1])",
            "(mul (sum_to_size $z [1,1]) $b11)",
        ),
        case(
            "sum-to-size-where-right",
            "(sum_to_size (where $cv (const 0 f32) $x31) [1,3])",
            "(where $cv (const 0 f32) (sum_to_size $x31 [1,3]))",
        ),
        // Implicit broadcasting needs the other operand at the full shape.
        case(
            "broadcast-add-implicit-right",
            "(add $v (broadcast_to $v [2,3]))",
            "(add $v $v)",
        ),
        // An absent perm reverses the axes of a matrix; [1,0] on x is no identity.
        case("transpose-identity", "(transpose $x none)", "$x"),
        case("transpose-identity", "(transpose $x [1,0])", "$x"),
        // Two slices along different axes do not compose into one.
        case(
            "slice-slice",
            "(slice (slice $g 0 0 4 1) 1 0 2 1)",
            "(slice $g 0 0 4 1)",
        ),
        // Columns 1:3 of p ++ q straddle p and q.
        case(
            "slice-concat2-first",
            "(slice (concat $p $q 1) 1 1 3 1)",
            "(slice $p 1 1 2 1)",
        ),
        case(
            "slice-concat2-second",
            "(slice (concat $p $q 1) 1 1 3 1)",
            "(slice $q 1 0 1 1)",
        ),
        // Rows of p ++ q along axis 1 are not a slice along axis 1.
        case(
            "slice-concat2-first",
            "(slice (concat $p $q 1) 0 0 2 1)",
            "(slice $p 0 0 2 1)",
        ),
        // h f16 ++ x f32 is f32: a slice of h alone would be f16.
        case(
            "slice-concat2-first",
            "(slice (concat $h $x 0) 0 0 2 1)",
            "(slice $h 0 0 2 1)",
        ),
        // Every other column is not the whole axis.
        case("slice-whole", "(slice $x 1 0 3 2)", "$x"),
        case("reshape-identity", "(reshape $x [3,2])", "$x"),
        // v [3] and x31 [3,1] broadcast to [3,3] when added: not one shape.
        case(
            "reshape-add-both",
            "(add (reshape $v [3,1]) (reshape $x31 [3,1]))",
            "(reshape (add $v $x31) [3,1])",
        ),
        case(
            "slice-mul-both",
            "(mul (slice $w 1 0 1 1) (slice $x 1 0 1 1))",
            "(slice (mul $w $x) 1 0 1 1)",
        ),
        // v [3] has no axis 0 to slice: rows 0:4 of g + v cannot be split into operands' slices.
        case(
            "slice-add-broadcast",
            "(slice (add $g $v) 0 0 4 1)",
            "(add (slice $g 0 0 4 1) $v)",
        ),
    ]
}

#[test]
fn default_rules_refuse_what_their_conditions_exclude() {
    for case in refuses() {
        let (found, egraph) = proves(inputs(), &[rule(case.rule)], case.start, case.target);
        assert!(
            !found,
            "rule `{}` rewrote {} into {}",
            case.rule, case.start, case.target
        );
        assert!(
            egraph.analysis.conflicts.is_empty(),
            "rule `{}`: {:?}",
            case.rule,
            egraph.analysis.conflicts
        );
        // The conditions exclude every instance whose right-hand side would be ill-typed.
        assert!(
            egraph.analysis.ill_typed.is_empty(),
            "rule `{}` on {}: {:?}",
            case.rule,
            case.start,
            egraph.analysis.ill_typed
        );
    }
}

#[test]
fn all_default_rules_together_stay_sound_on_the_cases() {
    let rules = RuleSet::defaults().rewrites;
    for case in fires().iter().chain(&refuses()) {
        let (_, egraph) = proves(inputs(), &rules, case.start, case.start);
        assert!(
            egraph.analysis.conflicts.is_empty(),
            "{}: {:?}",
            case.start,
            egraph.analysis.conflicts
        );
        assert!(
            egraph.analysis.ill_typed.is_empty(),
            "{}: {:?}",
            case.start,
            egraph.analysis.ill_typed
        );
    }
}

#[test]
fn lstm_bias_gradient_becomes_column_sums() {
    let cat = catalogue();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/lstm_cell_backward.ron"
    ))
    .unwrap();
    let (graph, _) = fusebox::graph::file::parse(&text, "lstm_cell_backward.ron", &cat).unwrap();
    let dag = Dag::from_graph(&graph, &cat).unwrap();
    let mut egraph = new_egraph(&dag, &cat);
    let seeded = seed(&mut egraph, &dag);
    let rules: Vec<Rule> = ["sum-to-size-leading-axis", "sum-concat-4"]
        .iter()
        .map(|n| rule(n))
        .collect();
    let rewrites: Vec<_> = rules.iter().flat_map(Rule::rewrites).collect();
    let runner =
        Runner::<ENode, TypeAnalysis, ()>::new(TypeAnalysis::new(catalogue(), HashMap::new()))
            .with_egraph(egraph)
            .with_iter_limit(5)
            .run(&rewrites);
    let egraph = runner.egraph;
    assert!(egraph.analysis.conflicts.is_empty());
    let bias = seeded
        .outputs
        .iter()
        .find(|(n, _)| n == "grad_bias")
        .map(|(_, id)| egraph.find(*id))
        .unwrap();
    // The gate gradients' classes, by the names of the nodes that computed them.
    let class_of = |name: &str| -> Id {
        let i = seeded.node_names.iter().position(|n| n == name).unwrap();
        egraph.find(seeded.node_classes[i])
    };
    let sum_of = |name: &str| -> Id {
        let axes = egraph
            .lookup(ENode::Attr(fusebox::egraph::Leaf::Ints(vec![0])))
            .unwrap();
        let keep = egraph
            .lookup(ENode::Attr(fusebox::egraph::Leaf::Bool(false)))
            .unwrap();
        egraph
            .lookup(ENode::op("sum", vec![class_of(name), axes, keep]))
            .unwrap_or_else(|| panic!("sum of {name} over the batch"))
    };
    let zero = egraph
        .lookup(ENode::Attr(fusebox::egraph::Leaf::num(0.0)))
        .unwrap();
    let concat = ENode::op(
        "concat",
        vec![
            sum_of("grad_ingate"),
            sum_of("grad_forgetgate"),
            sum_of("grad_cellgate"),
            sum_of("grad_outgate"),
            zero,
        ],
    );
    assert_eq!(egraph.lookup(concat), Some(bias));
    // The bias gradient is [4096] f32, as the graph says.
    assert_eq!(
        egraph[bias].data.ty(),
        Some(&TensorType {
            dtype: DType::F32,
            shape: vec![4096]
        })
    );
}

// ------------------------------------------------------------------ the checked applier

fn one_rule(text: &str) -> Rule {
    let mut rules = load_rules(text, "planted.ron", &catalogue()).unwrap();
    rules.remove(0)
}

#[test]
fn a_type_changing_rule_is_recorded_as_unsound_and_not_applied() {
    // Drops a cast whatever its dtype: f32 -> f16 casts become "equal" to their f32 input.
    let bad = one_rule(r#"[Rule(name: "drop-cast", lhs: "(cast ?x ?t)", rhs: "?x")]"#);
    let (found, egraph) = proves(inputs(), &[bad], "(cast $x f16)", "$x");
    assert!(!found, "the ill-typed union must not happen");
    assert_eq!(
        egraph.analysis.conflicts,
        vec!["rule `drop-cast` is unsound: it rewrote f16[2, 3] into f32[2, 3]".to_string()]
    );

    // The reverse direction of a bidirectional rule is named as such.
    let bad = one_rule(
        r#"[Rule(name: "neg-cast", lhs: "(neg (cast ?x ?t))", rhs: "(cast (neg ?x) f16)", bidirectional: false)]"#,
    );
    let (_, egraph) = proves(inputs(), &[bad], "(neg (cast $x bf16))", "$x");
    assert_eq!(
        egraph.analysis.conflicts,
        vec!["rule `neg-cast` is unsound: it rewrote bf16[2, 3] into f16[2, 3]".to_string()]
    );
    // Only the reverse direction matches an f16 cast here, and it builds an f32 one.
    let bad = one_rule(
        r#"[Rule(name: "retype", lhs: "(cast (neg ?x) f32)", rhs: "(cast (neg ?x) f16)", bidirectional: true)]"#,
    );
    let (_, egraph) = proves(inputs(), &[bad], "(cast (neg $x) f16)", "$x");
    assert_eq!(
        egraph.analysis.conflicts,
        vec!["rule `retype (reverse)` is unsound: it rewrote f16[2, 3] into f32[2, 3]".to_string()]
    );
}

#[test]
fn a_rule_that_changes_a_known_constant_is_unsound() {
    // x * 0 -> 0 is false for x = Inf (Inf * 0 = NaN).
    let bad = one_rule(
        r#"[Rule(name: "mul-zero", lhs: "(mul ?x (const 0 ?t))", rhs: "(const 0 ?t)", when: [KeepsType("?x")])]"#,
    );
    let (_, egraph) = proves(
        inputs(),
        &[bad],
        "(mul (const inf f32) (const 0 f32))",
        "$x",
    );
    assert_eq!(
        egraph.analysis.conflicts,
        vec![
            "rule `mul-zero` is unsound: it rewrote the constant NaN into 0.0 (f32[])".to_string()
        ]
    );
}

#[test]
fn ill_typed_instances_are_skipped_and_counted() {
    // Summing x to [7] is ill-typed for every x of these cases ([2, 3] does not end in 7).
    let odd = one_rule(
        r#"[Rule(name: "odd", lhs: "(neg ?x)", rhs: "(neg (broadcast_to (sum_to_size ?x [7]) [2,3]))")]"#,
    );
    let mut egraph = inputs();
    let root = egraph.add_expr(&expr("(neg $x)"));
    egraph.rebuild();
    let before = egraph.total_number_of_nodes();
    let rewrites = odd.rewrites();
    let matches = rewrites[0].search(&egraph);
    assert_eq!(matches.len(), 1);
    let applied = rewrites[0].apply(&mut egraph, &matches);
    assert!(applied.is_empty());
    assert_eq!(egraph.analysis.ill_typed.get("odd"), Some(&1));
    assert!(egraph.analysis.conflicts.is_empty());
    // Nothing was added.
    egraph.rebuild();
    assert_eq!(egraph.total_number_of_nodes(), before);
    assert_eq!(egraph[root].nodes.len(), 1);
}

#[test]
fn conditions_guard_the_applier_too() {
    // The same rule with a condition that never holds here applies nowhere.
    let guarded = one_rule(
        r#"[Rule(name: "drop-cast-guarded", lhs: "(cast ?x ?t)", rhs: "?x", when: [SameDtype("?x", "?t")])]"#,
    );
    let (found, egraph) = proves(
        inputs(),
        std::slice::from_ref(&guarded),
        "(cast $x f16)",
        "$x",
    );
    assert!(!found);
    assert!(egraph.analysis.conflicts.is_empty());
    let (found, _) = proves(inputs(), &[guarded], "(cast $x f32)", "$x");
    assert!(found);
    // Rule::conditions_hold agrees with the applier.
    let rules = rewrite::default_rules(&catalogue());
    let cast_same = rules.iter().find(|r| r.name == "cast-same").unwrap();
    let mut egraph = inputs();
    let root = egraph.add_expr(&expr("(cast $h f16)"));
    egraph.rebuild();
    let rewrites = cast_same.rewrites();
    let m = rewrites[0].search(&egraph);
    assert_eq!(m.len(), 1);
    assert!(cast_same.conditions_hold(&egraph, root, &m[0].substs[0]));
}

// ------------------------------------------------------------------ computed attributes

/// A rule whose line 6 is `    compute: [...],`: the computation's name starts at column 15.
fn computing_rule(lhs: &str, rhs: &str, compute: &str, extra: &str) -> String {
    rule_text(lhs, rhs, "", &format!("\n    compute: [{compute}],{extra}"))
}

const COMPOSE: &str = r#"ComposePerm(into: "?r", x: "?x", inner: "?p", outer: "?q")"#;
const TWICE: &str = "(transpose (transpose ?x ?p) ?q)";

#[test]
fn computed_attributes_are_checked_at_load_with_their_position() {
    // Sound as written: loads, and binds ?r as an integer list.
    let text = computing_rule(TWICE, "(transpose ?x ?r)", COMPOSE, "");
    let rules = load_rules(&text, "r.ron", &catalogue()).unwrap();
    assert_eq!(rules[0].compute.len(), 1);
    assert_eq!(
        rules[0]
            .computed
            .keys()
            .map(|v| v.to_string())
            .collect::<Vec<_>>(),
        ["?r"]
    );
    // A list of integers where slice wants one integer: at `?r` inside the rhs string.
    let e = load_err(&computing_rule(
        TWICE,
        "(slice ?x ?r 0 none 1)",
        COMPOSE,
        "",
    ));
    assert_eq!(
        e,
        "r.ron:4:21: invalid rule: `?r` is computed as an attribute (a list of integers) but \
         fills attribute `axis` of `slice` here, which must be an integer"
    );
    // ...or where a tensor belongs.
    let e = load_err(&computing_rule(TWICE, "(neg ?r)", COMPOSE, ""));
    assert!(
        e.starts_with("r.ron:4:16: invalid rule: `?r` is computed as an attribute"),
        "{e}"
    );
    // An input the left-hand side does not bind, at its value in the computation.
    let unbound = COMPOSE.replace(r#"x: "?x""#, r#"x: "?y""#);
    let e = load_err(&computing_rule(TWICE, "(transpose ?x ?r)", &unbound, ""));
    assert_eq!(
        e,
        "r.ron:6:42: invalid rule: `?y` in `ComposePerm` is not bound by the left-hand side"
    );
    // An input of the wrong kind: a tensor where a permutation is read.
    let wrong = COMPOSE.replace(r#"inner: "?p""#, r#"inner: "?x""#);
    let e = load_err(&computing_rule(TWICE, "(transpose ?x ?r)", &wrong, ""));
    assert_eq!(
        e,
        "r.ron:6:55: invalid rule: `ComposePerm` reads an attribute (a list of integers) as \
         `inner`, but `?x` is a tensor"
    );
    // Outputs must be fresh, and used.
    let clash = COMPOSE.replace(r#"into: "?r""#, r#"into: "?p""#);
    let e = load_err(&computing_rule(TWICE, "(transpose ?x ?p)", &clash, ""));
    assert_eq!(
        e,
        "r.ron:6:33: invalid rule: `?p` is already bound: `ComposePerm` must bind a fresh variable"
    );
    let e = load_err(&computing_rule(TWICE, "(transpose ?x ?q)", COMPOSE, ""));
    assert!(
        e.starts_with("r.ron:6:33: invalid rule: `?r` is computed but the right-hand side never"),
        "{e}"
    );
    // An unbound right-hand variable is still refused.
    let e = load_err(&computing_rule(TWICE, "(transpose ?x ?s)", COMPOSE, ""));
    assert!(e.starts_with("r.ron:4:"), "{e}");
    // No reverse direction for a computing rule.
    let e = load_err(&computing_rule(
        TWICE,
        "(transpose ?x ?r)",
        COMPOSE,
        "\n    bidirectional: true,",
    ));
    assert!(
        e.starts_with(
            "r.ron:6:14: invalid rule: a rule that computes attributes cannot be bidirectional"
        ),
        "{e}"
    );
    // List fields have fixed lengths; `pick` must name an operand.
    let short = r#"ComposeSlices(into: ["?s", "?e"], x: "?x", axis: "?a", inner: ["?s1", "?e1", "?k1"], outer: ["?s2", "?e2", "?k2"])"#;
    let e = load_err(&computing_rule(
        "(slice (slice ?x ?a ?s1 ?e1 ?k1) ?a ?s2 ?e2 ?k2)",
        "(slice ?x ?a ?s ?e ?k2)",
        short,
        "",
    ));
    assert_eq!(
        e,
        "r.ron:6:35: invalid rule: `into` of `ComposeSlices` lists 3 variables, not 2"
    );
    let pick = r#"SliceOfConcat(into: ["?s2", "?e2"], operands: ["?a", "?b"], pick: 2, axis: "?ax", slice: ["?s", "?e", "?k"])"#;
    let e = load_err(&computing_rule(
        "(slice (concat ?a ?b ?ax) ?ax ?s ?e ?k)",
        "(slice ?a ?ax ?s2 ?e2 ?k)",
        pick,
        "",
    ));
    assert_eq!(
        e,
        "r.ron:6:81: invalid rule: `pick` is 2, but there are 2 operands (it counts from 0)"
    );
    // An unknown computation is a RON error, located by ron.
    let e = load_err(&computing_rule(
        TWICE,
        "(transpose ?x ?r)",
        "ComposePerms()",
        "",
    ));
    assert!(e.starts_with("r.ron:6:"), "{e}");
}

/// A computation that declines (a slice reaching into two operands) leaves the match alone
/// without counting it as ill-typed or unsound, exactly like a condition that fails.
#[test]
fn a_declined_computation_skips_the_match() {
    let r = rule("slice-concat2-first");
    let mut egraph = inputs();
    let root = egraph.add_expr(&expr("(slice (concat $p $q 1) 1 1 3 1)"));
    egraph.rebuild();
    let rewrites = r.rewrites();
    let matches = rewrites[0].search(&egraph);
    assert_eq!(matches.len(), 1);
    let mut subst_egraph = egraph.clone();
    assert!(
        r.compute_attrs(&mut subst_egraph, &matches[0].substs[0])
            .is_none()
    );
    let applied = rewrites[0].apply(&mut egraph, &matches);
    assert!(applied.is_empty());
    assert!(egraph.analysis.ill_typed.is_empty());
    assert!(egraph.analysis.conflicts.is_empty());
    egraph.rebuild();
    assert_eq!(egraph[root].nodes.len(), 1);
}

/// Scales move onto a product's operands only where the algebra allows: a per-column scale of
/// a product (`v` [3] of a [3,3] product) is no row scale of its left operand; a scale of `x`
/// varying along its rows too (`y` [2,3]) is no column scale of the right operand's rows; a
/// scale varying along part of the axes a reshape merges does not pass the reshape.
#[test]
fn scales_moving_onto_operands_decline_elsewhere() {
    declines(
        "matmul-row-scale-in",
        &["(mul (matmul $x31 (reshape $v [1,3])) $v)"],
    );
    declines("matmul-column-scale-in", &["(matmul (mul $x $y) $x31)"]);
    declines(
        "reshape-mul-broadcast",
        &["(mul (reshape $g [4,2,3]) (reshape $w [2,1,1]))"],
    );
}

/// With the weights given on every run (no input fixed) the rules that move work onto them do
/// not apply: the move would cost a kernel over the weight per run, which pays at some batch
/// sizes and not at others, and a model compiled at several sizes must keep its kernels.
#[test]
fn work_moves_onto_weights_only() {
    let cases = [
        ("matmul-row-scale-in", "(mul (matmul $x $x31) $w)"),
        ("matmul-column-scale-in", "(matmul (mul $x $v) $x31)"),
        ("normalize-affine", "(add (mul (div (sub $x $v) $w) $z) $v)"),
    ];
    for (name, start) in cases {
        let r = rule(name);
        let mut egraph = inputs();
        // Only x is fixed: the scales and the other operand are given per run.
        egraph.analysis.fixed = [Symbol::from("x")].into_iter().collect();
        let root = egraph.add_expr(&expr(start));
        egraph.rebuild();
        let rewrites = r.rewrites();
        let matches = rewrites[0].search(&egraph);
        assert!(!matches.is_empty(), "{name}: the pattern matches {start}");
        assert!(
            rewrites[0].apply(&mut egraph, &matches).is_empty(),
            "{name}"
        );
        egraph.rebuild();
        assert_eq!(egraph[root].nodes.len(), 1, "{name}: {start}");
    }
}

/// A row scale moves past a product only when it is constant along each row of the left
/// operand and both operands are matrices: a per-column scale `v` [3] of `x` [2,3], a scale
/// of another dtype, and a product with a vector (`v` as the right operand) stay as written.
#[test]
fn matmul_row_scale_declines() {
    declines(
        "matmul-row-scale-out",
        &[
            "(matmul (mul $x $v) $x31)",
            "(matmul (mul $x $w) $v)",
            "(matmul (mul $x $w) (cast $x31 f16))",
        ],
    );
}

/// Asserts that rule `name` rewrites none of `starts` (terms over [`inputs`]), and that
/// trying it leaves no ill-typed class.
fn declines(name: &str, starts: &[&str]) {
    let r = rule(name);
    for start in starts {
        let mut egraph = inputs();
        let root = egraph.add_expr(&expr(start));
        egraph.rebuild();
        let rewrites = r.rewrites();
        let matches = rewrites[0].search(&egraph);
        let applied = rewrites[0].apply(&mut egraph, &matches);
        assert!(applied.is_empty(), "{name}: {start}");
        egraph.rebuild();
        assert_eq!(egraph[root].nodes.len(), 1, "{name}: {start}");
        assert!(egraph.analysis.ill_typed.is_empty(), "{name}: {start}");
    }
}

/// `transpose-matmul` applies only to a transpose that swaps the product's last two axes and
/// keeps its batch axes: reversing all three axes of a batched product (the batch axis moves)
/// is no product of transposes, nor is the transpose of a product of a vector.
#[test]
fn transpose_matmul_declines() {
    declines(
        "transpose-matmul",
        &[
            "(transpose (matmul $g3 (transpose $x [1,0])) [2,1,0])",
            "(transpose (matmul $g3 (transpose $x [1,0])) [1,0,2])",
            "(transpose (matmul $g $v) none)",
        ],
    );
}

// ------------------------------------------------------------------ layout: what gets extracted

fn optimized(text: &str) -> fusebox::graph::Graph {
    optimized_with(text, RuleSet::defaults())
}

/// [`optimized`] under `rules`.
fn optimized_with(text: &str, rules: RuleSet) -> fusebox::graph::Graph {
    let graph = fusebox::graph::file::parse(text, "test.ron", &rules.ops)
        .expect("test graph is valid")
        .0;
    let out = fusebox::optimize::optimize(&graph, &rules, &fusebox::optimize::Options::default())
        .expect("optimize succeeds");
    // The optimized graph computes what the input did.
    let inputs = fusebox::eval::random_inputs(&graph, 3);
    let before = fusebox::eval::evaluate(&graph, &rules.ops, &inputs).unwrap();
    let after = fusebox::eval::evaluate(&out.graph, &rules.ops, &inputs).unwrap();
    for name in &graph.outputs {
        assert_eq!(before[name].values(), after[name].values(), "output {name}");
    }
    out.graph
}

fn ops(graph: &fusebox::graph::Graph) -> Vec<&str> {
    graph.nodes.iter().map(|n| n.op.as_str()).collect()
}

/// The node computing `name`.
fn node<'g>(graph: &'g fusebox::graph::Graph, name: &str) -> &'g fusebox::graph::Node {
    graph
        .nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name} in {:?}", graph.nodes))
}

#[test]
fn transposes_that_cancel_extract_to_their_input() {
    let g = optimized(
        r#"Graph(name: "tt", inputs: [Input(name: "x", dtype: "f32", shape: [64, 32, 16])],
          nodes: [Node(name: "a", op: "transpose", args: ["x"], attrs: {"perm": [1, 2, 0]}),
                  Node(name: "b", op: "transpose", args: ["a"], attrs: {"perm": [2, 0, 1]}),
                  Node(name: "out", op: "tanh", args: ["b"])],
          outputs: ["out"])"#,
    );
    assert_eq!(ops(&g), ["tanh"]);
    assert_eq!(node(&g, "out").args, ["x"]);
}

/// Under the default rules two slices in a row are one kernel either way (the second view
/// extends the first), so the composed form saves nothing there; with layout ops as copies
/// (`Layout: Alone`) each slice is a kernel, and `slice-slice` composing them saves one.
#[test]
fn two_slices_extract_to_one() {
    let mut rules = RuleSet::defaults();
    rules.fusion = fusebox::rules::FusionRules::load_str(
        "Fusion(kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}, max_kernel_args: 64)",
        "fusion.ron",
        &rules.ops,
    )
    .unwrap();
    let g = optimized_with(
        r#"Graph(name: "ss", inputs: [Input(name: "x", dtype: "f32", shape: [64, 100])],
          nodes: [Node(name: "a", op: "slice", args: ["x"], attrs: {"axis": 1, "start": 3, "end": -7, "step": 3}),
                  Node(name: "b", op: "slice", args: ["a"], attrs: {"axis": 1, "start": -10, "step": 2}),
                  Node(name: "out", op: "neg", args: ["b"])],
          outputs: ["out"])"#,
        rules,
    );
    let slices: Vec<&fusebox::graph::Node> = g.nodes.iter().filter(|n| n.op == "slice").collect();
    assert_eq!(slices.len(), 1, "{:?}", g.nodes);
    // Columns 3, 6, ..., 90 (30 of them); the last 10 of those every other one: 63, 69, ..., 87.
    let attrs = &slices[0].attrs;
    let int = |k: &str| match attrs.get(k) {
        Some(fusebox::attr::AttrValue::Int(v)) => *v,
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!((int("start"), int("end"), int("step")), (63, 88, 6));
}

/// The bidirectional rule `slice-exp` puts both orders in the e-graph every time; which one is
/// emitted is the cost model's choice. exp over a 64-column slice of [256, 4096] costs 1/64 of
/// exp over the whole: computed after the slice, whichever order the input had.
#[test]
fn a_pointwise_op_moves_across_a_slice_only_when_that_is_cheaper() {
    let before_slice = optimized(
        r#"Graph(name: "es", inputs: [Input(name: "x", dtype: "f32", shape: [256, 4096])],
          nodes: [Node(name: "e", op: "exp", args: ["x"]),
                  Node(name: "out", op: "slice", args: ["e"], attrs: {"axis": 1, "start": 0, "end": 64})],
          outputs: ["out"])"#,
    );
    assert_eq!(
        ops(&before_slice),
        ["slice", "exp"],
        "{:?}",
        before_slice.nodes
    );
    assert_eq!(before_slice.nodes[0].args, ["x"]);
    let after_slice = optimized(
        r#"Graph(name: "se", inputs: [Input(name: "x", dtype: "f32", shape: [256, 4096])],
          nodes: [Node(name: "s", op: "slice", args: ["x"], attrs: {"axis": 1, "start": 0, "end": 64}),
                  Node(name: "out", op: "exp", args: ["s"])],
          outputs: ["out"])"#,
    );
    assert_eq!(
        ops(&after_slice),
        ["slice", "exp"],
        "{:?}",
        after_slice.nodes
    );
    assert_eq!(after_slice.nodes[0].args, ["x"]);
    // When exp over the whole is an output anyway, moving it after the slice would compute
    // the 64 columns twice: the slice keeps reading the whole exp.
    let shared = optimized(
        r#"Graph(name: "es2", inputs: [Input(name: "x", dtype: "f32", shape: [256, 4096])],
          nodes: [Node(name: "e", op: "exp", args: ["x"]),
                  Node(name: "out", op: "slice", args: ["e"], attrs: {"axis": 1, "start": 0, "end": 64})],
          outputs: ["e", "out"])"#,
    );
    assert_eq!(ops(&shared), ["exp", "slice"], "{:?}", shared.nodes);
    assert_eq!(node(&shared, "out").args, ["e"]);
}
