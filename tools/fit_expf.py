"""Fits the polynomial of the CPU backend's inline f32 exp (`EXPF` in src/backend/cpu/emit.rs).

e^r = 1 + r + r^2 q(r) on |r| <= ln2/2 (plus a margin for the rounding of the reduction), with
q of degree 4 chosen to minimise the maximum relative error of e^r - 1 = r + r^2 q(r): tanh uses
that expm1 directly, and a bound on it also bounds the relative error of e^r (by about half). Lawson's algorithm:
weighted least squares on Chebyshev nodes, the weights multiplied by the error each round, which
converges to the minimax (equioscillating) fit. Prints the error and the coefficients rounded to
f32 as C hex literals. Needs numpy.

    python3 tools/fit_expf.py
"""
import numpy as np

HALF_LN2 = 0.5 * np.log(2.0) * 1.001
DEGREE = 4

r = np.cos(np.linspace(0.0, np.pi, 20001)) * HALF_LN2
small = np.abs(r) < 1e-6
target = np.where(small, 0.5 + r / 6.0, (np.expm1(r) - r) / np.where(small, 1.0, r) ** 2)
em1 = np.where(small, 1.0, np.expm1(r))
scale = np.where(small, np.abs(r), r**2 / em1)  # relative error of e^r - 1 per unit error of q
basis = np.vstack([r**k for k in range(DEGREE + 1)]).T
weights = np.ones_like(r)
for _ in range(200):
    w = np.sqrt(weights) * scale
    coef, *_ = np.linalg.lstsq(basis * w[:, None], target * w, rcond=None)
    err = np.abs((basis @ coef - target) * scale)
    weights *= err / np.sum(weights * err) * len(r)
exp_err = np.abs((basis @ coef - target) * r**2 / np.exp(r))
print(f"max relative error of e^r - 1: {err.max():.3e} (2^{np.log2(err.max()):.1f})")
print(f"max relative error of e^r: {exp_err.max():.3e} (2^{np.log2(exp_err.max()):.1f})")
for k, c in enumerate(coef):
    mantissa, exponent = float(np.float32(c)).hex().split("p")
    print(f"r^{k + 2}: {mantissa.rstrip('0')}p{exponent}f  ({float(c)!r})")
