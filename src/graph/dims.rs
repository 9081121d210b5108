//! Symbolic dimensions: the named sizes (`batch`, `seq`) a model declares for its inputs, and
//! how they are bound to numbers.
//!
//! A fusebox graph has static shapes; a model with dynamic axes is specialized to one size of
//! each named dimension when it is imported. The sizes come from the arrays a run is given
//! ([`Declared::sizes_from`]), or, where nothing is given (`optimize`, `bench` on random
//! values), from hints (`--dim batch=32`), else [`DEFAULT_SIZE`]. Specializing is cheap because
//! the emitted kernels take every size as an argument: the source of a kernel, and so the key
//! it is cached under, depends on dtypes, ranks and the fusion chosen, not on the sizes, so a
//! second size reuses the kernels compiled for the first.

use crate::error::{Error, ErrorKind, Result};
use crate::tensor::Tensor;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A size for each named dimension.
pub type DimSizes = BTreeMap<String, usize>;

/// What a model is specialized to when it is imported: a size for each named dimension, and
/// the value of each integer input that the model uses where fusebox needs a constant (a
/// Reshape's target shape, a reduction's axes, a TopK's `k`, given as run-time inputs). A run
/// whose arrays differ in either is a different specialization, compiled on its own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Specialization {
    /// Sizes by name; given to an import, hints for the names `shapes` does not show.
    pub sizes: DimSizes,
    /// Given to an import: the shapes of the arrays a run gives, by input name, which size the
    /// named dimensions they show ([`Declared::sizes_from`]).
    pub shapes: BTreeMap<String, Vec<usize>>,
    /// By input name. Given to an import, the values it may use; in what an import returns,
    /// the ones it used.
    pub values: BTreeMap<String, Tensor>,
}

impl Specialization {
    /// Sizes alone.
    pub fn sized(sizes: &DimSizes) -> Specialization {
        Specialization {
            sizes: sizes.clone(),
            ..Specialization::default()
        }
    }
}

/// The size a named dimension is imported at when neither a value nor a hint gives one: 1,
/// the size every model accepts (a sequence of 1 fits any position table; a batch of 1 is
/// what inference serves one request with).
pub const DEFAULT_SIZE: usize = 1;

/// One axis of a declared input: a number, or a name bound at import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    Named(String),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Named(name) => f.write_str(name),
        }
    }
}

/// An input of a model as it declares it, before any dimension is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredInput {
    pub name: String,
    pub dims: Vec<Dim>,
}

/// What a model declares about its inputs' dimensions, and the sizes its graph was imported
/// at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Declared {
    /// The inputs that are not stored values, in the model's order.
    pub inputs: Vec<DeclaredInput>,
    /// The size each named dimension has in the imported graph.
    pub sizes: DimSizes,
    /// The names whose size is [`DEFAULT_SIZE`] because nothing gave one.
    pub defaulted: BTreeSet<String>,
}

