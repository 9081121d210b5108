"""`torch.compile(..., backend="fusebox")` against eager PyTorch: forward and backward, a module
with an op fusebox does not take (which stays in PyTorch), new shapes, and autocast."""

import pathlib
import sys

import pytest

from conftest import REQUIRED, errors_in_threads, need

torch = need("torch")
fusebox_torch = need("fusebox.torch")
nn = torch.nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benches"))
from torch_modules import Block as GptBlock, Cell as LstmCell  # noqa: E402


def Block():
    return GptBlock(d=64, heads=4)


def Cell():
    return LstmCell(n=32)


class Sorted(nn.Module):
    """A fusible part, an op fusebox does not take (sort), and another fusible part."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x):
        y = torch.relu(self.a(x)) * 2.0
        y = torch.sort(y, dim=-1).values
        return torch.tanh(self.b(y - 0.5))


def small_cnn():
    """Conv, batch norm (eval), ReLU, max and average pooling, flatten, Linear."""
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
        nn.Linear(16 * 2 * 2, 10),
    )
    with torch.no_grad():
        cnn[1].running_mean.uniform_(-1, 1)
        cnn[1].running_var.uniform_(0.5, 2)
    return cnn


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))


def compare(module, *inputs, rtol=1e-5, atol=1e-5):
    """Eager against compiled: outputs, input gradients and parameter gradients. Each runs its
    forward and backward in turn (a module with state, such as batch norm's running
    statistics, changes it in the forward)."""
    fusebox_torch.reset_report()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="fusebox")
    results = []
    weights = None
    for engine in (module, compiled):
        module.zero_grad()
        given = [x.clone().requires_grad_(True) for x in inputs]
        out = engine(*given)
        out = out if isinstance(out, tuple) else (out,)
        if weights is None:
            weights = [torch.randn_like(o) for o in out]  # a loss that weighs every element
        sum((o * k).sum() for o, k in zip(out, weights)).backward()
        grads = [p.grad.clone() for p in module.parameters()] + [x.grad for x in given]
        results.append(([o.detach() for o in out], grads))
    (want, eager_grads), (got, fused_grads) = results
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    for w, g in zip(eager_grads, fused_grads):
        torch.testing.assert_close(g, w, rtol=rtol * 10, atol=atol * 10)
    return fusebox_torch.last_report()


def parts_ran(report):
    """The parts fusebox compiled and ran, over every graph of the report."""
    return [p for graph in report for p in graph["parts"] if any(c["kernels"] for c in p["compiled"])]


def test_an_mlp_runs_forward_and_backward_in_fusebox():
    torch.manual_seed(0)
    report = compare(mlp(), torch.randn(8, 32))
    assert len(report) == 2, "a forward and a backward graph"
    for graph in report:
        assert graph["left_in_pytorch"] == {}, graph["left_in_pytorch"]
        assert len(graph["parts"]) == 1
    assert len(parts_ran(report)) == 2


def test_an_lstm_cell_and_its_gradients_match_eager():
    torch.manual_seed(1)
    report = compare(Cell(), torch.randn(4, 32), torch.randn(4, 32), torch.randn(4, 32))
    assert len(parts_ran(report)) == 2


def test_a_gpt2_block_matches_eager_forward_and_backward():
    torch.manual_seed(2)
    report = compare(Block(), torch.randn(2, 8, 64), rtol=1e-4, atol=1e-4)
    forward = report[0]
    assert forward["left_in_pytorch"] == {}, forward["left_in_pytorch"]
    ops = set(parts_ran(report)[0]["nodes"])
    assert {"aten.native_layer_norm.default", "aten._softmax.default", "aten.bmm.default"} <= ops


def test_an_op_fusebox_does_not_take_stays_in_pytorch():
    torch.manual_seed(3)
    report = compare(Sorted(), torch.randn(6, 16))
    forward = report[0]
    left = forward["left_in_pytorch"]
    assert any("sort" in name for name in left), left
    assert all(reason for reason in left.values())
    assert len([p for p in forward["parts"] if any(c["kernels"] for c in p["compiled"])]) == 2


def test_a_cnn_runs_in_fusebox_for_inference_and_partly_for_training():
    torch.manual_seed(7)
    cnn = small_cnn().eval()
    x = torch.randn(2, 3, 16, 16)
    fusebox_torch.reset_report()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(cnn, backend="fusebox")(x), cnn(x), rtol=1e-5, atol=1e-5)
    (inference,) = fusebox_torch.last_report()
    assert inference["left_in_pytorch"] == {}, inference["left_in_pytorch"]
    ops = set(parts_ran([inference])[0]["nodes"])
    assert {"aten.convolution.default", "aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default"} <= ops
    # Training: batch norm's training form and the convolutions' and pools' backward stay in
    # PyTorch (with why); the rest runs in fusebox, and the gradients match eager.
    report = compare(small_cnn().train(), x)
    left = {k: v for graph in report for k, v in graph["left_in_pytorch"].items()}
    assert "aten.convolution_backward.default` has no entry" in left["convolution_backward"]
    assert "reads output 1" in left["max_pool2d_with_indices"]
    assert len(parts_ran(report)) >= 2


def test_a_new_shape_compiles_again_and_matches():
    torch.manual_seed(4)
    module = mlp()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="fusebox", dynamic=False)
    with torch.no_grad():
        for batch in (4, 8, 4):
            x = torch.randn(batch, 32)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)


def test_symbolic_sizes_compile_per_call_and_reuse_the_kernels(tmp_path, monkeypatch):
    # Without dynamic=False, Dynamo makes the batch and sequence sizes symbolic after the
    # first change: the graph is partitioned at its hints, and each part compiles per call
    # size. A fresh kernel cache shows the kernels are compiled once: the second size finds
    # them all on disk.
    monkeypatch.setenv("FUSEBOX_CACHE_DIR", str(tmp_path))
    torch.manual_seed(6)
    module = Block()
    fusebox_torch.reset_report()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="fusebox")
    with torch.no_grad():
        for batch, seq in ((2, 8), (3, 8), (4, 8), (2, 16)):
            x = torch.randn(batch, seq, 64)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-4)
    report = fusebox_torch.last_report()
    assert len(report) >= 2, "Dynamo compiled again with symbolic sizes"
    symbolic = report[1]
    assert all(not why.startswith("`aten") for why in symbolic["left_in_pytorch"].values())
    builds = [c["kernel_builds"] for p in parts_ran(report[1:]) for c in p["compiled"]]
    assert len(builds) >= 2, builds
    first = parts_ran(report[:1])[0]["compiled"][0]["kernel_builds"]
    assert first["compiled"] >= 1, first
    assert all(b["compiled"] == 0 and b["disk_hits"] >= 1 for b in builds), builds


def test_autocast_casts_are_kept_and_match_eager_autocast():
    torch.manual_seed(5)
    module = mlp()
    fusebox_torch.reset_report()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="fusebox")
    x = torch.randn(8, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = module(x), compiled(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    ops = [op for p in parts_ran(fusebox_torch.last_report()) for op in p["nodes"]]
    assert "aten._to_copy.default" in ops


def test_the_backend_is_registered_by_name():
    assert "fusebox" in torch._dynamo.list_backends()
    if REQUIRED:
        from importlib.metadata import entry_points

        names = [e.name for e in entry_points(group="torch_dynamo_backends")]
        assert "fusebox" in names, "pip install . registers the entry point"


def test_a_rule_directory_changes_what_fusebox_takes(tmp_path):
    # A user's aten.ron replaces the table: without an entry for relu, relu stays in PyTorch.
    table = (pathlib.Path(__file__).resolve().parents[2] / "rules/aten.ron").read_text()
    kept = [line for line in table.splitlines() if "aten.relu.default" not in line]
    (tmp_path / "aten.ron").write_text("\n".join(kept))
    torch.manual_seed(8)
    module = mlp()
    x = torch.randn(4, 32)
    for engine in ("cpu", "reference"):
        fusebox_torch.reset_report()
        torch._dynamo.reset()
        options = {"rules": str(tmp_path), "engine": engine}
        compiled = torch.compile(module, backend="fusebox", options=options)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
        (report,) = fusebox_torch.last_report()
        assert "no entry" in report["left_in_pytorch"]["relu"], report["left_in_pytorch"]
        entries = [c for p in report["parts"] for c in p["compiled"]]
        assert entries and all(c["refused"] is None for c in entries)
        # The reference engine runs the part unfused: it has no kernels to count.
        assert all((c["kernels"] is None) == (engine == "reference") for c in entries)


def test_the_engine_follows_the_tensors_devices():
    engine = fusebox_torch._engine
    cpu, gpu0, gpu1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert engine("auto", {cpu}) == "cpu" and engine("cpu", {cpu}) == "cpu"
    assert engine("auto", {gpu0}) == "cuda" and engine("cuda", {gpu1}) == "cuda"
    assert engine("cuda", {cpu}) is None and engine("cpu", {gpu0}) is None
    # Tensors spread over devices stay in PyTorch, and so do GPU tensors under the reference
    # engine (it evaluates on the host).
    assert engine("auto", {cpu, gpu0}) is None and engine("auto", {gpu0, gpu1}) is None
    assert engine("reference", {cpu}) == "reference" and engine("reference", {gpu0}) is None
    # A CPU module under engine "cuda" runs in PyTorch, and the report says why.
    fusebox_torch.reset_report()
    torch._dynamo.reset()
    module, x = mlp(), torch.randn(4, 32)
    compiled = torch.compile(module, backend="fusebox", options={"engine": "cuda"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x))
    refused = [c["refused"] for p in fusebox_torch.last_report()[0]["parts"] for c in p["compiled"]]
    assert refused and all("engine `cuda` does not run tensors on cpu" in r for r in refused), refused


def test_options_and_a_broken_table_are_refused_with_their_reason(tmp_path):
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option `speed` is not one of rules, engine"):
        torch.compile(mlp(), backend="fusebox", options={"speed": 11})(torch.randn(2, 32))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="engine `gpu` is not one of auto, cpu, cuda, reference"):
        torch.compile(mlp(), backend="fusebox", options={"engine": "gpu"})(torch.randn(2, 32))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="lt_epilogues `yes` is not True or False"):
        torch.compile(mlp(), backend="fusebox", options={"lt_epilogues": "yes"})(torch.randn(2, 32))
    # A CUDA option: parts on the CPU run as without it.
    torch._dynamo.reset()
    module, x = mlp(), torch.randn(4, 32)
    with torch.no_grad():
        got = torch.compile(module, backend="fusebox", options={"lt_epilogues": True})(x)
        torch.testing.assert_close(got, module(x))
    (tmp_path / "aten.ron").write_text('[Aten(op: "aten.relu.default", nodes: [Onnx(op: "Rectify", inputs: ["$self"])])]')
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"aten\.ron:1:\d+.*Rectify"):
        torch.compile(mlp(), backend="fusebox", options={"rules": str(tmp_path)})(torch.randn(2, 32))


class Classifier(nn.Module):
    """An embedding classifier trained with cross-entropy: mean pool, LayerNorm without a
    weight, SiLU, Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.ln = nn.LayerNorm(32, elementwise_affine=False)
        self.fc = nn.Linear(32, 10)

    def forward(self, ids, target):
        h = self.ln(self.emb(ids).mean(1))
        return torch.nn.functional.cross_entropy(self.fc(torch.nn.functional.silu(h)), target)


