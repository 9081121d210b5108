//! Loading `fusion.ron`: the op budget (`max_kernel_ops`), the body budget
//! (`max_kernel_terms`), and roles checked against what the
//! kernel lowering can generate, each rejected at its exact file position.

use fusebox::rules::{Catalogue, FusionRules, Role};

const KINDS: &str = "kinds: {Pointwise: Join, Layout: Alone, Reduction: End, Opaque: Never}";

fn load(text: &str) -> fusebox::Result<FusionRules> {
    FusionRules::load_str(text, "f.ron", &Catalogue::defaults())
}

fn error(text: &str) -> String {
    load(text).unwrap_err().to_string()
}

const LAYOUT_END: &str = "a layout op reduces nothing, so it cannot end a kernel: broadcast_to, \
    reshape, transpose and slice may be `Join` (a kernel reads them through views), concat `Join` \
    (a kernel reads it by ranges), or any of them `Alone` (a copy of their own)";

// ---------------------------------------------------------------- max_kernel_ops

#[test]
fn max_kernel_ops_is_optional_and_defaults_to_the_shipped_value() {
    let rules = load(&format!("Fusion({KINDS}, max_kernel_args: 8)")).unwrap();
    assert_eq!(rules.max_kernel_ops, 128);
    let rules = load(&format!(
        "Fusion({KINDS}, max_kernel_args: 8, max_kernel_ops: 7)"
    ))
    .unwrap();
    assert_eq!(rules.max_kernel_ops, 7);
    let rules = load(&format!(
        "Fusion({KINDS}, max_kernel_args: 8, max_kernel_ops: 1)"
    ))
    .unwrap();
    assert_eq!(rules.max_kernel_ops, 1);
    assert_eq!(FusionRules::defaults().max_kernel_ops, 128);
    // The shipped file states the value its absence implies.
    let shipped = include_str!("../rules/fusion.ron");
    assert!(shipped.contains("\n    max_kernel_ops: 128,\n"));
    let without = shipped.replace("\n    max_kernel_ops: 128,\n", "\n");
    assert_eq!(
        FusionRules::load_str(&without, "f.ron", &Catalogue::defaults()).unwrap(),
        FusionRules::defaults()
    );
}

#[test]
fn max_kernel_ops_of_zero_is_a_located_error() {
    let text = format!("Fusion(\n  {KINDS},\n  max_kernel_args: 8,\n  max_kernel_ops: 0,\n)");
    assert_eq!(
        error(&text),
        "f.ron:4:19: invalid rule: `max_kernel_ops` must be at least 1 (1 turns fusion off), found 0"
    );
}

#[test]
fn max_kernel_ops_of_the_wrong_type_is_a_located_error() {
    for value in ["-3", "\"many\"", "2.5"] {
        let text =
            format!("Fusion(\n  {KINDS},\n  max_kernel_ops: {value},\n  max_kernel_args: 8)");
        let shown = error(&text);
        assert!(shown.starts_with("f.ron:3:"), "{value}: {shown}");
        assert!(shown.contains("RON syntax"), "{value}: {shown}");
    }
}

// ---------------------------------------------------------------- max_kernel_terms

#[test]
fn max_kernel_terms_is_optional_and_defaults_to_the_shipped_value() {
    let rules = load(&format!("Fusion({KINDS}, max_kernel_args: 8)")).unwrap();
    assert_eq!(rules.max_kernel_terms, 4096);
    let rules = load(&format!(
        "Fusion({KINDS}, max_kernel_args: 8, max_kernel_terms: 20)"
    ))
    .unwrap();
    assert_eq!(rules.max_kernel_terms, 20);
    let shipped = include_str!("../rules/fusion.ron");
    assert!(shipped.contains("\n    max_kernel_terms: 4096,\n"));
    let without = shipped.replace("\n    max_kernel_terms: 4096,\n", "\n");
    assert_eq!(
        FusionRules::load_str(&without, "f.ron", &Catalogue::defaults()).unwrap(),
        FusionRules::defaults()
    );
}

