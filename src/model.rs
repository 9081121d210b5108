//! Whole models from Rust: load a RON graph file or an ONNX model with its stored values,
//! compile it for a backend, run it on named arrays and get named arrays back — the flow of
//! `fusebox run`, without reading the CLI's source.
//!
//! ```
//! use fusebox::model::{Backend, CompileOptions, Model};
//! use fusebox::rules::RuleSet;
//! use fusebox::tensor::Tensor;
//! use fusebox::dtype::DType;
//! use std::collections::BTreeMap;
//!
//! # fn main() -> fusebox::Result<()> {
//! let rules = RuleSet::defaults();
//! let (graph, _types) = fusebox::graph::file::parse(r#"Graph(
//!     name: "gelu_bias",
//!     inputs: [
//!         Input(name: "x", dtype: "f32", shape: [2, 3]),
//!         Input(name: "bias", dtype: "f32", shape: [3]),
//!     ],
//!     nodes: [
//!         Node(name: "biased", op: "add", args: ["x", "bias"]),
//!         Node(name: "y", op: "gelu", args: ["biased"]),
//!     ],
//!     outputs: ["y"],
//! )"#, "gelu_bias.ron", &rules.ops)?;
//! let model = Model::from_graph(graph, &rules)?;
//! for input in model.inputs() {
//!     println!("{}: {:?} {:?}", input.name, input.dtype, input.shape);
//! }
//!
//! let x = Tensor::from_values(DType::F32, &[2, 3], vec![-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]).unwrap();
//! let bias = Tensor::from_values(DType::F32, &[3], vec![0.5, 0.5, 0.5]).unwrap();
//! let inputs = BTreeMap::from([("x".to_string(), x), ("bias".to_string(), bias)]);
//!
//! let mut cpu = model.compile(Backend::Cpu, &CompileOptions::default())?;
//! let mut reference = model.compile(Backend::Reference, &CompileOptions::default())?;
//! let report = cpu.report().expect("a compiled backend is optimized");
//! println!("{} kernel(s) before, {} after", report.kernels_before, report.kernels_after);
//!
//! let got = cpu.run(&inputs)?;
//! let want = reference.run(&inputs)?;
//! for (g, w) in got["y"].values().iter().zip(want["y"].values()) {
//!     assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs());
//! }
//!
//! // An ONNX model brings its weights: only `input0` needs a value.
//! let mlp = Model::load(std::path::Path::new("book/examples/onnx/mlp.onnx"), &rules)?;
//! assert!(mlp.stored().contains_key("fc1.weight"));
//! let input0 = Tensor::from_values(DType::F32, &[8, 32], vec![0.25; 8 * 32]).unwrap();
//! let outputs = mlp
//!     .compile(Backend::Reference, &CompileOptions::default())?
//!     .run(&BTreeMap::from([("input0".to_string(), input0)]))?;
//! for (name, value) in &outputs {
//!     println!("{name}: {:?}", value.shape());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`Model::load`] reads a graph file or an `.onnx` model as every command does
//! ([`load_values`]), so an input with a stored value (a weight) needs no value at run time;
//! a value given to [`Compiled::run`] replaces the stored one.

use crate::backend::Executable;
use crate::backend::cache::CompileStats;
use crate::backend::cpu::compiler::{Compiler, CompilerConfig};
use crate::backend::cpu::runtime::CpuExecutable;
use crate::backend::cuda::runtime::{CudaExecutable, CudaOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::eval::Tensors;
use crate::graph::dims::{Declared, DimSizes, Specialization};
use crate::graph::{self, Graph, Input, TypeMap};
use crate::optimize::{Options, Report};
use crate::rules::RuleSet;
use crate::runner::Prepared;
use crate::tensor::Tensor;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod device;
mod host;

pub use device::DeviceArray;
pub use host::HostArray;

/// An error naming the first of `given` that is none of `declared` (with the nearest
/// declared name as a hint).
fn refuse_unknown<'a>(
    given: impl IntoIterator<Item = &'a String>,
    declared: impl Iterator<Item = &'a str> + Clone,
) -> Result<()> {
    match given
        .into_iter()
        .find(|name| !declared.clone().any(|d| d == name.as_str()))
    {
        Some(name) => Err(Error::input(format!(
            "the model has no input `{name}`{}",
            crate::error::hint(name, declared)
        ))),
        None => Ok(()),
    }
}

