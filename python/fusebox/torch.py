"""`torch.compile(model, backend="fusebox")`: PyTorch keeps running the graph, and fusebox takes
the parts it can fuse.

AOTAutograd hands the backend the forward and the backward graph in core ATen. In each, every
node is offered to fusebox (its ATen table, `rules/aten.ron`, spells ATen ops as ONNX nodes);
PyTorch's capability-based partitioner groups the nodes fusebox takes into maximal convex parts,
and each part runs as one fusebox program: on the CPU backend for CPU tensors, on the CUDA
backend for CUDA tensors. Everything else stays in PyTorch,
so an unsupported op never refuses a model: `last_report()` says what stayed and why.

A part is compiled on its first call, for the shapes and dtypes of that call's tensors, and
again for each new combination (kept per part; the kernels themselves are cached by source, so
a size met again costs no compiler run). Tensors are passed by address: a contiguous tensor of
the right dtype is read in place, and the outputs are tensors fusebox writes directly. On a
GPU the part's kernels are queued on PyTorch's current stream, in order with PyTorch's own
work, and nothing waits on the host.

Under `torch.autocast` the casts PyTorch inserted are part of the graph (`_to_copy` nodes):
fusebox keeps them, as PyTorch's own policy decided them, and its rewrites remove the ones that
cancel.
"""

import json
import math
import operator
from typing import Dict, List, Optional

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from . import FuseboxError, Model, torch_dtypes
from ._fusebox import Model as _NativeModel
from ._fusebox import aten_support

__all__ = ["backend", "last_report"]

# Ops that build a constant from their arguments alone; fusebox takes their value (up to this
# many elements) as a constant of the part, which lets it fold and fuse them.
_CONSTANT_ELEMENTS = 1 << 20
# Ops a part made only of them is not worth a call for (PyTorch runs them as views).
_LAYOUT_OPS = [
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.permute.default",
    "aten.t.default",
    "aten.expand.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.alias.default",
    "aten.slice.Tensor",
    "aten.select.int",
    "_operator.getitem",
]

_REPORTS: List[dict] = []
# The parts made since the last `reset_report()` (for benchmarks that time one part alone).
_PARTS: List["_Part"] = []


def last_report() -> List[dict]:
    """What the backend did with each graph it was given since the last `reset_report()`: the
    parts fusebox runs (their nodes and kernels) and the nodes left to PyTorch, with why."""
    return list(_REPORTS)


def reset_report() -> None:
    """Forgets what `last_report()` holds."""
    _REPORTS.clear()
    _PARTS.clear()


def _fusebox_dtype(dtype) -> Optional[str]:
    for name, d in torch_dtypes().items():
        if d == dtype:
            return name
    return None


def _size(value) -> Optional[int]:
    """An int, or a symbolic size's hint (the size it was traced at): a graph with symbolic
    sizes is asked about, and partitioned, at its hints, and compiled per call at real sizes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else None
    return None


def _tensor_type(value) -> Optional[dict]:
    if not isinstance(value, torch.Tensor):
        return None
    dtype = _fusebox_dtype(value.dtype)
    shape = [_size(d) for d in value.shape]
    if dtype is None or None in shape:
        return None
    return {"dtype": dtype, "shape": shape}


def _int_valued(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def _encode(value):
    """An argument as the JSON fusebox reads (`fusebox::aten::fx`); `None` means it cannot be."""
    if isinstance(value, torch.fx.Node):
        if _int_valued(value):  # a size computed in the graph: its value (or hint)
            size = _size(value.meta["val"])
            return _Unencodable if size is None else size
        if value.op == "call_function" and value.target is operator.getitem:
            source, index = value.args
            return {"ref": source.name, "index": int(index)}
        return {"ref": value.name}
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, torch.dtype):
        name = _fusebox_dtype(value)
        return {"dtype": name} if name else _Unencodable
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return _Unencodable if any(i is _Unencodable for i in items) else items
    return _Unencodable


class _UnencodableType:
    pass


_Unencodable = _UnencodableType()


def _named_args(node: torch.fx.Node) -> Optional[dict]:
    """The node's arguments by schema name, the schema's defaults filled in."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    named = {}
    for k, arg in enumerate(schema.arguments):
        if k < len(node.args):
            value = node.args[k]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            value = None
        encoded = _encode(value)
        if encoded is _Unencodable:
            return None
        named[arg.name] = encoded
    return named


