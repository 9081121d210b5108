"""fusebox from Python: load a graph or an ONNX model, optimize it, compile it for a backend and
run it on NumPy arrays or PyTorch tensors by name.

>>> import numpy as np, fusebox
>>> model = fusebox.parse('''Graph(name: "g",
...     inputs: [Input(name: "x", dtype: "f32", shape: [2, 3])],
...     nodes: [Node(name: "y", op: "relu", args: ["x"])], outputs: ["y"])''')
>>> compiled = model.compile("cpu")
>>> compiled.run(x=np.array([[-1, 2, -3], [4, -5, 6]], np.float32))["y"].tolist()
[[0.0, 2.0, 0.0], [4.0, 0.0, 6.0]]

Errors are `fusebox.FuseboxError`, with fusebox's message (file, line and column, or node).
`torch.compile(model, backend="fusebox")` is the backend in `fusebox.torch`.
"""

import json
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ._fusebox import FuseboxError, __version__
from ._fusebox import Model as _NativeModel

__all__ = ["FuseboxError", "Model", "Compiled", "Optimization", "Tensor", "load", "parse", "__version__"]

# fusebox's dtype names and NumPy's dtypes. bf16 has no NumPy dtype: a bf16 value is given as
# any float array (rounded to nearest even on the way in) and returned as float32.
_NUMPY = {
    "bool": np.bool_,
    "i8": np.int8,
    "u8": np.uint8,
    "i16": np.int16,
    "u16": np.uint16,
    "i32": np.int32,
    "u32": np.uint32,
    "i64": np.int64,
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
}


class Tensor(NamedTuple):
    """An input or output of a model: its name, fusebox dtype and shape; `stored` tells
    whether the model holds a value for the input (a weight), so a run need not give one."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    stored: bool = False


class Optimization(NamedTuple):
    """What `Model.optimize` found: the report `fusebox optimize --json` prints (a dict) and
    the `--explain` text."""

    report: dict
    explanation: str


class Model:
    """A graph with its stored values (an ONNX model's weights, a graph file's `.npy` values)."""

    def __init__(self, native: _NativeModel):
        self._native = native
        self.inputs = [Tensor(n, d, tuple(s), st) for n, d, s, st in native.inputs()]
        self.outputs = [Tensor(n, d, tuple(s)) for n, d, s in native.outputs()]

    def optimize(self, profile: str = "cpu", amp: Optional[str] = None) -> Optimization:
        """Optimizes for a cost profile (`"cpu"` or `"cuda"`) without compiling."""
        report, explanation = self._native.optimize(profile, amp)
        return Optimization(json.loads(report), explanation)

    def compile(
        self,
        backend: str = "cpu",
        amp: Optional[str] = None,
        fusion: bool = True,
        lt_epilogues: bool = False,
    ) -> "Compiled":
        """Compiles for `"cpu"` (C kernels), `"cuda"` (NVRTC, needs a GPU) or `"reference"`
        (the unfused evaluator). `amp` names a policy of the rules (`"bf16"`, ...).
        `lt_epilogues` (`"cuda"` only, as `--lt-epilogues`) runs a GEMM's bias, residual,
        scale and ReLU or tanh GELU in the GEMM through cuBLASLt."""
        return Compiled(self, self._native.compile(backend, amp, not fusion, lt_epilogues))

    def __repr__(self):
        ins = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.inputs)
        outs = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.outputs)
        return f"fusebox.Model(({ins}) -> ({outs}))"


def load(path, rules: Optional[str] = None) -> Model:
    """Reads a RON graph file (with the `.npy` values it names) or an `.onnx` model; `rules`
    is a rule directory laid over the embedded rules."""
    return Model(_NativeModel.load(str(path), rules))


def parse(text: str, name: str = "graph.ron", rules: Optional[str] = None) -> Model:
    """Parses a graph written in fusebox's RON format; `name` names it in errors."""
    return Model(_NativeModel.parse(text, name, rules))


_TORCH: Dict[str, object] = {}