/// A graph with the stored values of its parameter inputs, and the rule set it was read
/// with: what [`Model::compile`] compiles.
#[derive(Debug, Clone)]
pub struct Model {
    graph: Graph,
    types: TypeMap,
    stored: Tensors,
    rules: RuleSet,
    /// The inputs' declared dimensions and the sizes the graph has them at (none named for a
    /// graph file or a model with static shapes).
    declared: Declared,
    /// The integer inputs the graph is specialized to the values of (see
    /// [`Specialization`]).
    specialized: BTreeMap<String, Tensor>,
    /// The ONNX model a specialized model (symbolic dimensions, or inputs used as constants)
    /// is imported from again for other arrays.
    source: Option<PathBuf>,
    /// The stored values that are weights, the same on every run ([`Loaded::storing`]): what
    /// they alone determine is computed once ([`crate::hoist`]).
    fixed: BTreeSet<String>,
}

/// Where [`Model::compile`] puts a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// C emitted and compiled with the system's C compiler (configured from the environment,
    /// as `fusebox run` is: `FUSEBOX_CC`, `FUSEBOX_CACHE_DIR`, …).
    Cpu,
    /// CUDA C compiled with NVRTC and run on a GPU; fails at compile time without one.
    Cuda,
    /// The reference evaluator: the graph run op by op, unfused — the oracle the others are
    /// tested against.
    Reference,
}

/// How [`Model::compile`] compiles; the default is what `fusebox run` does without flags.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// An AMP policy of the rule set (`"bf16"`, …): its casts are inserted before anything
    /// else, on every backend.
    pub amp: Option<String>,
    /// One kernel per op (the unfused baseline); refused for [`Backend::Reference`], which
    /// never fuses.
    pub no_fusion: bool,
    /// The GPU and how to run on it, for [`Backend::Cuda`] only.
    pub cuda: CudaOptions,
}

impl Model {
    /// Reads `path` with every stored value: an ONNX model when it ends in `.onnx` (its
    /// initializers), else a RON graph file whose inputs may name `.npy` files (see
    /// [`load_values`]).
    pub fn load(path: &Path, rules: &RuleSet) -> Result<Model> {
        Model::load_sized(path, rules, &DimSizes::new())
    }

    /// [`Model::load`] with sizes for an ONNX model's symbolic dimensions (`batch`, `seq`);
    /// the names not given get [`crate::graph::dims::DEFAULT_SIZE`]. [`Compiled::run`]
    /// re-specializes the model to the sizes of the arrays it is given, so these are the sizes
    /// it is first compiled (and priced) at.
    pub fn load_sized(path: &Path, rules: &RuleSet, sizes: &DimSizes) -> Result<Model> {
        Model::load_specialized(path, rules, &Specialization::sized(sizes))
    }

    /// [`Model::load_sized`] with values for integer inputs that the model uses where fusebox
    /// needs a constant (an ONNX Reshape whose target shape is a model input): the graph is
    /// specialized to them, and [`Compiled::run`] re-specializes it when a run gives others.
    pub fn load_specialized(path: &Path, rules: &RuleSet, given: &Specialization) -> Result<Model> {
        let loaded = load_values_specialized(path, rules, Stored::All, given)?;
        Ok(Model::from_loaded(loaded, rules))
    }

    /// A model of what [`load_values`] read: its stored values are the ones it was asked for
    /// (`fusebox run` leaves out those `--input` replaces).
    pub fn from_loaded(loaded: Loaded, rules: &RuleSet) -> Model {
        let fixed = loaded
            .storing
            .iter()
            .filter(|name| loaded.stored.contains_key(*name))
            .cloned()
            .collect();
        Model {
            fixed,
            graph: loaded.graph,
            types: loaded.types,
            stored: loaded.stored,
            rules: rules.clone(),
            declared: loaded.declared,
            specialized: loaded.specialized,
            source: loaded.source,
        }
    }

