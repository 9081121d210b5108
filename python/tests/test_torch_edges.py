"""Where fusers break, through `torch.compile(..., backend="fusebox")` against eager: broadcasting
and [N, 1] shapes, transposes and slices, size-1 and size-0 axes, f16/bf16, NaN and Inf,
integer arithmetic at its edges, several outputs, reductions. Each case is a small function;
inputs are seeded, and every case checks that fusebox ran a part (not only PyTorch)."""

import math

import pytest

from conftest import need

torch = need("torch")
fusebox_torch = need("fusebox.torch")


def run_case(fn, *inputs, rtol=1e-5, atol=1e-6):
    fusebox_torch.reset_report()
    torch._dynamo.reset()
    want = fn(*inputs)
    got = torch.compile(fn, backend="fusebox", dynamic=False)(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
    ran = [c for graph in fusebox_torch.last_report() for p in graph["parts"] for c in p["compiled"] if c["kernels"]]
    assert ran, f"fusebox ran nothing: {fusebox_torch.last_report()}"


g = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def test_broadcasting_column_and_row_vectors():
    run_case(lambda a, b, c: torch.tanh(a * b + c) - a, rand(5, 1), rand(1, 7), rand(7))


def test_transposes_and_strided_slices():
    run_case(lambda x, y: torch.sigmoid(x.t()[:, 1::2] * 2.0) + y[::3], rand(6, 9), rand(27, 3))


def test_size_one_and_size_zero_axes():
    run_case(lambda x: (torch.exp(x) * 0.5).sum(dim=1, keepdim=True) + x, rand(4, 1, 3))
    run_case(lambda x, y: (torch.relu(x) + 1.0, y * 2.0 + 1.0), rand(0, 5), rand(3, 5))


def test_half_and_bfloat16_round_like_eager():
    for dtype in (torch.float16, torch.bfloat16):
        x, y = rand(8, 16, dtype=dtype), rand(16, dtype=dtype)
        run_case(lambda a, b: torch.nn.functional.gelu(a + b) * b, x, y, rtol=1e-2, atol=1e-2)


def test_nan_and_inf_propagate():
    x = torch.tensor([[0.0, -1.0, float("nan"), float("inf")], [float("-inf"), 2.0, 3.0, -0.0]])
    y = torch.tensor([1.0, float("nan"), 0.5, float("-inf")])
    run_case(lambda a, b: (torch.maximum(a, b), torch.relu(a), torch.clamp(a, -1.0, 1.0), a.amax(dim=1)), x, y)


def test_masked_fill_with_infinity_and_softmax():
    scores = rand(2, 4, 6, 6)
    mask = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    run_case(lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1), scores, mask)


def test_integer_arithmetic_and_comparisons():
    big = torch.tensor([2**62, -(2**62), 7, -7, 0], dtype=torch.int64)
    other = torch.tensor([3, 5, -2, 2, 1], dtype=torch.int64)
    run_case(lambda a, b: (a + b, a * 2, a - b, a > b, (a == b) | (a < 0)), big, other)
    small = torch.tensor([100, -128, 127, 5], dtype=torch.int8)
    run_case(lambda a: (a + 100, a * 3), small)


def test_true_division_of_integers_gives_floats():
    a = torch.tensor([7, -7, 1, 0], dtype=torch.int32)
    b = torch.tensor([2, 2, 3, 5], dtype=torch.int32)
    run_case(lambda x, y: x / y + 0.5, a, b)


def test_several_outputs_and_reductions():
    x = rand(4, 6, 8)
    run_case(lambda a: (a.sum(dim=(0, 2)), a.mean(dim=-1), a.amin(dim=1), torch.log_softmax(a, dim=1)), x, rtol=1e-5, atol=1e-5)


def test_matmuls_with_transposed_and_batched_operands():
    a, b, c = rand(3, 5, 4), rand(3, 6, 4), rand(6)
    run_case(lambda x, y, z: torch.relu(x @ y.transpose(1, 2) + z), a, b, c, rtol=1e-5, atol=1e-5)
    run_case(lambda x, w, bias: torch.nn.functional.linear(x, w, bias) * 0.5, rand(7, 4), rand(3, 4), rand(3))


def test_embeddings_and_gathers_with_run_time_indices():
    table, ids = rand(10, 4), torch.tensor([[1, 9, 0], [3, 3, 2]])
    run_case(lambda t, i: torch.nn.functional.embedding(i, t).mean(dim=1), table, ids)
    logits, target = rand(5, 7), torch.tensor([0, 6, 3, 3, 1])
    run_case(lambda x, y: torch.gather(torch.log_softmax(x, dim=1), 1, y[:, None]).squeeze(1), logits, target)


def test_concat_and_split():
    x, h = rand(4, 3), rand(4, 5)
    run_case(lambda a, b: torch.cat([torch.sin(a), b * 2.0], dim=1).split([2, 6], dim=1), x, h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_and_its_statistics(dtype):
    x, w, b = rand(3, 5, 8, dtype=dtype), rand(8, dtype=dtype), rand(8, dtype=dtype)
    run_case(lambda a, c, d: torch.nn.functional.layer_norm(a, (8,), c, d, 1e-5) * 2.0, x, w, b, rtol=1e-5, atol=1e-5)
