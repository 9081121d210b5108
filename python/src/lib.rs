//! `fusebox._fusebox`: the Rust side of the Python package, a thin layer over
//! [`fusebox::model`] and [`fusebox::aten`]. The package's Python modules (`python/fusebox/`)
//! give it its user-facing shape; this module only moves values across: graphs in as paths,
//! text or JSON, reports out as JSON text, arrays as raw pointers to memory Python owns.
//!
//! Every fusebox error becomes a `fusebox.FuseboxError` carrying fusebox's message, with its
//! file, line and column or node.

use fusebox::backend::cuda::runtime::CuStream;
use fusebox::dtype::DType;
use fusebox::model::{Backend, CompileOptions, DeviceArray, HostArray};
use fusebox::rules::RuleSet;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

create_exception!(
    _fusebox,
    FuseboxError,
    PyException,
    "An error fusebox reported: a graph, rule file or model it refused (the message names \
     the file, line and column, or the node), or a run it could not do."
);

fn fail(e: fusebox::Error) -> PyErr {
    FuseboxError::new_err(e.to_string())
}

fn rules(dir: Option<&str>) -> PyResult<RuleSet> {
    match dir {
        Some(dir) => RuleSet::load_dir(Path::new(dir)).map_err(fail),
        None => Ok(RuleSet::defaults()),
    }
}

fn dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name)
        .ok_or_else(|| FuseboxError::new_err(format!("dtype `{name}` is not one fusebox has")))
}

/// A graph with its stored values and the rules it was read with.
#[pyclass(module = "fusebox._fusebox", frozen)]
struct Model {
    model: fusebox::model::Model,
}

#[pymethods]
impl Model {
    /// Reads a RON graph file (with the `.npy` values it names) or an `.onnx` model.
    #[staticmethod]
    #[pyo3(signature = (path, rules_dir=None))]
    fn load(path: &str, rules_dir: Option<&str>) -> PyResult<Model> {
        let rules = rules(rules_dir)?;
        let model = fusebox::model::Model::load(Path::new(path), &rules).map_err(fail)?;
        Ok(Model { model })
    }

    /// Parses a graph written in fusebox's RON graph format; `name` names it in errors.
    #[staticmethod]
    #[pyo3(signature = (text, name, rules_dir=None))]
    fn parse(text: &str, name: &str, rules_dir: Option<&str>) -> PyResult<Model> {
        let rules = rules(rules_dir)?;
        let (graph, _) = fusebox::graph::file::parse(text, name, &rules.ops).map_err(fail)?;
        let model = fusebox::model::Model::from_graph(graph, &rules).map_err(fail)?;
        Ok(Model { model })
    }

    /// Imports an ATen graph sent as JSON (see `fusebox::aten::fx`), with the bytes of its
    /// constants by name.
    #[staticmethod]
    #[pyo3(signature = (json, constants, rules_dir=None))]
    fn from_fx(
        json: &str,
        constants: BTreeMap<String, Vec<u8>>,
        rules_dir: Option<&str>,
    ) -> PyResult<Model> {
        let rules = rules(rules_dir)?;
        let graph = fusebox::aten::fx::parse(json, "fx graph").map_err(fail)?;
        let imported = fusebox::aten::import(&graph, &constants, &rules).map_err(fail)?;
        let loaded = fusebox::model::Loaded {
            graph: imported.graph,
            types: imported.types,
            // The constants are values at this call's sizes (a mask, positions), rebuilt for
            // every size Dynamo calls with, not weights: nothing is folded into them.
            storing: Default::default(),
            stored: imported.values.into_iter().collect(),
            files: BTreeMap::new(),
            declared: imported.declared,
            specialized: imported.specialized,
            source: None,
        };
        Ok(Model {
            model: fusebox::model::Model::from_loaded(loaded, &rules),
        })
    }

    /// The inputs: `(name, dtype, shape, stored)`, `stored` telling whether the model holds a
    /// value for it (a weight), so a run need not give one.
    fn inputs(&self) -> Vec<(String, String, Vec<usize>, bool)> {
        let stored = self.model.stored();
        self.model
            .inputs()
            .iter()
            .map(|i| {
                (
                    i.name.clone(),
                    i.dtype.name().to_string(),
                    i.shape.clone(),
                    stored.contains_key(&i.name),
                )
            })
            .collect()
    }