    /// A graph built in Rust (or parsed), without stored values; checked here against the
    /// rule set's catalogue, so that a malformed graph fails before anything compiles.
    pub fn from_graph(graph: Graph, rules: &RuleSet) -> Result<Model> {
        let types = graph::check::check(&graph, &rules.ops)?;
        Ok(Model {
            graph,
            types,
            stored: Tensors::new(),
            rules: rules.clone(),
            declared: Declared::default(),
            specialized: BTreeMap::new(),
            source: None,
            fixed: BTreeSet::new(),
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The dtype and shape of every value of the graph, by name.
    pub fn types(&self) -> &TypeMap {
        &self.types
    }

    /// The rules the model was read with (and compiles with).
    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    /// Every input of the graph, stored or not, with its declared dtype and shape.
    pub fn inputs(&self) -> &[Input] {
        &self.graph.inputs
    }

    /// The stored values (weights), by input name.
    pub fn stored(&self) -> &Tensors {
        &self.stored
    }

    /// The inputs' declared dimensions (named where an ONNX model leaves them open) and the
    /// size each name has in [`Model::graph`].
    pub fn declared(&self) -> &Declared {
        &self.declared
    }

    /// The integer inputs the graph is specialized to the values of, by name.
    pub fn specialized(&self) -> &BTreeMap<String, Tensor> {
        &self.specialized
    }

    /// What the model is specialized to now.
    pub fn specialization(&self) -> Specialization {
        Specialization {
            sizes: self.declared.sizes.clone(),
            values: self.specialized.clone(),
            ..Specialization::default()
        }
    }

    /// The specialization arrays (`given`, by input name) call for: the sizes their shapes
    /// give the symbolic dimensions, and their values of the inputs the graph is specialized
    /// to; what they do not show stays as it is. Refused, at the input, where an array's rank
    /// or a fixed size disagrees with the declaration, or two arrays give one name two sizes.
    pub fn specialization_for(&self, given: &BTreeMap<String, Tensor>) -> Result<Specialization> {
        let mut wanted = self.specialization();
        let shown = self
            .declared
            .sizes_from(|name| given.get(name).map(Tensor::shape), &DimSizes::new())?;
        wanted.sizes.extend(shown);
        for (name, value) in wanted.values.iter_mut() {
            if let Some(array) = given.get(name) {
                *value = array.clone();
            }
        }
        Ok(wanted)
    }

    /// The model specialized to `wanted`: imported again from its file (a model that is not
    /// specialized, or is already so, is itself).
    pub fn specialized_to(&self, wanted: &Specialization) -> Result<Model> {
        match &self.source {
            Some(path) if *wanted != self.specialization() => {
                Model::load_specialized(path, &self.rules, wanted)
            }
            _ => Ok(self.clone()),
        }
    }

    /// Compiles the model for `backend`. A compiled backend gets the optimized graph for its
    /// cost profile (`fusebox run`'s pipeline, [`crate::runner::prepare`]); the reference
    /// backend only inserts the AMP casts, since it runs the graph as written.
    ///
    /// A specialized model (symbolic dimensions, inputs used as constants) is compiled as it is
    /// specialized now; [`Compiled::run`] compiles it again for arrays of other sizes or
    /// values, and the kernels, whose source does not
    /// depend on sizes, come from the cache ([`Compiled::kernel_builds`] counts both).
    pub fn compile(&self, backend: Backend, options: &CompileOptions) -> Result<Compiled> {
        if backend != Backend::Cuda && options.cuda != CudaOptions::default() {
            return Err(Error::input("CUDA options apply to Backend::Cuda"));
        }
        if backend == Backend::Reference && options.no_fusion {
            return Err(Error::input(
                "no_fusion applies to compiled backends; the reference backend never fuses",
            ));
        }
        let compiler = (backend == Backend::Cpu).then(|| Compiler::new(CompilerConfig::from_env()));
        let (engine, builds) = self.engine(backend, options, compiler.as_ref())?;
        let resize = self.source.is_some().then(|| Resize {
            template: Model {
                stored: Tensors::new(),
                ..self.clone()
            },
            backend,
            options: options.clone(),
            compiler,
            kept: Vec::new(),
        });
        Ok(Compiled {
            current: Binding::new(
                self.specialization(),
                engine,
                self.graph.inputs.clone(),
                self.stored.clone(),
                &self.rules,
            )?,
            ops: self.rules.clone(),
            builds,
            resize,
            host_stored: BTreeMap::new(),
            device_stored: BTreeMap::new(),
        })
    }

    /// The model built for `backend` (the CPU's with `compiler`), and what building its
    /// kernels cost.
    fn engine(
        &self,
        backend: Backend,
        options: &CompileOptions,
        compiler: Option<&Compiler>,
    ) -> Result<(Engine, CompileStats)> {
        let pipeline = Options {
            amp: options.amp.clone(),
            fusion: !options.no_fusion,
            fixed: self.fixed.clone(),
            ..Options::default()
        };
        Ok(match (backend, compiler) {
            (Backend::Reference, _) => {
                let (graph, _) =
                    crate::optimize::with_amp(&self.graph, &self.rules, pipeline.amp.as_deref())?;
                (
                    Engine::Reference(graph.into_owned()),
                    CompileStats::default(),
                )
            }
            (Backend::Cpu, Some(compiler)) => {
                let prepared = self.prepare(pipeline, compiler)?;
                let builds = prepared.compile;
                (Engine::Cpu(Box::new(prepared)), builds)
            }
            (Backend::Cpu, None) => {
                return Err(Error::backend(
                    "the CPU backend was asked for without a compiler",
                ));
            }
            (Backend::Cuda, _) => {
                let prepared = self.prepare(pipeline, &options.cuda)?;
                let builds = prepared.compile.into();
                (Engine::Cuda(Box::new(prepared)), builds)
            }
        })
    }

    /// [`crate::runner::prepare`] for `target`, optimized for its cost profile.
    fn prepare<T: crate::backend::Target>(
        &self,
        options: Options,
        target: &T,
    ) -> Result<Prepared<T::Executable>> {
        let options = Options {
            profile: T::PROFILE.into(),
            ..options
        };
        crate::runner::prepare(&self.graph, &self.rules, &options, target)
    }
}

/// What a model was compiled into.
enum Engine {
    /// The graph the reference evaluator runs (with AMP casts, if asked for).
    Reference(Graph),
    // Boxed: a prepared program is large, and the reference variant small.
    Cpu(Box<Prepared<CpuExecutable>>),
    Cuda(Box<Prepared<CudaExecutable>>),
}

impl Engine {
    /// What computes the values the program reads but the stored values alone determine.
    fn hoist(&self) -> Option<&crate::hoist::Hoist> {
        match self {
            Engine::Reference(_) => None,
            Engine::Cpu(prepared) => prepared.hoist.as_ref(),
            Engine::Cuda(prepared) => prepared.hoist.as_ref(),
        }
    }
}

/// A model compiled at one specialization: sizes of its symbolic dimensions, values of the
/// inputs it uses as constants.
struct Binding {
    key: Specialization,
    engine: Engine,
    /// The graph's inputs at these sizes.
    inputs: Vec<Input>,
    stored: Tensors,
    /// The values the stored ones alone determine ([`crate::hoist`]), computed once; the
    /// program reads them as inputs.
    hoisted: Tensors,
}

impl Binding {
    fn new(
        key: Specialization,
        engine: Engine,
        inputs: Vec<Input>,
        stored: Tensors,
        rules: &RuleSet,
    ) -> Result<Binding> {
        let hoisted = match engine.hoist() {
            Some(hoist) => hoist.values(&rules.ops, &stored)?,
            None => Tensors::new(),
        };
        Ok(Binding {
            key,
            engine,
            inputs,
            stored,
            hoisted,
        })
    }

    /// Whether a run giving values for `given` replaces a stored value the hoisted values are
    /// made of (so they must be computed again for it).
    fn rehoists<'a>(&self, given: impl Iterator<Item = &'a str>) -> bool {
        self.engine.hoist().is_some_and(|h| h.depends_on(given))
    }
}

/// How a compiled specialized model compiles itself for other sizes or values.
struct Resize {
    /// The model (without its stored values, which each size imports again).
    template: Model,
    backend: Backend,
    options: CompileOptions,
    /// The CPU backend's compiler, kept so that the kernels of one size are in its memory
    /// for the next.
    compiler: Option<Compiler>,
    /// The other specializations compiled so far, the most recently used last (at most
    /// [`KEPT_SIZES`]).
    kept: Vec<Binding>,
}

/// How many sizes besides the present one a [`Compiled`] keeps compiled. Each keeps its own
/// copy of the stored values, so the number is small; a size dropped and met again is
/// optimized again and finds its kernels in the disk cache.
pub const KEPT_SIZES: usize = 3;

/// A model compiled for one backend, with its stored values: run it on named arrays.
pub struct Compiled {
    current: Binding,
    ops: RuleSet,
    /// What building kernels has cost, over every size compiled.
    builds: CompileStats,
    /// For a specialized model: how to compile it for other sizes or values.
    resize: Option<Resize>,
    /// The stored values in their storage format, made once for runs on host memory
    /// ([`Compiled::run_host`]) of a model that compiles for one size only.
    host_stored: BTreeMap<String, crate::runtime::buffer::Buffer>,
    /// The same on the GPU, for runs on device memory ([`Compiled::run_device_arrays`]).
    device_stored: BTreeMap<String, crate::backend::cuda::runtime::DeviceBuffer>,
}

impl Compiled {
    /// The optimization report of a compiled backend (kernels before and after, bytes, modeled
    /// cost, the rewrites that fired; see [`Report`]); `None` for [`Backend::Reference`],
    /// which runs the graph as written and so has nothing optimized to report.
    pub fn report(&self) -> Option<&Report> {
        match &self.current.engine {
            Engine::Reference(_) => None,
            Engine::Cpu(prepared) => Some(&prepared.report),
            Engine::Cuda(prepared) => Some(&prepared.report),
        }
    }

    /// The kernels and library calls a compiled backend runs per call (see
    /// [`crate::partition::Partition::count`]); `None` for [`Backend::Reference`].
    pub fn kernels(&self) -> Option<crate::partition::KernelCount> {
        match &self.current.engine {
            Engine::Reference(_) => None,
            Engine::Cpu(prepared) => Some(prepared.partition.count()),
            Engine::Cuda(prepared) => Some(prepared.partition.count()),
        }
    }

    /// The backend in words: the compiler or device for a compiled one.
    pub fn describe(&self) -> String {
        match &self.current.engine {
            Engine::Reference(_) => "reference".to_string(),
            Engine::Cpu(prepared) => prepared.executable.describe(),
            Engine::Cuda(prepared) => prepared.executable.describe(),
        }
    }

    /// What building kernels has cost so far, over every size compiled: kernel sources
    /// compiled, and found in the compiler's memory or on disk. Zero for the reference backend.
    pub fn kernel_builds(&self) -> CompileStats {
        self.builds
    }

    /// The sizes of the symbolic dimensions the last run (or the compilation) was at.
    pub fn sizes(&self) -> &DimSizes {
        &self.current.key.sizes
    }

    /// Runs on `inputs` by name and returns the outputs by name. An input given here replaces
    /// its stored value; every other input must have one, else the error names those
    /// missing, and a name the model has no input of is refused (a misspelt name would
    /// otherwise leave a weight silently in place). A given value must have the declared
    /// shape, and is converted to the declared dtype when it is of the same kind (an `f32`
    /// array for an `f16` input). For a specialized model the declared shape is the one the
    /// arrays bind: new sizes, or new values of the inputs it uses as constants, are compiled
    /// first.
    pub fn run(&mut self, inputs: &BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
        self.size_for(inputs)?;
        let given = self.given_values(inputs)?;
        let binding = &mut self.current;
        // The stored values (the weights, most of the bytes) are lent to the run, not copied:
        // the given values stand in for the ones they replace, which are put back after.
        let rehoist = binding.rehoists(given.keys().map(String::as_str));
        let mut values = std::mem::take(&mut binding.stored);
        let displaced: Vec<(String, Option<Tensor>)> = given
            .into_iter()
            .map(|(name, value)| (name.clone(), values.insert(name, value)))
            .collect();
        // The hoisted values join the run's inputs: the ones computed at compile time, or,
        // where a given value replaces a stored one they are made of, computed from it now.
        let hoisted = match binding.engine.hoist() {
            Some(hoist) if rehoist => hoist.values(&self.ops.ops, &values),
            _ => Ok(std::mem::take(&mut binding.hoisted)),
        };
        let hoisted = match hoisted {
            Ok(hoisted) => hoisted,
            Err(e) => {
                restore(&mut values, displaced);
                binding.stored = values;
                return Err(e);
            }
        };
        let hoisted_names: Vec<String> = hoisted.keys().cloned().collect();
        values.extend(hoisted);
        let outputs = match &mut binding.engine {
            Engine::Reference(graph) => crate::eval::evaluate(graph, &self.ops.ops, &values),
            Engine::Cpu(prepared) => prepared.executable.run_tensors(&values),
            Engine::Cuda(prepared) => prepared.executable.run_tensors(&values),
        };
        let mut hoisted = Tensors::new();
        for name in hoisted_names {
            if let Some(value) = values.remove(&name) {
                hoisted.insert(name, value);
            }
        }
        if !rehoist {
            binding.hoisted = hoisted;
        }
        restore(&mut values, displaced);
        binding.stored = values;
        Ok(outputs?.into_iter().collect())
    }

    /// Makes the binding for the sizes `inputs` have the current one: kept, or compiled.
    fn size_for(&mut self, inputs: &BTreeMap<String, Tensor>) -> Result<()> {
        let Some(resize) = &mut self.resize else {
            return Ok(());
        };
        let key = resize.template.specialization_for(inputs)?;
        if key == self.current.key {
            return Ok(());
        }
        let next = match resize.kept.iter().position(|b| b.key == key) {
            Some(k) => resize.kept.remove(k),
            None => {
                let model = resize.template.specialized_to(&key)?;
                let (engine, builds) =
                    model.engine(resize.backend, &resize.options, resize.compiler.as_ref())?;
                self.builds = self.builds.plus(&builds);
                Binding::new(key, engine, model.graph.inputs, model.stored, &self.ops)?
            }
        };
        resize.kept.push(std::mem::replace(&mut self.current, next));
        if resize.kept.len() > KEPT_SIZES {
            resize.kept.remove(0);
        }
        Ok(())
    }

    /// The given values, each checked against its declaration (and converted to its declared
    /// dtype); every input neither given nor stored is named in the error.
    fn given_values(&self, given: &BTreeMap<String, Tensor>) -> Result<Tensors> {
        let inputs = &self.current.inputs;
        refuse_unknown(given.keys(), inputs.iter().map(|i| i.name.as_str()))?;
        let mut values = Tensors::new();
        let mut missing = Vec::new();
        for input in inputs {
            let at = |message: String| Error::at_node(&input.name, ErrorKind::Input(message));
            let value = match (given.get(&input.name), self.current.stored.get(&input.name)) {
                (Some(value), _) => {
                    if value.shape() != input.shape.as_slice() {
                        return Err(at(format!(
                            "the value given holds shape {:?}, the graph declares {:?}",
                            value.shape(),
                            input.shape
                        )));
                    }
                    value
                        .clone()
                        .into_declared(input.dtype, "the value given", &input.name)
                        .map_err(|e| at(e.to_string()))?
                }
                (None, Some(_)) => continue,
                (None, None) => {
                    missing.push(input.name.as_str());
                    continue;
                }
            };
            values.insert(input.name.clone(), value);
        }
        if !missing.is_empty() {
            return Err(Error::input(format!(
                "no value for input(s) {}",
                missing.join(", ")
            )));
        }
        Ok(values)
    }
}

/// Puts back the stored values a run's given values stood in for (`displaced`, as
/// [`Compiled::run`] collected them), and removes the given ones that replaced nothing.
fn restore(values: &mut Tensors, displaced: Vec<(String, Option<Tensor>)>) {
    for (name, stored) in displaced {
        match stored {
            Some(stored) => values.insert(name, stored),
            None => values.remove(&name),
        };
    }
}

/// A graph, its types, and the stored value of each parameter input that has one.
pub struct Loaded {
    pub graph: Graph,
    pub types: TypeMap,
    pub stored: Tensors,
    /// Every input the model holds a weight for, whether or not this load read the value
    /// (see [`Stored`]): the inputs fixed for the model's runs. Empty where the stored values
    /// are not weights but values of one call (torch.compile's constants, rebuilt at each
    /// size), which nothing should be folded into.
    pub storing: BTreeSet<String>,
    /// For a RON graph file, the resolved path of each stored value's `.npy` (an ONNX model's
    /// weights have none: they live inside the model).
    pub files: BTreeMap<String, PathBuf>,
    /// An ONNX model's declared input dimensions and the sizes its symbolic ones were
    /// imported at (empty for a graph file).
    pub declared: Declared,
    /// The integer inputs an ONNX model's graph is specialized to the values of.
    pub specialized: BTreeMap<String, Tensor>,
    /// The ONNX model, where it is specialized (to import it again for other arrays).
    pub source: Option<PathBuf>,
}

/// Which stored values a command reads.
#[derive(Debug, Clone, Copy)]
pub enum Stored<'a> {
    /// Every one: `check` validates them, `grad` carries them to what it writes.
    All,
    /// All but these inputs', which the command is given other values for (`run --input`):
    /// a value that is replaced is not read, so a broken one there does not stop the run.
    Except(&'a BTreeSet<String>),
    /// None: the command feeds its own values (`bench` times random ones).
    None,
}

impl Stored<'_> {
    fn wants(&self, input: &str) -> bool {
        match self {
            Stored::All => true,
            Stored::Except(skip) => !skip.contains(input),
            Stored::None => false,
        }
    }
}

/// Reads `path` with every stored value (see [`load_values`]).
pub fn load(path: &Path, rules: &RuleSet) -> Result<Loaded> {
    load_values(path, rules, Stored::All)
}

/// Reads `path`: an ONNX model when it ends in `.onnx`, else a RON graph file whose inputs may
/// name `.npy` files (read relative to the graph file, and refused if they leave its
/// directory). Of those, only the ones `which` wants are read; each must hold the declared
/// shape and kind of value ([`Tensor::into_declared`]), and a problem with one is reported at
/// its `value` field.
pub fn load_values(path: &Path, rules: &RuleSet, which: Stored) -> Result<Loaded> {
    load_values_sized(path, rules, which, &DimSizes::new())
}

/// [`load_values`] with sizes for an ONNX model's symbolic dimensions (the others at
/// [`crate::graph::dims::DEFAULT_SIZE`]); sizes are refused for a graph file, whose shapes
/// are static.
pub fn load_values_sized(
    path: &Path,
    rules: &RuleSet,
    which: Stored,
    sizes: &DimSizes,
) -> Result<Loaded> {
    load_values_specialized(path, rules, which, &Specialization::sized(sizes))
}

/// [`load_values_sized`] with values for the integer inputs an ONNX model needs as constants
/// (see [`Specialization`]).
pub fn load_values_specialized(
    path: &Path,
    rules: &RuleSet,
    which: Stored,
    given: &Specialization,
) -> Result<Loaded> {
    let sizes = &given.sizes;
    if crate::onnx::is_onnx(path) {
        let imported = crate::onnx::import_specialized(path, &rules.ops, &rules.onnx, given)?;
        let specialized = imported.declared.is_symbolic() || !imported.specialized.is_empty();
        let source = specialized.then(|| path.to_path_buf());
        return Ok(Loaded {
            graph: imported.graph,
            types: imported.types,
            storing: imported.values.keys().cloned().collect(),
            stored: imported
                .values
                .into_iter()
                .filter(|(name, _)| which.wants(name))
                .collect(),
            files: BTreeMap::new(),
            declared: imported.declared,
            specialized: imported.specialized,
            source,
        });
    }
    if let Some(name) = sizes.keys().next() {
        return Err(Error::input(format!(
            "--dim `{name}`: {} is a graph file, whose shapes are static",
            path.display()
        )));
    }
    let (graph, types, files) = graph::file::load_with_values(path, &rules.ops)?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut stored = Tensors::new();
    let mut resolved = BTreeMap::new();
    for (name, value) in &files {
        if !which.wants(name) {
            continue;
        }
        let Some(declared) = graph.input(name) else {
            continue;
        };
        let file = &value.file;
        let at = |message: String| Error::new(value.site.clone(), ErrorKind::Input(message));
        let full = dir.join(file);
        let real = full
            .canonicalize()
            .map_err(|e| at(format!("stored value `{file}`: {e}")))?;
        let base = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let real_dir = base
            .canonicalize()
            .map_err(|e| at(format!("{}: {e}", base.display())))?;
        if !real.starts_with(&real_dir) {
            return Err(at(format!(
                "stored value `{file}` leaves the graph file's directory"
            )));
        }
        // Read where it was checked to be, named as the graph file writes it.
        let tensor = Tensor::read_npy_named(&real, &format!("`{file}`"))
            .map_err(|e| at(format!("stored value {e}")))?;
        if tensor.shape() != declared.shape.as_slice() {
            return Err(at(format!(
                "stored value `{file}` holds shape {:?}, the graph declares {:?}",
                tensor.shape(),
                declared.shape
            )));
        }
        let tensor = tensor
            .into_declared(declared.dtype, &format!("stored value `{file}`"), name)
            .map_err(|e| at(e.to_string()))?;
        stored.insert(name.clone(), tensor);
        resolved.insert(name.clone(), real);
    }
    Ok(Loaded {
        storing: files
            .keys()
            .filter(|name| graph.input(name).is_some())
            .cloned()
            .collect(),
        graph,
        types,
        stored,
        files: resolved,
        declared: Declared::default(),
        specialized: BTreeMap::new(),
        source: None,
    })
}