impl Declared {
    /// Every named dimension, each once, in the order the inputs first use them.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for dim in self.inputs.iter().flat_map(|i| &i.dims) {
            if let Dim::Named(name) = dim
                && !names.contains(&name.as_str())
            {
                names.push(name);
            }
        }
        names
    }

    /// Whether any input has a named dimension.
    pub fn is_symbolic(&self) -> bool {
        !self.names().is_empty()
    }

    /// The size of every named dimension: `given` where it names one (refused if it names a
    /// dimension the model does not have), else [`DEFAULT_SIZE`], recorded as defaulted.
    pub fn bind(&mut self, given: &DimSizes) -> Result<()> {
        let names = self.names();
        if let Some(unknown) = given.keys().find(|k| !names.contains(&k.as_str())) {
            return Err(Error::input(if names.is_empty() {
                format!(
                    "--dim `{unknown}`: the model has no symbolic dimension (its shapes are static)"
                )
            } else {
                format!(
                    "--dim `{unknown}`: the model has no dimension of that name; its dimensions: {}{}",
                    names.join(", "),
                    crate::error::hint(unknown, names.iter().copied())
                )
            }));
        }
        let mut sizes = DimSizes::new();
        let mut defaulted = BTreeSet::new();
        for name in names {
            let size = given.get(name).copied().unwrap_or_else(|| {
                defaulted.insert(name.to_string());
                DEFAULT_SIZE
            });
            sizes.insert(name.to_string(), size);
        }
        self.sizes = sizes;
        self.defaulted = defaulted;
        Ok(())
    }

    /// The size each named dimension has in the arrays of a run (`shape_of` gives an input's
    /// array shape, `None` for an input not given), over `hints` for the names no given array
    /// shows. An array whose rank, fixed sizes or named sizes disagree with the declaration
    /// (or with another array) is refused at its input.
    pub fn sizes_from<'a>(
        &self,
        shape_of: impl Fn(&str) -> Option<&'a [usize]>,
        hints: &DimSizes,
    ) -> Result<DimSizes> {
        let mut sizes = DimSizes::new();
        let mut seen_at: BTreeMap<&str, &str> = BTreeMap::new();
        for input in &self.inputs {
            let Some(shape) = shape_of(&input.name) else {
                continue;
            };
            let at = |message: String| Error::at_node(&input.name, ErrorKind::Input(message));
            let declared = || {
                let dims: Vec<String> = input.dims.iter().map(Dim::to_string).collect();
                format!("[{}]", dims.join(", "))
            };
            if shape.len() != input.dims.len() {
                return Err(at(format!(
                    "the value given has shape {shape:?} (rank {}), the model declares {} (rank {})",
                    shape.len(),
                    declared(),
                    input.dims.len()
                )));
            }
            for (axis, (dim, &size)) in input.dims.iter().zip(shape).enumerate() {
                match dim {
                    Dim::Fixed(n) if *n != size => {
                        return Err(at(format!(
                            "the value given has shape {shape:?}: axis {axis} is {size}, the model declares {} there",
                            declared()
                        )));
                    }
                    Dim::Fixed(_) => {}
                    Dim::Named(name) => match sizes.get(name) {
                        Some(&bound) if bound != size => {
                            return Err(at(format!(
                                "the value given has shape {shape:?}: dimension `{name}` (axis {axis}) is {size} here but {bound} in input `{}`",
                                seen_at[name.as_str()]
                            )));
                        }
                        Some(_) => {}
                        None => {
                            sizes.insert(name.clone(), size);
                            seen_at.insert(name, &input.name);
                        }
                    },
                }
            }
        }
        for (name, &size) in hints {
            if let Some(&bound) = sizes.get(name)
                && bound != size
            {
                return Err(Error::input(format!(
                    "--dim {name}={size}, but the value given for input `{}` makes it {bound}",
                    seen_at[name.as_str()]
                )));
            }
            sizes.insert(name.clone(), size);
        }
        Ok(sizes)
    }

    /// The sizes in words, each with where it came from: `batch=32 (--dim), seq=1 (default)`.
    pub fn describe(&self) -> String {
        self.sizes
            .iter()
            .map(|(name, size)| {
                if self.defaulted.contains(name) {
                    format!("{name}={size} (default)")
                } else {
                    format!("{name}={size}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parses `NAME=SIZE` specs (`--dim batch=32`), each name once.
pub fn parse_specs(specs: &[String]) -> Result<DimSizes> {
    let mut sizes = DimSizes::new();
    for spec in specs {
        let (name, size) = spec
            .split_once('=')
            .filter(|(name, _)| !name.is_empty())
            .ok_or_else(|| Error::input(format!("--dim `{spec}` must be NAME=SIZE")))?;
        let size: usize = size.parse().map_err(|_| {
            Error::input(format!(
                "--dim `{spec}`: the size must be a whole number, not `{size}`"
            ))
        })?;
        if sizes.insert(name.to_string(), size).is_some() {
            return Err(Error::input(format!(
                "--dim `{name}` is given more than once"
            )));
        }
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared() -> Declared {
        Declared {
            inputs: vec![
                DeclaredInput {
                    name: "ids".into(),
                    dims: vec![Dim::Named("batch".into()), Dim::Named("seq".into())],
                },
                DeclaredInput {
                    name: "mask".into(),
                    dims: vec![Dim::Named("batch".into()), Dim::Fixed(4)],
                },
            ],
            ..Declared::default()
        }
    }

    #[test]
    fn arrays_bind_each_name_once_and_hints_fill_the_rest() {
        let d = declared();
        let ids = [3usize, 7];
        let shapes = |name: &str| (name == "ids").then_some(&ids[..]);
        let sizes = d.sizes_from(shapes, &DimSizes::new()).unwrap();
        assert_eq!(
            sizes,
            DimSizes::from([("batch".into(), 3), ("seq".into(), 7)])
        );
        let mask = [3usize, 4];
        let both = |name: &str| match name {
            "ids" => Some(&ids[..]),
            _ => Some(&mask[..]),
        };
        assert_eq!(d.sizes_from(both, &DimSizes::new()).unwrap(), sizes);
        let none = |_: &str| None;
        let hinted = d
            .sizes_from(none, &DimSizes::from([("seq".into(), 5)]))
            .unwrap();
        assert_eq!(hinted, DimSizes::from([("seq".into(), 5)]));
    }

    #[test]
    fn disagreeing_arrays_are_refused_at_their_input() {
        let d = declared();
        let ids = [3usize, 7];
        let mask = [2usize, 4];
        let shapes = |name: &str| match name {
            "ids" => Some(&ids[..]),
            _ => Some(&mask[..]),
        };
        let e = d.sizes_from(shapes, &DimSizes::new()).unwrap_err();
        assert_eq!(e.site.node.as_deref(), Some("mask"));
        assert!(
            e.to_string()
                .contains("dimension `batch` (axis 0) is 2 here but 3 in input `ids`"),
            "{e}"
        );
        let wrong_fixed = [3usize, 5];
        let fixed = |name: &str| (name == "mask").then_some(&wrong_fixed[..]);
        let e = d.sizes_from(fixed, &DimSizes::new()).unwrap_err();
        assert!(
            e.to_string()
                .contains("axis 1 is 5, the model declares [batch, 4] there"),
            "{e}"
        );
        let flat = [21usize];
        let rank = |name: &str| (name == "ids").then_some(&flat[..]);
        let e = d.sizes_from(rank, &DimSizes::new()).unwrap_err();
        assert!(e.to_string().contains("(rank 1)"), "{e}");
        let e = d
            .sizes_from(
                |name: &str| (name == "ids").then_some(&ids[..]),
                &DimSizes::from([("seq".into(), 8)]),
            )
            .unwrap_err();
        assert!(e.to_string().contains("--dim seq=8"), "{e}");
    }

    #[test]
    fn binding_defaults_the_names_not_given_and_refuses_unknown_ones() {
        let mut d = declared();
        d.bind(&DimSizes::from([("batch".into(), 32)])).unwrap();
        assert_eq!(
            d.sizes,
            DimSizes::from([("batch".into(), 32), ("seq".into(), DEFAULT_SIZE)])
        );
        assert_eq!(d.describe(), "batch=32, seq=1 (default)");
        let e = d.bind(&DimSizes::from([("bach".into(), 2)])).unwrap_err();
        assert!(e.to_string().contains("its dimensions: batch, seq"), "{e}");
    }

    #[test]
    fn specs_parse_once_per_name() {
        let ok = parse_specs(&["batch=4".into(), "seq=0".into()]).unwrap();
        assert_eq!(ok, DimSizes::from([("batch".into(), 4), ("seq".into(), 0)]));
        for bad in [["batch".to_string()], ["=3".into()], ["batch=-1".into()]] {
            assert!(parse_specs(&bad).is_err(), "{bad:?}");
        }
        assert!(parse_specs(&["a=1".into(), "a=2".into()]).is_err());
    }
}
