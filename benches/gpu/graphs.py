"""fusebox graph files from Python: read them, run them with PyTorch, and write random ones.

Shared by check_gpu.py and peers_gpu.py; only the standard library is needed to import it
(torch is imported by the functions that use it).

* `read(path)` parses the RON subset graph files use (structs, named fields, lists, string-keyed
  maps, strings, numbers, bools, `//` comments) into plain dicts and lists.
* `torch_function(graph)` builds a function that evaluates the graph with PyTorch ops, one call
  per node, the same math fusebox's op catalogue defines (rules/ops.ron). It is what "PyTorch
  eager" and "torch.compile" run in the benchmark table, so every peer computes the same graph.
* `random_graph(rng, index)` writes a small random graph aimed at what breaks fusers:
  broadcasting ([N,1] against [1,M]), size-1 dims, reductions ending kernels, f16/bf16 and mixed
  dtypes, where/bool, matmul with casts.
"""

import math
import os
import re

# --- Reading RON ----------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<comment>//[^\n]*)
      | (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<number>[-+]?(?:inf|NaN|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<punct>[()\[\]{}:,])
    )""",
    re.VERBOSE,
)


def _tokens(text):
    pos = 0
    out = []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"RON: unexpected text at offset {pos}: {text[pos:pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind != "comment":
            out.append((kind, m.group(kind)))


def _number(text):
    if text.lstrip("+-") in ("inf", "NaN"):
        return float(text)
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    return float(text)


def parse_ron(text):
    """The value of a RON document: structs become dicts (with the struct name under
    "__struct__"), lists lists, maps dicts."""
    toks = _tokens(text)
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else (None, None)

    def take(expected=None):
        nonlocal pos
        tok = peek()
        if expected is not None and tok[1] != expected:
            raise ValueError(f"RON: expected {expected!r}, found {tok[1]!r}")
        pos += 1
        return tok

    def value():
        kind, text = peek()
        if kind == "string":
            take()
            return bytes(text[1:-1], "utf-8").decode("unicode_escape")
        if kind == "number":
            take()
            return _number(text)
        if kind == "ident":
            take()
            if text in ("true", "false"):
                return text == "true"
            if text in ("inf", "NaN"):
                return float(text)
            if peek()[1] == "(":
                return struct(text)
            return text
        if text == "(":
            return struct(None)
        if text == "[":
            take("[")
            items = []
            while peek()[1] != "]":
                items.append(value())
                if peek()[1] == ",":
                    take(",")
            take("]")
            return items
        if text == "{":
            take("{")
            entries = {}
            while peek()[1] != "}":
                key = value()
                take(":")
                entries[key] = value()
                if peek()[1] == ",":
                    take(",")
            take("}")
            return entries
        raise ValueError(f"RON: unexpected {text!r}")

    def struct(name):
        take("(")
        fields = {"__struct__": name}
        positional = []
        while peek()[1] != ")":
            kind, text = peek()
            if kind == "ident" and pos + 1 < len(toks) and toks[pos + 1][1] == ":":
                take()
                take(":")
                fields[text] = value()
            else:
                positional.append(value())
            if peek()[1] == ",":
                take(",")
        take(")")
        if positional:
            fields["__args__"] = positional
        return fields

    result = value()
    if pos != len(toks):
        raise ValueError("RON: text after the document")
    return result


def read(path):
    """A graph file as {"name", "inputs": [{"name","dtype","shape"}], "nodes": [{"name","op",
    "args","attrs"}], "outputs"}."""
    with open(path) as f:
        doc = parse_ron(f.read())
    if doc.get("__struct__") != "Graph":
        raise ValueError(f"{path}: not a Graph")
    return {
        "name": doc["name"],
        "inputs": [
            {"name": i["name"], "dtype": i["dtype"], "shape": list(i["shape"])}
            for i in doc.get("inputs", [])
        ],
        "nodes": [
            {
                "name": n["name"],
                "op": n["op"],
                "args": list(n.get("args", [])),
                "attrs": dict(n.get("attrs", {})),
            }
            for n in doc.get("nodes", [])
        ],
        "outputs": list(doc["outputs"]),
    }


# --- Writing RON ----------------------------------------------------------------------------


def _ron_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_ron_value(x) for x in v) + "]"
    return str(v)


def to_ron(graph):
    lines = ["Graph(", f'    name: "{graph["name"]}",', "    inputs: ["]
    for i in graph["inputs"]:
        lines.append(
            f'        Input(name: "{i["name"]}", dtype: "{i["dtype"]}", shape: {_ron_value(i["shape"])}),'
        )
    lines.append("    ],")
    lines.append("    nodes: [")
    for n in graph["nodes"]:
        parts = [f'name: "{n["name"]}"', f'op: "{n["op"]}"']
        if n["args"]:
            parts.append("args: " + _ron_value(n["args"]))
        if n["attrs"]:
            attrs = ", ".join(f'"{k}": {_ron_value(v)}' for k, v in sorted(n["attrs"].items()))
            parts.append("attrs: {" + attrs + "}")
        lines.append("        Node(" + ", ".join(parts) + "),")
    lines.append("    ],")
    lines.append("    outputs: " + _ron_value(graph["outputs"]) + ",")
    lines.append(")")
    return "\n".join(lines) + "\n"


def example_paths(root, selection=None):
    """(name, path) of the graphs to run: every `examples/*.ron` by default; with `selection`
    (comma-separated), those example names, and any entry ending in `.ron` as a graph file
    (relative to the checkout's root, e.g. book/examples/layout/softmax_of_erf.ron)."""
    directory = os.path.join(root, "examples")
    names = sorted(f[:-4] for f in os.listdir(directory) if f.endswith(".ron"))
    if not selection:
        return [(n, os.path.join(directory, n + ".ron")) for n in names]
    chosen = []
    for entry in selection.split(","):
        if entry.endswith(".ron"):
            path = entry if os.path.isabs(entry) else os.path.join(root, entry)
            if not os.path.isfile(path):
                raise SystemExit(f"no graph file {entry}")
            chosen.append((os.path.basename(entry)[:-4], path))
        elif entry in names:
            chosen.append((entry, os.path.join(directory, entry + ".ron")))
        else:
            raise SystemExit(f"no example `{entry}` in examples/ (a graph file must end in .ron)")
    return chosen


# --- PyTorch ----------------------------------------------------------------------------------


def torch_dtype(torch, name):
    return {
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "f32": torch.float32,
        "f64": torch.float64,
        "i32": torch.int32,
        "i64": torch.int64,
        "bool": torch.bool,
    }[name]


def _axes(attrs, ndim):
    axes = attrs.get("axes")
    if axes is None:
        return list(range(ndim))
    return [a % ndim if ndim else 0 for a in axes]


def torch_ops(torch):
    """fusebox op name -> f(args, attrs) with PyTorch semantics matching rules/ops.ron."""
    F = torch.nn.functional

    def reduce(fn):
        def run(args, attrs):
            x = args[0]
            axes = _axes(attrs, x.dim())
            keep = bool(attrs.get("keepdim", False))
            if not axes:
                return x
            return fn(x, axes, keep)

        return run

    def slice_(args, attrs):
        x = args[0]
        axis = attrs.get("axis", 0) % max(x.dim(), 1)
        start = attrs.get("start", 0)
        end = attrs.get("end", x.shape[axis])
        step = attrs.get("step", 1)
        index = [slice(None)] * x.dim()
        index[axis] = slice(start, end, step)
        return x[tuple(index)]

    def transpose(args, attrs):
        x = args[0]
        perm = attrs.get("perm") or list(reversed(range(x.dim())))
        return x.permute(*perm).contiguous()

    def layer_norm(args, attrs):
        x, weight, bias = args
        axes = _axes({"axes": attrs.get("axes", [-1])}, x.dim())
        if sorted(axes) != list(range(x.dim() - len(axes), x.dim())):
            raise NotImplementedError("layer_norm over axes that are not the innermost")
        shape = list(x.shape[x.dim() - len(axes):])
        return F.layer_norm(x, shape, weight, bias, attrs.get("epsilon", 1e-5))

    return {
        "neg": lambda a, _: -a[0],
        "abs": lambda a, _: torch.abs(a[0]),
        "exp": lambda a, _: torch.exp(a[0]),
        "log": lambda a, _: torch.log(a[0]),
        "log1p": lambda a, _: torch.log1p(a[0]),
        "sqrt": lambda a, _: torch.sqrt(a[0]),
        "rsqrt": lambda a, _: torch.rsqrt(a[0]),
        "sin": lambda a, _: torch.sin(a[0]),
        "cos": lambda a, _: torch.cos(a[0]),
        "tanh": lambda a, _: torch.tanh(a[0]),
        "erf": lambda a, _: torch.erf(a[0]),
        "sigmoid": lambda a, _: torch.sigmoid(a[0]),
        "relu": lambda a, _: torch.relu(a[0]),
        "gelu": lambda a, _: F.gelu(a[0]),
        "silu": lambda a, _: F.silu(a[0]),
        "softplus": lambda a, _: F.softplus(a[0]),
        "pow": lambda a, _: torch.pow(a[0], a[1]),
        "add": lambda a, _: a[0] + a[1],
        "sub": lambda a, _: a[0] - a[1],
        "mul": lambda a, _: a[0] * a[1],
        "div": lambda a, _: a[0] / a[1],
        "max": lambda a, _: torch.maximum(a[0], a[1]),
        "min": lambda a, _: torch.minimum(a[0], a[1]),
        "clamp": lambda a, t: torch.clamp(
            a[0], min=t.get("min", -math.inf), max=t.get("max", math.inf)
        ),
        "where": lambda a, _: torch.where(a[0], a[1], a[2]),
        "gt": lambda a, _: a[0] > a[1],
        "lt": lambda a, _: a[0] < a[1],
        "ge": lambda a, _: a[0] >= a[1],
        "le": lambda a, _: a[0] <= a[1],
        "eq": lambda a, _: a[0] == a[1],
        "ne": lambda a, _: a[0] != a[1],
        "cast": lambda a, t: a[0].to(torch_dtype(torch, t["dtype"])),
        "sum": reduce(lambda x, axes, keep: torch.sum(x, dim=axes, keepdim=keep)),
        "mean": reduce(lambda x, axes, keep: torch.mean(x, dim=axes, keepdim=keep)),
        "reduce_max": reduce(lambda x, axes, keep: torch.amax(x, dim=axes, keepdim=keep)),
        "sum_to_size": lambda a, t: a[0].sum_to_size(list(t["shape"])),
        "broadcast_to": lambda a, t: a[0].broadcast_to(list(t["shape"])),
        "reshape": lambda a, t: a[0].reshape(list(t["shape"])),
        "transpose": transpose,
        "slice": slice_,
        "concat": lambda a, t: torch.cat(a, dim=t.get("axis", 0)),
        "matmul": lambda a, _: torch.matmul(a[0], a[1]),
        # Composites of rules/ops.ron, as PyTorch's own kernels.
        "softmax": lambda a, t: torch.softmax(a[0], dim=t.get("axis", -1)),
        "layer_norm": layer_norm,
    }


def torch_function(graph, torch, device):
    """f(*inputs) -> tuple of outputs, evaluating `graph` node by node with PyTorch."""
    ops = torch_ops(torch)
    missing = sorted({n["op"] for n in graph["nodes"] if n["op"] != "const" and n["op"] not in ops})
    if missing:
        raise NotImplementedError(f"no PyTorch version of op(s) {', '.join(missing)}")
    consts = {}
    for n in graph["nodes"]:
        if n["op"] == "const":
            dtype = torch_dtype(torch, n["attrs"].get("dtype", "f32"))
            consts[n["name"]] = torch.tensor(n["attrs"]["value"], dtype=dtype, device=device)
    input_names = [i["name"] for i in graph["inputs"]]
    nodes = [n for n in graph["nodes"] if n["op"] != "const"]

    def run(*inputs):
        values = dict(consts)
        values.update(zip(input_names, inputs))
        for n in nodes:
            values[n["name"]] = ops[n["op"]]([values[a] for a in n["args"]], n["attrs"])
        return tuple(values[o] for o in graph["outputs"])

    return run


def torch_inputs(graph, torch, device, seed):
    """Random inputs like fusebox's: floats uniform in [-3, 3], integers in [-10, 10], fair
    bools."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for i in graph["inputs"]:
        dtype = torch_dtype(torch, i["dtype"])
        shape = i["shape"]
        if dtype == torch.bool:
            x = torch.randint(0, 2, shape, generator=gen).bool()
        elif dtype in (torch.int32, torch.int64):
            x = torch.randint(-10, 11, shape, generator=gen).to(dtype)
        else:
            x = (torch.rand(shape, generator=gen, dtype=torch.float64) * 6 - 3).to(dtype)
        out.append(x.to(device))
    return out


# --- Random graphs ------------------------------------------------------------------------------

UNARY = ["neg", "exp", "tanh", "sigmoid", "relu", "abs", "gelu", "silu", "softplus", "sqrt"]
BINARY = ["add", "sub", "mul", "div", "max", "min"]
def row_graph(kind, dtype, rows, length, transposed=False):
    """Softmax or layernorm (affine) over rows of `length` elements, as the examples write
    them, at any size: the row kernels' device check (check_gpu.py --rows) runs each of the
    CUDA row kernel's paths (registers with and without vectors, shared memory, re-reading)
    by choosing lengths around their limits. With `transposed`, x is stored [length, rows]
    and transposed, so the row is strided (no vectors)."""
    graph = {"name": f"{kind}_{dtype}_{rows}x{length}", "inputs": [], "nodes": [], "outputs": []}
    stored = [length, rows] if transposed else [rows, length]
    graph["inputs"].append({"name": "x", "dtype": dtype, "shape": stored})
    nodes = graph["nodes"]

    def node(name, op, args, **attrs):
        nodes.append({"name": name, "op": op, "args": args, "attrs": attrs})

    x = "x"
    if transposed:
        node("xt", "transpose", ["x"], perm=[1, 0])
        x = "xt"
    last = {"axes": [-1], "keepdim": True}
    if kind == "softmax":
        node("m", "reduce_max", [x], **last)
        node("shifted", "sub", [x, "m"])
        node("e", "exp", ["shifted"])
        node("s", "sum", ["e"], **last)
        node("y", "div", ["e", "s"])
    elif kind == "layernorm":
        graph["inputs"].append({"name": "weight", "dtype": dtype, "shape": [length]})
        graph["inputs"].append({"name": "bias", "dtype": dtype, "shape": [length]})
        node("mean", "mean", [x], **last)
        node("centered", "sub", [x, "mean"])
        node("squared", "mul", ["centered", "centered"])
        node("var", "mean", ["squared"], **last)
        nodes.append({"name": "eps", "op": "const", "args": [], "attrs": {"value": 1e-5, "dtype": dtype}})
        node("var_eps", "add", ["var", "eps"])
        node("rstd", "rsqrt", ["var_eps"])
        node("normalized", "mul", ["centered", "rstd"])
        node("scaled", "mul", ["normalized", "weight"])
        node("y", "add", ["scaled", "bias"])
    else:
        raise ValueError(f"unknown row graph {kind}")
    graph["outputs"].append("y")
    return graph


REDUCE = ["sum", "mean", "reduce_max"]
FLOATS = ["f32", "f32", "f16", "bf16"]


def random_graph(rng, index, n=None, m=None):
    """A random graph (as read() returns) over dims n x m. Not every graph type-checks:
    `fusebox check` is the judge, and check_gpu.py skips the ones it rejects."""
    n = n or rng.choice([1, 2, 3, 64, 257, 1024])
    m = m or rng.choice([1, 5, 128, 700, 1030])
    shapes = [[n, m], [n, 1], [1, m], [m], [n, m]]
    graph = {"name": f"random_{index}", "inputs": [], "nodes": [], "outputs": []}
    values = []  # (name, shape, dtype)
    for k in range(rng.randint(1, 3)):
        shape = rng.choice(shapes)
        dtype = rng.choice(FLOATS)
        graph["inputs"].append({"name": f"x{k}", "dtype": dtype, "shape": shape})
        values.append((f"x{k}", shape, dtype))

    def broadcast(a, b):
        out = []
        for x, y in zip([1] * (len(b) - len(a)) + a, [1] * (len(a) - len(b)) + b):
            if x != y and x != 1 and y != 1:
                return None
            out.append(max(x, y))
        return out

    def promote(a, b):
        return a if a == b else "f32"

    def matmul_shape(sa, sb):
        if not sa or not sb:
            return None
        ma = [1] + sa if len(sa) == 1 else sa
        mb = sb + [1] if len(sb) == 1 else sb
        if ma[-1] != mb[-2]:
            return None
        batch = broadcast(ma[:-2], mb[:-2])
        if batch is None:
            return None
        return batch + ma[-2:-1] * (len(sa) > 1) + mb[-1:] * (len(sb) > 1)

    for k in range(rng.randint(2, 9)):
        name = f"v{k}"
        kind = rng.random()
        a = rng.choice(values)
        if kind < 0.3:
            op = rng.choice(UNARY)
            node = {"name": name, "op": op, "args": [a[0]], "attrs": {}}
            shape, dtype = a[1], a[2]
        elif kind < 0.55:
            b = rng.choice(values)
            shape = broadcast(a[1], b[1])
            if shape is None:
                continue
            node = {"name": name, "op": rng.choice(BINARY), "args": [a[0], b[0]], "attrs": {}}
            dtype = promote(a[2], b[2])
        elif kind < 0.65:
            b, c = rng.choice(values), rng.choice(values)
            cond_shape = broadcast(a[1], b[1])
            shape = cond_shape and broadcast(cond_shape, c[1])
            if shape is None:
                continue
            cond = f"{name}_c"
            graph["nodes"].append({"name": cond, "op": "gt", "args": [a[0], b[0]], "attrs": {}})
            node = {"name": name, "op": "where", "args": [cond, b[0], c[0]], "attrs": {}}
            dtype = promote(b[2], c[2])
        elif kind < 0.75:
            dtype = rng.choice(FLOATS)
            node = {"name": name, "op": "cast", "args": [a[0]], "attrs": {"dtype": dtype}}
            shape = a[1]
        elif kind < 0.8:
            if len(a[1]) != 2:
                continue
            node = {"name": name, "op": "transpose", "args": [a[0]], "attrs": {}}
            shape, dtype = [a[1][1], a[1][0]], a[2]
        elif kind < 0.92:
            if not a[1]:
                continue
            op = rng.choice(REDUCE)
            axis = rng.choice([-1, 0])
            keep = rng.random() < 0.5
            node = {
                "name": name,
                "op": op,
                "args": [a[0]],
                "attrs": {"axes": [axis], "keepdim": keep},
            }
            shape = list(a[1])
            if keep:
                shape[axis] = 1
            else:
                del shape[axis]
            dtype = a[2]
        else:
            b = rng.choice(values)
            shape = matmul_shape(a[1], b[1])
            if shape is None:
                continue
            node = {"name": name, "op": "matmul", "args": [a[0], b[0]], "attrs": {}}
            dtype = promote(a[2], b[2])
        graph["nodes"].append(node)
        values.append((name, shape, dtype))
    if not graph["nodes"]:
        return None
    produced = [v[0] for v in values if not v[0].startswith("x")]
    graph["outputs"] = produced[-2:] if len(produced) >= 2 else produced[-1:]
    return graph