def _outputs(node: torch.fx.Node):
    """The node's output types and which outputs are read, from the traced fake values."""
    value = node.meta.get("val")
    if isinstance(value, (list, tuple)):
        types = [_tensor_type(v) for v in value]
        used = sorted({int(u.args[1]) for u in node.users if u.target is operator.getitem})
        if any(types[i] is None for i in used) or not used:
            return None
        types = [t or {"dtype": "f32", "shape": [0]} for t in types]
        return types, used
    t = _tensor_type(value)
    return ([t], None) if t else None


def _is_constant(node: torch.fx.Node) -> bool:
    """Whether the node builds a small constant from its arguments alone."""
    if node.op != "call_function" or not hasattr(node.target, "_schema"):
        return False
    if not all(_int_valued(a) for a in node.all_input_nodes):
        return False
    tags = getattr(node.target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags:
        return False
    t = _tensor_type(node.meta.get("val"))
    return t is not None and math.prod(t["shape"]) <= _CONSTANT_ELEMENTS


def _common_dtype(node: torch.fx.Node, named: dict) -> Optional[str]:
    """PyTorch's result dtype of the `self` and `other` operands (for comparisons)."""
    if "self" not in named or "other" not in named:
        return None
    operands = []
    for key in ("self", "other"):
        arg = node.args[0] if key == "self" else (node.args[1] if len(node.args) > 1 else node.kwargs.get("other"))
        if isinstance(arg, torch.fx.Node):
            val = arg.meta.get("val")
            if not isinstance(val, torch.Tensor):
                return None
            operands.append(torch.empty(val.shape, dtype=val.dtype, device="meta"))
        elif isinstance(arg, (int, float, bool)):
            operands.append(arg)
        else:
            return None
    try:
        return _fusebox_dtype(torch.result_type(*operands))
    except (TypeError, RuntimeError):
        return None


def _node_json(node: torch.fx.Node) -> Optional[dict]:
    named = _named_args(node)
    outs = _outputs(node)
    if named is None or outs is None:
        return None
    types, used = outs
    entry = {"name": node.name, "target": str(node.target), "args": named, "outputs": types}
    if used is not None:
        entry["used"] = used
    common = _common_dtype(node, named)
    if common is not None:
        entry["common"] = common
    return entry


def _graph_json(gm: torch.fx.GraphModule, inputs: List[dict], constants: List[dict]) -> dict:
    """The graph's nodes fusebox might take, as JSON, with its inputs' and constants' types."""
    nodes, outputs = [], []
    constant_names = {c["name"] for c in constants}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem and node.name not in constant_names:
            entry = _node_json(node)
            if entry is not None:
                nodes.append(entry)
        elif node.op == "output":
            result = node.args[0]
            for value in result if isinstance(result, (list, tuple)) else [result]:
                if isinstance(value, torch.fx.Node):
                    outputs.append(_encode(value))
    return {"name": gm.__class__.__name__, "inputs": inputs, "constants": constants, "nodes": nodes, "outputs": outputs}


class _Support(OperatorSupport):
    """The nodes fusebox takes: those its ATen table spells (asked once per graph), small
    constants, and the `getitem`s of taken multi-output nodes."""

    def __init__(self, taken: set):
        super().__init__()
        self.taken = taken

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            return node.args[0].name in self.taken
        return node.name in self.taken


def _placeholder_types(gm: torch.fx.GraphModule) -> List[dict]:
    types = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            t = _tensor_type(node.meta.get("val"))
            if t is not None:
                types.append({"name": node.name, **t})
    return types


def _partition(gm: torch.fx.GraphModule, report: dict, settings: dict) -> torch.fx.GraphModule:
    """`gm` with the parts fusebox takes replaced by `_Part` modules."""
    constants = {n.name for n in gm.graph.nodes if _is_constant(n)}
    inputs = _placeholder_types(gm)
    for node in gm.graph.nodes:
        if node.name in constants:
            inputs.append({"name": node.name, **_tensor_type(node.meta["val"])})
    whole = _graph_json(gm, inputs, [])
    whole["nodes"] = [n for n in whole["nodes"] if n["name"] not in constants]
    verdicts = aten_support(json.dumps(whole), settings["rules"])
    taken = {name for name, why in verdicts.items() if why is None} | constants
    left = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem and node.name not in taken and not _int_valued(node):
            left[node.name] = verdicts.get(node.name) or f"`{node.target}` has arguments or outputs fusebox cannot read"
    report["left_in_pytorch"] = left
    partitioner = CapabilityBasedPartitioner(
        gm,
        _Support(taken),
        allows_single_node_partition=False,
        non_compute_ops=_LAYOUT_OPS + [str(n.target) for n in gm.graph.nodes if n.name in constants],
    )
    fused = partitioner.partition_and_fuse()
    parts = []
    for name, child in list(fused.named_children()):
        if isinstance(child, torch.fx.GraphModule) and name.startswith("fused_"):
            part = _Part(child, name, settings)
            _PARTS.append(part)
            setattr(fused, name, part)
            parts.append(part.summary)
    report["parts"] = parts
    fused.recompile()
    return fused


class _Part(torch.nn.Module):
    """One part fusebox runs: compiled for each new combination of input shapes and dtypes on
    first use; if fusebox refuses it, it runs in PyTorch (and the report says why)."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, settings: dict):
        super().__init__()
        self.gm = gm
        self.settings = settings
        self.part_name = name
        self.compiled: Dict[tuple, object] = {}
        self.summary = {
            "name": name,
            "nodes": [str(n.target) for n in gm.graph.nodes if n.op == "call_function"],
            "compiled": [],
        }
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self.tuple_output = isinstance(output.args[0], (list, tuple))

    def _compile(self, args):
        gm = self.gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        positions = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if any(_tensor_type(args[k]) is None for k in positions):
            return None, "an input has a dtype fusebox does not have"
        devices = {args[k].device for k in positions}
        engine = _engine(self.settings["engine"], devices)
        if engine is None:
            where = ", ".join(sorted(str(d) for d in devices))
            return None, f"engine `{self.settings['engine']}` does not run tensors on {where}"
        # Every node's value at this call's sizes (symbolic sizes become the call's ints).
        FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
        inputs = [
            {"name": node.name, **_tensor_type(arg)}
            for node, arg in zip(placeholders, args)
            if isinstance(arg, torch.Tensor)
        ]
        constants, data = [], {}
        for node in gm.graph.nodes:
            if _is_constant(node):
                concrete = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _size(n.meta["val"]))
                value = node.target(*concrete[0], **concrete[1]).contiguous()
                constants.append({"name": node.name, **_tensor_type(value)})
                data[node.name] = value.reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
        graph = _graph_json(gm, inputs, constants)
        # One output per value: a repeated output is filled from the first.
        refs = graph["outputs"]
        unique = [ref for k, ref in enumerate(refs) if ref not in refs[:k]]
        graph["outputs"] = unique
        try:
            model = Model(_NativeModel.from_fx(json.dumps(graph), data, self.settings["rules"]))
            compiled = model.compile(engine, lt_epilogues=self.settings["lt_epilogues"] and engine == "cuda")
        except FuseboxError as e:
            return None, str(e)
        order = [unique.index(ref) for ref in refs]
        names = [placeholders[k].name for k in positions]
        if engine == "cpu":
            call = compiled._tensor_call(names)
        else:
            call = lambda ts: list(compiled.run(dict(zip(names, ts))).values())  # noqa: E731
        return (compiled, call, positions, order), None

    def forward(self, *args):
        key = tuple((a.dtype, tuple(a.shape), a.device) if isinstance(a, torch.Tensor) else a for a in args)
        entry = self.compiled.get(key)
        if entry is None:
            entry, why = self._compile(args)
            self.compiled[key] = entry or False
            self.summary["compiled"].append(
                {"shapes": [list(a.shape) for a in args if isinstance(a, torch.Tensor)],
                 "kernels": entry[0].kernels if entry else None,
                 "kernel_builds": entry[0].kernel_builds if entry else None,
                 "refused": why}
            )
        if not entry:
            return self.gm(*args)
        _, call, positions, order = entry
        values = call([args[k] for k in positions])
        outs = [values[k] for k in order]
        return tuple(outs) if self.tuple_output else outs[0]


def _engine(setting: str, devices: set) -> Optional[str]:
    """The backend that runs a part whose tensors lie on `devices` under the `engine` setting:
    `auto` takes the CPU backend for CPU tensors and the CUDA backend for tensors on one GPU;
    `None` when the setting cannot run them (tensors on several devices, CPU and CUDA mixed,
    the reference evaluator given GPU tensors)."""
    kinds = {d.type for d in devices}
    if setting == "reference":
        # The evaluator runs on host values, and the part's results must be where its
        # inputs were.
        return "reference" if kinds <= {"cpu"} else None
    if kinds <= {"cpu"} and setting in ("auto", "cpu"):
        return "cpu"
    if kinds == {"cuda"} and len(devices) == 1 and setting in ("auto", "cuda"):
        return "cuda"
    return None


def _compiler(settings: dict):
    from functorch.compile import make_boxed_func

    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        report = {"graph": gm.__class__.__name__, "nodes": sum(1 for n in gm.graph.nodes if n.op == "call_function")}
        _REPORTS.append(report)
        fused = _partition(gm, report, settings)
        return make_boxed_func(fused.forward)

    return compile_graph


# What `options` may set, and the defaults.
_SETTINGS = {
    # A rule directory laid over the embedded rules (its `aten.ron`, `onnx.ron`, `ops.ron`,
    # `fusion.ron`, ... as everywhere in fusebox).
    "rules": None,
    # What runs the parts: "auto" (the CPU backend for CPU tensors, the CUDA backend for
    # tensors on a GPU), "cpu" or "cuda" (only those tensors; others stay in PyTorch), or
    # "reference" (the unfused evaluator, to tell a fusion problem from a mapping one).
    "engine": "auto",
    # The CUDA backend's `--lt-epilogues`: a GEMM's bias, residual, scale and ReLU or tanh GELU run in the
    # GEMM through cuBLASLt (True or False; parts on the CPU ignore it).
    "lt_epilogues": False,
}


def backend(gm: torch.fx.GraphModule, example_inputs, options: Optional[dict] = None):
    """The `torch.compile` backend: AOTAutograd to core ATen, forward and backward each
    partitioned between fusebox and PyTorch. `torch.compile(model, backend="fusebox",
    options={"rules": DIR, "engine": "reference"})` sets what `_SETTINGS` lists."""
    settings = dict(_SETTINGS)
    for key, value in (options or {}).items():
        if key not in settings:
            raise FuseboxError(f"option `{key}` is not one of {', '.join(_SETTINGS)}")
        settings[key] = value if value is None or key == "lt_epilogues" else str(value)
    if not isinstance(settings["lt_epilogues"], bool):
        raise FuseboxError(f"lt_epilogues `{settings['lt_epilogues']}` is not True or False")
    if settings["engine"] not in ("auto", "cpu", "cuda", "reference"):
        raise FuseboxError(f"engine `{settings['engine']}` is not one of auto, cpu, cuda, reference")
    compile_graph = _compiler(settings)
    return aot_autograd(
        fw_compiler=compile_graph,
        bw_compiler=compile_graph,
        decompositions=core_aten_decompositions(),
    )(gm, example_inputs)


def _register() -> None:
    """Registers the backend under its name for `import fusebox.torch` without the package's
    entry point (a source checkout on `PYTHONPATH`); an installed package has both."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "fusebox" not in _COMPILER_FNS:
        register_backend(compiler_fn=backend, name="fusebox")


_register()