def torch_dtypes() -> Dict[str, object]:
    """fusebox's dtype names and PyTorch's dtypes (importing torch only when first asked)."""
    if not _TORCH:
        import torch

        _TORCH.update(
            {
                "bool": torch.bool,
                "i8": torch.int8,
                "u8": torch.uint8,
                "i16": torch.int16,
                "u16": torch.uint16,
                "i32": torch.int32,
                "u32": torch.uint32,
                "i64": torch.int64,
                "f16": torch.float16,
                "bf16": torch.bfloat16,
                "f32": torch.float32,
                "f64": torch.float64,
            }
        )
    return _TORCH


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def _bf16_bits(array: np.ndarray) -> np.ndarray:
    """Float values as bf16 bit patterns, rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(array)
    if nan.any():
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Compiled:
    """A model compiled for one backend: `run` it on arrays by name."""

    def __init__(self, model: Model, native):
        self._native = native
        # The GPU whose memory a CUDA model reads and writes in place (None for the other
        # backends, and for a model compiled per input size, which copies through the host).
        self._cuda_device = native.device_memory()
        self._cuda: Optional[_CudaCall] = None
        self._declared = {t.name: t for t in model.inputs}
        types = {t.name: t for t in model.outputs}
        self._outputs = [types[name] for name in native.output_names()]

    @property
    def report(self) -> Optional[dict]:
        """The optimization report (kernels before and after, bytes, rewrites); `None` for
        the reference backend."""
        text = self._native.report()
        return None if text is None else json.loads(text)

    @property
    def kernels(self) -> Optional[Tuple[int, int]]:
        """`(kernels, library_calls)` a run launches; `None` for the reference backend."""
        return self._native.kernels()

    @property
    def kernel_builds(self) -> Dict[str, int]:
        """Kernel sources compiled so far, and found in the compiler's memory or on disk."""
        compiled, memory, disk = self._native.kernel_builds()
        return {"compiled": compiled, "memory_hits": memory, "disk_hits": disk}

    def describe(self) -> str:
        return self._native.describe()

    def run(self, inputs: Optional[dict] = None, **named) -> dict:
        """Runs on `inputs` by name (a dict, keyword arguments, or both) and returns the
        outputs by name. Values are NumPy arrays (or anything `numpy.asarray` takes) or PyTorch
        tensors; with any tensor given, the outputs are tensors. A model compiled for CUDA
        given a CUDA tensor runs on its GPU's memory in place, queued on PyTorch's current
        stream without a host wait, and returns CUDA tensors; otherwise values are copied
        through host memory. An input the model stores a value for may be left out. A value of
        another dtype of the same kind is converted; a C-contiguous array of the declared dtype
        is read in place, and the outputs are written in place, with no copy. Any thread may
        run a model, one call at a time."""
        given = dict(inputs or {})
        given.update(named)
        for name in given:
            if name not in self._declared:
                known = ", ".join(self._declared)
                raise FuseboxError(f"the model has no input `{name}` (its inputs: {known})")
        if self._cuda_device is not None and any(_is_torch(v) and v.device.type == "cuda" for v in given.values()):
            return self._run_cuda(given)
        use_torch = any(_is_torch(v) for v in given.values())
        held: List[object] = []
        args = []
        for name, value in given.items():
            declared = self._declared[name]
            array, address = _host(value, declared.dtype)
            held.append(array)
            args.append((name, declared.dtype, list(array.shape), address))
        outputs, results = [], {}
        for out in self._outputs:
            array, address, result = _empty(out.dtype, out.shape, use_torch)
            held.append(array)
            outputs.append((out.dtype, list(out.shape), address))
            results[out.name] = result
        self._native._run_addresses(args, outputs)
        return {name: finish() for name, finish in results.items()}

    def _tensor_call(self, names: List[str]):
        """A run on PyTorch CPU tensors given in `names`' order, returning the output tensors
        in `output_names` order, with every lookup made once: what the torch.compile backend
        calls on each run of a CPU part, where the glue per call is what is left. (A CUDA
        part goes through `_run_cuda`, the path measured on a GPU.)"""
        import torch

        types = torch_dtypes()
        inputs = [(name, self._declared[name].dtype, types[self._declared[name].dtype]) for name in names]
        outputs = [(o.dtype, tuple(o.shape), types[o.dtype]) for o in self._outputs]
        native, empty, cpu = self._native, torch.empty, torch.device("cpu")

        def call(tensors):
            held = [_placed(t, cpu, want) for t, (_, _, want) in zip(tensors, inputs)]
            args = [(name, dtype, t.shape, t.data_ptr()) for t, (name, dtype, _) in zip(held, inputs)]
            outs = [empty(shape, dtype=dtype) for _, shape, dtype in outputs]
            native._run_addresses(args, [(dtype, shape, o.data_ptr()) for o, (dtype, shape, _) in zip(outs, outputs)])
            return outs

        return call

    def _run_cuda(self, given: dict) -> dict:
        """A run on the model's GPU, queued on PyTorch's current stream there: inputs as
        contiguous tensors of their declared dtype on that device (a tensor that already is one
        is read in place), outputs fresh tensors fusebox writes. Returns without waiting, as a
        PyTorch op does: the outputs are ready for whatever is queued on the stream next."""
        if self._cuda is None:
            self._cuda = _CudaCall(self._cuda_device, self._outputs)
        cuda = self._cuda
        held, args = [], []
        for name, value in given.items():
            dtype = self._declared[name].dtype
            tensor = cuda.on_device(value, dtype)
            held.append(tensor)
            args.append((name, dtype, tensor.shape, tensor.data_ptr()))
        results, outputs = {}, []
        for out, (shape, torch_dtype) in zip(self._outputs, cuda.output_types):
            tensor = cuda.empty(shape, dtype=torch_dtype, device=cuda.device)
            results[out.name] = tensor
            outputs.append((out.dtype, shape, tensor.data_ptr()))
        self._native._run_device(args, outputs, cuda.stream())
        return results