#[test]
fn max_kernel_terms_of_zero_is_a_located_error() {
    let text = format!("Fusion(\n  {KINDS},\n  max_kernel_args: 8,\n  max_kernel_terms: 0,\n)");
    assert_eq!(
        error(&text),
        "f.ron:4:21: invalid rule: `max_kernel_terms` must be at least 1 (an op of one term, such as a reduction, must fit), found 0"
    );
}

// ---------------------------------------------------------------- roles the lowering can generate

/// Concat may join kernels (a range select) or run alone (a copy); the views join as views.
#[test]
fn concat_joins_as_a_range_select_and_the_views_as_views() {
    let ops = Catalogue::defaults();
    for op in ["reshape", "transpose", "slice", "broadcast_to"] {
        let rules = load(&format!(
            "Fusion({KINDS}, ops: {{\"{op}\": Join}}, max_kernel_args: 8)"
        ))
        .unwrap();
        let def = ops.get(op).unwrap();
        assert_eq!(rules.role(def), Role::Join, "{op}");
        assert_eq!(rules.role(def).is_view(def), op != "broadcast_to", "{op}");
        assert!(!rules.role(def).is_select(def), "{op}");
    }
    let concat = ops.get("concat").unwrap();
    for (name, role) in [("Join", Role::Join), ("Alone", Role::Alone)] {
        let rules = load(&format!(
            "Fusion({KINDS}, ops: {{\"concat\": {name}}}, max_kernel_args: 8)"
        ))
        .unwrap();
        assert_eq!(rules.role(concat), role);
        assert_eq!(rules.role(concat).is_select(concat), role == Role::Join);
        assert!(!rules.role(concat).is_view(concat));
    }
    // `End` is refused at its value: `ops: {"concat": ` puts the role at column 17.
    let text = format!("Fusion({KINDS},\nops: {{\"concat\": End}}, max_kernel_args: 8)");
    assert_eq!(
        error(&text),
        format!("f.ron:2:17: op `concat`: invalid rule: {LAYOUT_END}")
    );
}

#[test]
fn no_layout_op_may_end_a_kernel() {
    for op in ["reshape", "broadcast_to"] {
        let text = format!("Fusion({KINDS},\nops: {{\"{op}\": End}}, max_kernel_args: 8)");
        let column = op.len() + 11;
        assert_eq!(
            error(&text),
            format!("f.ron:2:{column}: op `{op}`: invalid rule: {LAYOUT_END}"),
            "{op}"
        );
    }
    // The same through the kind: `Layout: End` at line 2, column 27.
    let text = "Fusion(kinds: {Pointwise: Join,\n  Reduction: End, Layout: End, Opaque: Never},\n  max_kernel_args: 8)";
    assert_eq!(
        error(text),
        format!("f.ron:2:27: invalid rule: {LAYOUT_END}")
    );
}

#[test]
fn broadcast_to_may_join_or_run_alone() {
    let ops = Catalogue::defaults();
    let broadcast = ops.get("broadcast_to").unwrap();
    for (role, name) in [(Role::Join, "Join"), (Role::Alone, "Alone")] {
        let rules = load(&format!(
            "Fusion({KINDS}, ops: {{\"broadcast_to\": {name}}}, max_kernel_args: 8)"
        ))
        .unwrap();
        assert_eq!(rules.role(broadcast), role);
        assert_eq!(rules.role(ops.get("transpose").unwrap()), Role::Alone);
    }
}

/// `Layout: Join` makes every layout op `Join`, concat included (a range select), unless
/// `ops` gives concat `Alone`.
#[test]
fn a_fusing_layout_kind_joins_concat_unless_overridden() {
    let kinds =
        "Fusion(\n  kinds: {Pointwise: Join, Layout: Join, Reduction: End, Opaque: Never},\n";
    let ops = Catalogue::defaults();
    let rules = load(&format!("{kinds}  max_kernel_args: 8)")).unwrap();
    assert_eq!(rules.role(ops.get("concat").unwrap()), Role::Join);
    let text = format!("{kinds}  ops: {{\"concat\": Alone}},\n  max_kernel_args: 8)");
    let rules = load(&text).unwrap();
    assert_eq!(rules.role(ops.get("broadcast_to").unwrap()), Role::Join);
    assert_eq!(rules.role(ops.get("transpose").unwrap()), Role::Join);
    assert_eq!(rules.role(ops.get("concat").unwrap()), Role::Alone);
}