def test_a_cross_entropy_training_step_runs_in_fusebox_with_the_embeddings_gradient():
    torch.manual_seed(9)
    module = Classifier()
    ids, target = torch.randint(0, 100, (8, 5)), torch.randint(0, 10, (8,))
    fusebox_torch.reset_report()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="fusebox")
    loss = compiled(ids, target)
    loss.backward()
    fused = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    want = module(ids, target)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(fused, [p.grad for p in module.parameters()]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    forward, backward = fusebox_torch.last_report()
    assert forward["left_in_pytorch"] == {} and len(forward["parts"]) == 1
    # The embedding's gradient (an index_put with accumulation) is a ScatterND that adds.
    assert backward["left_in_pytorch"] == {}, backward["left_in_pytorch"]
    assert "aten.index_put.default" in parts_ran([backward])[0]["nodes"]


class TopTwoExperts(nn.Module):
    """A top-2 mixture-of-experts layer: the gate's two largest logits, softmaxed, scattered
    into a dense mask over the experts."""

    def __init__(self, d=16, experts=4):
        super().__init__()
        self.gate, self.experts = nn.Linear(d, experts), nn.Linear(d, experts * d)
        self.shape = (experts, d)

    def forward(self, x):
        logits = self.gate(x)
        weights, chosen = torch.topk(logits, 2, dim=-1)
        mask = torch.zeros_like(logits).scatter(-1, chosen, torch.softmax(weights, dim=-1))
        outs = self.experts(x).view(x.shape[0], *self.shape)
        return (outs * mask.unsqueeze(-1)).sum(1)


def test_a_top2_mixture_of_experts_runs_in_fusebox_forward_and_backward():
    torch.manual_seed(10)
    report = compare(TopTwoExperts(), torch.randn(8, 16))
    for graph in report:
        assert graph["left_in_pytorch"] == {}, graph["left_in_pytorch"]
    ops = {op for p in parts_ran(report) for op in p["nodes"]}
    assert {"aten.topk.default", "aten.scatter.src"} <= ops


def test_a_compiled_module_runs_from_several_threads():
    torch.manual_seed(11)
    module = mlp()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="fusebox")
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = module(x)
        compiled(x)

    def use():
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-5)

    errors = errors_in_threads(use, 2)
    assert not errors, errors