    /// The outputs: `(name, dtype, shape)`, in order.
    fn outputs(&self) -> PyResult<Vec<(String, String, Vec<usize>)>> {
        let types = self.model.types();
        self.model
            .graph()
            .outputs
            .iter()
            .map(|name| {
                let ty = types.get(name).ok_or_else(|| {
                    FuseboxError::new_err(format!("internal: output `{name}` has no type"))
                })?;
                Ok((name.clone(), ty.dtype.name().to_string(), ty.shape.clone()))
            })
            .collect()
    }

    /// Optimizes for a cost profile (`"cpu"` or `"cuda"`) without compiling: the report as
    /// JSON text (what `fusebox optimize --json` prints) and the `--explain` text.
    #[pyo3(signature = (profile="cpu", amp=None))]
    fn optimize(&self, profile: &str, amp: Option<String>) -> PyResult<(String, String)> {
        let options = fusebox::optimize::Options {
            profile: profile.to_string(),
            amp,
            ..Default::default()
        };
        let optimized =
            fusebox::optimize::optimize(self.model.graph(), self.model.rules(), &options)
                .map_err(fail)?;
        let report = serde_json::to_string(&optimized.report)
            .map_err(|e| FuseboxError::new_err(e.to_string()))?;
        Ok((report, fusebox::explain::explain(&optimized)))
    }

    /// Compiles for `"cpu"`, `"cuda"` or `"reference"`; `lt_epilogues` (CUDA only) runs the
    /// epilogues cuBLASLt can run in the GEMM.
    #[pyo3(signature = (backend="cpu", amp=None, no_fusion=false, lt_epilogues=false))]
    fn compile(
        &self,
        backend: &str,
        amp: Option<String>,
        no_fusion: bool,
        lt_epilogues: bool,
    ) -> PyResult<Compiled> {
        let backend = match backend {
            "cpu" => Backend::Cpu,
            "cuda" => Backend::Cuda,
            "reference" => Backend::Reference,
            other => {
                return Err(FuseboxError::new_err(format!(
                    "backend `{other}` is not one of cpu, cuda, reference"
                )));
            }
        };
        let options = CompileOptions {
            amp,
            no_fusion,
            cuda: fusebox::backend::cuda::runtime::CudaOptions {
                lt_epilogues,
                ..Default::default()
            },
        };
        let compiled = self.model.compile(backend, &options).map_err(fail)?;
        Ok(Compiled {
            compiled: Shared(Mutex::new(compiled)),
        })
    }
}

/// A model compiled for one backend.
#[pyclass(module = "fusebox._fusebox", frozen)]
struct Compiled {
    compiled: Shared,
}

/// A compiled model that any Python thread may use, one at a time.
struct Shared(Mutex<fusebox::model::Compiled>);

// SAFETY: the mutex lets one thread at a time use the compiled model. What it holds is not
// tied to the thread that built it: on the CPU, heap buffers, loaded libraries and function
// pointers, used only during a call; the reference backend holds a graph. The raw pointers
// that make it neither `Send` nor `Sync` point into memory it owns (packed GEMM operands). A
// CUDA model holds handles of the device's primary context, which every fusebox entry point
// makes current on the calling thread before a driver call (PyTorch's autograd runs a CUDA
// backward on a thread of its own, so that thread must be able to run the model too).
unsafe impl Send for Shared {}
// SAFETY: as above; every access goes through the mutex.
unsafe impl Sync for Shared {}

impl Compiled {
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, fusebox::model::Compiled>> {
        self.compiled
            .0
            .lock()
            .map_err(|_| FuseboxError::new_err("an earlier run of this model failed midway"))
    }
}

#[pymethods]
impl Compiled {
    /// The output names, in the order `run` writes them.
    fn output_names(&self) -> PyResult<Vec<String>> {
        Ok(self.lock()?.output_names())
    }

    /// The optimization report as JSON text; `None` for the reference backend.
    fn report(&self) -> PyResult<Option<String>> {
        self.lock()?
            .report()
            .map(|r| serde_json::to_string(r).map_err(|e| FuseboxError::new_err(e.to_string())))
            .transpose()
    }

    /// Kernels and library calls per run: `(kernels, library_calls)`; `None` for the
    /// reference backend.
    fn kernels(&self) -> PyResult<Option<(usize, usize)>> {
        Ok(self.lock()?.kernels().map(|k| (k.kernels, k.library_calls)))
    }

    /// The backend in words.
    fn describe(&self) -> PyResult<String> {
        Ok(self.lock()?.describe())
    }

