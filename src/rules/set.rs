//! A rule directory: the embedded defaults with a user's files laid over them.
//!
//! The layout is `ops.ron`, `amp.ron`, `fusion.ron`, `cost.ron`, `gradients.ron` and
//! `rewrites/*.ron`; a
//! directory may hold any subset. Ops from the user's `ops.ron` are added to the defaults (an
//! op of the same name replaces the default one).

use super::Catalogue;
use super::aten::AtenTable;
use super::ron_file;
use super::{AmpRules, CostModel, FusionRules, GradientRules, MapTable};
use crate::error::{Error, ErrorKind, Result, Site};
use crate::rewrite::Rule;
use crate::rewrite::soundness::{CheckOptions, Verdict, check_rules};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// An entry of a rule directory that fusebox would not read.
fn misplaced(path: &Path, rule: &str) -> Error {
    Error::new(
        Site::whole_file(&path.display().to_string()),
        ErrorKind::Rule(format!("not read as a rule file: {rule}")),
    )
}

/// The rule files fusebox reads besides `ops.ron`. Their schemas belong to the stages that
/// consume them (AMP, fusion, cost model, rewriting); until a stage reads a file, loading checks
/// its RON syntax and keeps its text.
pub const OTHER_RULE_FILES: [&str; 6] = [
    "amp.ron",
    "fusion.ron",
    "cost.ron",
    "gradients.ron",
    "onnx.ron",
    "aten.ron",
];

/// Everything loaded from rule files.
#[derive(Debug, Clone)]
pub struct RuleSet {
    pub ops: Catalogue,
    /// Mixed-precision policies: the user's `amp.ron` replaces the default as a whole, so
    /// its policies are exactly the ones the user wrote.
    pub amp: AmpRules,
    /// What may share a kernel: the user's `fusion.ron` replaces the default as a whole.
    pub fusion: FusionRules,
    /// Hardware profiles: a user's `cost.ron` adds profiles or replaces those of the same name.
    pub cost: CostModel,
    /// Gradient templates of built-in ops: the user's `gradients.ron` replaces the default as
    /// a whole.
    pub gradients: GradientRules,
    /// How ONNX op types become catalogue ops (`fusebox import`, `.onnx` models): the user's
    /// `onnx.ron` replaces the default as a whole.
    pub onnx: MapTable,
    /// How ATen ops become ONNX nodes (the `torch.compile` backend): the user's `aten.ron`
    /// replaces the default as a whole, and is checked against the final ONNX table.
    pub aten: AtenTable,
    /// Rewrite rules: the embedded `rewrites/*.ron` with the user's `rewrites/NAME.ron` laid
    /// over them (a file replaces the default file of the same name; others are added).
    pub rewrites: Vec<crate::rewrite::Rule>,
    /// What loading left out and why, for the user to see (the CLI prints these on stderr):
    /// default rewrite rules that name an op the directory redefined and failed their
    /// re-verification under the new meaning.
    pub warnings: Vec<String>,
}

impl RuleSet {
    /// The rules embedded in the binary.
    pub fn defaults() -> RuleSet {
        let ops = Catalogue::defaults();
        RuleSet {
            fusion: FusionRules::load_str(super::fusion::DEFAULT_FUSION, "rules/fusion.ron", &ops)
                .expect("the embedded rules/fusion.ron is checked by tests"),
            cost: CostModel::defaults(),
            amp: AmpRules::load_str(super::amp::DEFAULT_AMP, "rules/amp.ron", &ops)
                .expect("the embedded rules/amp.ron is checked by tests"),
            rewrites: crate::rewrite::default_rules(&ops),
            gradients: GradientRules::defaults(&ops),
            aten: AtenTable::defaults(&MapTable::defaults(&ops)),
            onnx: MapTable::defaults(&ops),
            ops,
            warnings: Vec::new(),
        }
    }