class _CudaCall:
    """What a run on a GPU looks up once: the device, the outputs' PyTorch types, and how to
    read PyTorch's current stream (its raw-stream call, the one Inductor's generated code uses,
    where this PyTorch has it: a few microseconds less per call than the `Stream` object)."""

    def __init__(self, ordinal: int, outputs: List[Tensor]):
        import torch

        self.torch = torch
        self.empty = torch.empty
        self.device = torch.device("cuda", ordinal)
        self.types = torch_dtypes()
        self.output_types = [(tuple(o.shape), self.types[o.dtype]) for o in outputs]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            self.stream = lambda: raw(ordinal)
        else:
            self.stream = lambda: torch.cuda.current_stream(self.device).cuda_stream

    def on_device(self, value, dtype: str):
        """`value` as a contiguous tensor of `dtype` on the device (itself when it is one)."""
        if not _is_torch(value):
            storage = np.float32 if dtype == "bf16" else _NUMPY[dtype]
            value = self.torch.from_numpy(np.ascontiguousarray(value, dtype=storage))
        return _placed(value, self.device, self.types[dtype])


def _placed(tensor, device, dtype):
    """`tensor` as a contiguous tensor of `dtype` on `device`: itself when it already is one."""
    if tensor.dtype != dtype or tensor.device != device:
        tensor = tensor.to(device=device, dtype=dtype)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _host(value, dtype: str):
    """`value` as C-contiguous host memory of `dtype`, and its address."""
    if _is_torch(value):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        tensor = tensor.to(torch_dtypes()[dtype]).contiguous()
        return tensor, tensor.data_ptr()
    if dtype == "bf16":
        array = _bf16_bits(np.asarray(value, dtype=np.float32))
    else:
        array = np.ascontiguousarray(value, dtype=_NUMPY[dtype])
    return array, array.__array_interface__["data"][0]


def _empty(dtype: str, shape, use_torch: bool):
    """A fresh output array, its address, and how to turn it into the returned value."""
    if use_torch:
        import torch

        tensor = torch.empty(tuple(shape), dtype=torch_dtypes()[dtype])
        return tensor, tensor.data_ptr(), lambda: tensor
    storage = np.uint16 if dtype == "bf16" else _NUMPY[dtype]
    array = np.empty(tuple(shape), dtype=storage)
    if dtype == "bf16":
        return array, array.__array_interface__["data"][0], lambda: _from_bf16_bits(array)
    return array, array.__array_interface__["data"][0], lambda: array