    /// Kernel builds so far: `(compiled, found in memory, found on disk)`.
    fn kernel_builds(&self) -> PyResult<(usize, usize, usize)> {
        let b = self.lock()?.kernel_builds();
        Ok((b.compiled, b.memory_hits, b.disk_hits))
    }

    /// Runs on memory Python owns. `inputs`: `(name, dtype, shape, address)`; `outputs`:
    /// `(dtype, shape, address)` in `output_names` order. The Python layer (`fusebox.Compiled`)
    /// passes the addresses of C-contiguous NumPy arrays or PyTorch CPU tensors it holds for
    /// the whole call, and allocates the outputs; nothing else may call this with made-up
    /// addresses, as it cannot check them.
    #[pyo3(name = "_run_addresses")]
    fn run_addresses(&self, inputs: NamedArrays, outputs: Arrays) -> PyResult<()> {
        let (given, outputs) = arrays(inputs, outputs, |dtype, shape, address| HostArray {
            dtype,
            shape,
            data: address as *mut u8,
        })?;
        // SAFETY: the package's Python layer passes arrays it holds, of these dtypes and
        // shapes, C-contiguous, and freshly allocated outputs (the method's contract).
        let mut compiled = self.lock()?;
        unsafe { compiled.run_host(&given, &outputs) }.map_err(fail)
    }

    /// The ordinal of the GPU whose memory `_run_device` takes (a CUDA model compiled at
    /// fixed sizes); `None` otherwise.
    fn device_memory(&self) -> PyResult<Option<usize>> {
        Ok(self.lock()?.device_memory())
    }

    /// Queues a run of a CUDA model on `stream` (a `CUstream` as an integer, PyTorch's
    /// `torch.cuda.current_stream().cuda_stream`) over GPU memory Python owns, in place, and
    /// returns without waiting. `inputs`: `(name, dtype, shape, address)`; `outputs`:
    /// `(dtype, shape, address)` in `output_names` order. The Python layer
    /// (`fusebox.Compiled.run`) passes contiguous CUDA tensors on the model's device that it
    /// allocated or holds, on that device's current stream; nothing else may call this with
    /// made-up addresses or streams, as it cannot check them.
    #[pyo3(name = "_run_device")]
    fn run_device(&self, inputs: NamedArrays, outputs: Arrays, stream: usize) -> PyResult<()> {
        let (given, outputs) = arrays(inputs, outputs, |dtype, shape, address| DeviceArray {
            dtype,
            shape,
            address,
        })?;
        let mut compiled = self.lock()?;
        // SAFETY: the package's Python layer passes tensors it holds on the model's device,
        // of these dtypes and shapes, contiguous, freshly allocated outputs, and that device's
        // current stream (the method's contract).
        unsafe { compiled.run_device_arrays(&given, &outputs, stream as CuStream) }.map_err(fail)
    }
}

/// The arrays a run is given, as `(name, dtype, shape, address)` inputs and `(dtype, shape,
/// address)` outputs, made by `array` (host or device arrays).
type NamedArrays = Vec<(String, String, Vec<usize>, u64)>;
type Arrays = Vec<(String, Vec<usize>, u64)>;

fn arrays<A>(
    inputs: NamedArrays,
    outputs: Arrays,
    array: impl Fn(DType, Vec<usize>, u64) -> A,
) -> PyResult<(BTreeMap<String, A>, Vec<A>)> {
    let mut given = BTreeMap::new();
    for (name, dt, shape, address) in inputs {
        given.insert(name, array(dtype(&dt)?, shape, address));
    }
    let outputs = outputs
        .into_iter()
        .map(|(dt, shape, address)| Ok(array(dtype(&dt)?, shape, address)))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((given, outputs))
}

/// Which nodes of an ATen graph (JSON) fusebox takes: by node name, `None` or the reason why
/// not.
#[pyfunction]
#[pyo3(signature = (json, rules_dir=None))]
fn aten_support(json: &str, rules_dir: Option<&str>) -> PyResult<BTreeMap<String, Option<String>>> {
    let rules = rules(rules_dir)?;
    let graph = fusebox::aten::fx::parse(json, "fx graph").map_err(fail)?;
    Ok(fusebox::aten::supported(&graph, &rules))
}

/// The package's native module.
#[pymodule]
fn _fusebox(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FuseboxError", m.py().get_type::<FuseboxError>())?;
    m.add_class::<Model>()?;
    m.add_class::<Compiled>()?;
    m.add_function(wrap_pyfunction!(aten_support, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