    /// The defaults with the files of `dir` laid over them.
    pub fn load_dir(dir: &Path) -> Result<RuleSet> {
        let mut rules = RuleSet::defaults();
        // The catalogue the default rewrites were proven for, to tell which ops the directory
        // redefines (an `Arc` per op: cloning copies no definitions).
        let default_ops = rules.ops.clone();
        let dir_error = |message: String| {
            Error::new(
                Site::whole_file(&dir.display().to_string()),
                ErrorKind::Io {
                    path: dir.display().to_string(),
                    message,
                },
            )
        };
        if !dir.is_dir() {
            return Err(dir_error("not a directory".into()));
        }
        let mut files = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|e| dir_error(e.to_string()))?;
        for entry in entries {
            let path = entry.map_err(|e| dir_error(e.to_string()))?.path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if name == "rewrites" {
                // A rule author who puts rules where fusebox does not read them must hear so:
                // a `rewrites` that is not a directory, or an entry in it that is not a
                // `.ron` file, would otherwise be skipped without a word.
                if !path.is_dir() {
                    return Err(misplaced(
                        &path,
                        "`rewrites` must be a directory of .ron files",
                    ));
                }
                let inner = std::fs::read_dir(&path).map_err(|e| dir_error(e.to_string()))?;
                for rewrite in inner {
                    let rewrite = rewrite.map_err(|e| dir_error(e.to_string()))?.path();
                    // Any other kind of file named `*.ron` (a FIFO, a device) is the
                    // reader's to refuse, as what it is.
                    if rewrite.is_dir() || rewrite.extension().is_none_or(|e| e != "ron") {
                        return Err(misplaced(
                            &rewrite,
                            "rewrites/ holds only rule files named *.ron",
                        ));
                    }
                    let key = format!(
                        "rewrites/{}",
                        rewrite.file_name().unwrap_or_default().to_string_lossy()
                    );
                    files.push((key, rewrite));
                }
            } else if path.extension().is_some_and(|e| e == "ron") {
                if name != "ops.ron" && !OTHER_RULE_FILES.contains(&name.as_str()) {
                    let expected = ["ops.ron"].into_iter().chain(OTHER_RULE_FILES);
                    return Err(Error::new(
                        Site::whole_file(&path.display().to_string()),
                        ErrorKind::Rule(format!(
                            "unknown rule file `{name}`{}; a rule directory holds ops.ron, amp.ron, fusion.ron, cost.ron, gradients.ron, onnx.ron, aten.ron and rewrites/*.ron",
                            crate::error::hint(&name, expected)
                        )),
                    ));
                }
                files.push((name, path));
            }
        }
        files.sort();
        // fusion.ron names ops, so it is checked after ops.ron, which sorts after it.
        let mut fusion_file = None;
        let mut amp_file = None;
        let mut gradients_file = None;
        let mut onnx_file = None;
        let mut aten_file = None;
        let mut user_rewrites = Vec::new();
        for (key, path) in files {
            let text = ron_file::read_file(&path, crate::file_limits::FileKind::Rules)?;
            let shown = path.display().to_string();
            if key == "ops.ron" {
                rules.ops.load_str(&text, &shown)?;
            } else if key == "amp.ron" {
                amp_file = Some((text, shown));
            } else if key == "gradients.ron" {
                gradients_file = Some((text, shown));
            } else if key == "onnx.ron" {
                onnx_file = Some((text, shown));
            } else if key == "aten.ron" {
                aten_file = Some((text, shown));
            } else if let Some(name) = key.strip_prefix("rewrites/") {
                user_rewrites.push((name.to_string(), text, shown));
            } else {
                ron_file::parse::<ron::Value>(&text, &shown)?;
                if key == "cost.ron" {
                    rules.cost.load_str(&text, &shown)?;
                } else if key == "fusion.ron" {
                    fusion_file = Some((text, shown));
                }
            }
        }
        // amp.ron names ops too, and sorts before ops.ron.
        if let Some((text, shown)) = amp_file {
            rules.amp = AmpRules::load_str(&text, &shown, &rules.ops)?;
        }
        // So does gradients.ron, and a redefined op changes what its template must compute:
        // the user's file is checked against the final catalogue (`check-rules` differentiates
        // every template numerically).
        if let Some((text, shown)) = gradients_file {
            rules.gradients = GradientRules::load_str(&text, &shown, &rules.ops)?;
        }
        // And onnx.ron's templates name ops and their attributes.
        if let Some((text, shown)) = onnx_file {
            rules.onnx = MapTable::load_str(&text, &shown, &rules.ops)?;
        }
        // aten.ron's templates name ONNX ops of the final ONNX table.
        match aten_file {
            Some((text, shown)) => rules.aten = AtenTable::load_str(&text, &shown, &rules.onnx)?,
            None => rules.aten = AtenTable::defaults(&rules.onnx),
        }
        if let Some((text, shown)) = fusion_file {
            rules.fusion = FusionRules::load_str(&text, &shown, &rules.ops)?;
        }
        // Rewrite rules name ops, so they are checked against the final catalogue.
        rules.rewrites = crate::rewrite::load_rule_set(&rules.ops, &user_rewrites)?;
        rules.reverify_default_rewrites(&default_ops);
        Ok(rules)
    }

    /// The default rewrite rules were proven for the default ops. A directory may redefine an
    /// op (`add` as `a - b`), and a default rule that names it would then rewrite by the old
    /// meaning and silently change results. Each such rule is checked again by the value-level
    /// soundness checker (what `check-rules` runs) against the catalogue as loaded; a rule that
    /// is not shown sound in every direction is dropped, with a warning saying why. Rules from
    /// the user's own files are theirs to check (`fusebox check-rules`).
    fn reverify_default_rewrites(&mut self, defaults: &Catalogue) {
        let redefined: BTreeSet<&str> = self
            .ops
            .ops()
            .filter(|op| defaults.get(op.name()).is_some_and(|d| **d != ***op))
            .map(|op| op.name())
            .collect();
        if redefined.is_empty() {
            return;
        }
        let is_default = |rule: &Rule| rule.file.starts_with("rules/rewrites/");
        let affected: Vec<Rule> = self
            .rewrites
            .iter()
            .filter(|r| is_default(r) && r.ops().any(|op| redefined.contains(op)))
            .cloned()
            .collect();
        if affected.is_empty() {
            return;
        }
        let report = check_rules(&affected, &self.ops, &CheckOptions::default());
        let mut dropped: BTreeMap<(String, String), String> = BTreeMap::new();
        for check in &report.checks {
            let why = match &check.verdict {
                Verdict::Sound => continue,
                Verdict::Unsound(_) => "it is unsound under the redefinition".to_string(),
                Verdict::NotExercised(how) => format!("it could not be re-verified ({how})"),
            };
            dropped
                .entry((check.file.clone(), check.rule.clone()))
                .or_insert(why);
        }
        self.rewrites
            .retain(|r| !dropped.contains_key(&(r.file.clone(), r.name.clone())));
        let names: Vec<&str> = redefined.into_iter().collect();
        for ((file, rule), why) in dropped {
            self.warnings.push(format!(
                "default rewrite rule `{rule}` ({file}) is left out: it names an op this rule directory redefines ({}), and {why}",
                names.join(", ")
            ));
        }
    }

    /// `load_dir` when a directory is given, the defaults otherwise.
    pub fn load(dir: Option<&Path>) -> Result<RuleSet> {
        match dir {
            Some(d) => RuleSet::load_dir(d),
            None => Ok(RuleSet::defaults()),
        }
    }
}