/// A gather reads at run-time indices, which no view expresses: under `Layout: Join` it leads
/// its kernel (`Role::leads`: consumers may join it, it joins no producer), a scatter runs
/// `Alone`, and giving a scatter `Join` by name is an error at that entry.
#[test]
fn gathers_lead_their_kernels_and_scatters_run_alone() {
    let kinds =
        "Fusion(\n  kinds: {Pointwise: Join, Layout: Join, Reduction: End, Opaque: Never},\n";
    let ops = Catalogue::defaults();
    let rules = load(&format!("{kinds}  max_kernel_args: 8)")).unwrap();
    for op in ["gather", "gather_elements"] {
        let def = ops.get(op).unwrap();
        assert_eq!(rules.role(def), Role::Join, "{op}");
        assert!(rules.role(def).leads(def), "{op}");
        assert!(!rules.role(def).is_view(def), "{op}");
    }
    let scatter = ops.get("scatter_add").unwrap();
    assert_eq!(rules.role(scatter), Role::Alone);
    assert!(!Role::Join.leads(scatter));
    let message = error(&format!(
        "{kinds}  ops: {{\"scatter_add\": Join}},\n  max_kernel_args: 8)"
    ));
    assert!(
        message.contains("3:") && message.contains("`scatter_add`"),
        "{message}"
    );
    let alone = load(&format!(
        "{kinds}  ops: {{\"gather\": Alone}},\n  max_kernel_args: 8)"
    ))
    .unwrap();
    assert_eq!(alone.role(ops.get("gather").unwrap()), Role::Alone);
}

/// User-defined layout ops are judged by their builtin, not their name: a `flip` that is a
/// `transpose` joins as a view, a `stack` that is a `concat` as a range select. An op defined
/// after the rules were checked gets its kind's role.
#[test]
fn user_layout_ops_are_judged_by_their_builtin() {
    let mut ops = Catalogue::defaults();
    ops.load_str(
        r#"[
            Op(name: "flip", kind: Layout, builtin: "transpose", operands: ["x"],
               dtype: SameAs("x"), attrs: [Attr(name: "perm", ty: Ints, optional: true)]),
            Op(name: "stack", kind: Layout, builtin: "concat", operands: ["xs"], variadic: true,
               dtype: Promote(["xs"]), attrs: [Attr(name: "axis", ty: Int, optional: true)]),
        ]"#,
        "ops.ron",
    )
    .unwrap();
    let rules = FusionRules::load_str(
        &format!("Fusion({KINDS}, ops: {{\"flip\": Join, \"stack\": Join}}, max_kernel_args: 8)"),
        "f.ron",
        &ops,
    )
    .unwrap();
    assert_eq!(rules.role(ops.get("flip").unwrap()), Role::Join);
    assert!(Role::Join.is_view(ops.get("flip").unwrap()));
    assert_eq!(rules.role(ops.get("stack").unwrap()), Role::Join);
    assert!(Role::Join.is_select(ops.get("stack").unwrap()));
    // Rules checked against the default catalogue: `stack` and `flip`, defined afterwards,
    // get `Join` from the layout kind.
    let rules = load(
        "Fusion(kinds: {Pointwise: Join, Layout: Join, Reduction: End, Opaque: Never},
            ops: {\"concat\": Alone},
            max_kernel_args: 8)",
    )
    .unwrap();
    assert_eq!(rules.role(ops.get("stack").unwrap()), Role::Join);
    assert_eq!(rules.role(ops.get("flip").unwrap()), Role::Join);
}

/// The checks that predate the lowering's still hold: an opaque op is `Never`, and only it.
#[test]
fn kind_checks_still_hold() {
    let text = format!("Fusion({KINDS},\nops: {{\"exp\": Never}}, max_kernel_args: 8)");
    let shown = error(&text);
    assert!(
        shown.starts_with("f.ron:2:14: op `exp`: invalid rule: `Never` marks a library call"),
        "{shown}"
    );
}
