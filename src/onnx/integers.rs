//! ONNX's integer semantics held exactly: an integer op computes in its input's type (Add
//! wraps, Div truncates, ReduceSum of i32 is i32). Integer Div, Mod and Pow on constants fold
//! here exactly; a node of the op table whose integer form would compute another dtype is
//! refused.

use super::fold::fits_folding;
use super::*;

/// The ONNX ops whose integer form the importer folds exactly in code when their inputs are
/// constants (the shape arithmetic exporters write: TorchScript's `chunk()` divides sizes).
pub(super) const INTEGER_FOLDS: [&str; 3] = ["Div", "Mod", "Pow"];

/// ONNX's integer `Div` or `Pow` of two elements of `dtype` (held as i64).
///
/// Div truncates toward zero, as ONNX Runtime's integer division does. Where the spec leaves
/// the quotient undefined, fusebox defines it as the conversion of the real quotient to
/// `dtype` (what its run-time form, a division in f64 cast back, gives): saturated to the
/// dtype's range, so `MIN / -1` is `MAX`, `x / 0` is `MAX` for `x > 0` and `MIN` for `x < 0`,
/// and `0 / 0` is 0. Pow is the exact power, wrapping to `dtype` as NumPy's integer power
/// does; a negative exponent has no integer result and is an error (NumPy refuses it too).
/// Mod takes the divisor's sign (Python's `%`, ONNX's default), or with `fmod` the dividend's
/// (C's `fmod`); `x mod 0` is 0, as NumPy gives it, and what the run-time form computes.
pub(super) fn integer_op(op: &str, fmod: bool, dtype: DType, x: i64, y: i64) -> Imports<i64> {
    let (min, max) = dtype.int_range().unwrap_or((i64::MIN, i64::MAX));
    Ok(match op {
        "Div" => match (x, y) {
            (0, 0) => 0,
            (x, 0) if x > 0 => max,
            (_, 0) => min,
            // The one quotient beyond the range: `MIN / -1`.
            (x, y) => x.checked_div(y).unwrap_or(max).clamp(min, max),
        },
        // `checked_rem` fails only for `MIN % -1`, whose remainder is 0.
        "Mod" => match (y, x.checked_rem(y).unwrap_or(0)) {
            (0, _) => 0,
            (y, r) if !fmod && r != 0 && (r < 0) != (y < 0) => r + y,
            (_, r) => r,
        },
        "Pow" => {
            let exponent = u64::try_from(y).map_err(|_| {
                ImportError::Unsupported(format!(
                    "{x} to the negative power {y} has no integer value"
                ))
            })?;
            crate::tensor::wrap_int(dtype, wrapping_pow(x, exponent))
        }
        other => {
            return Err(ImportError::Unsupported(format!(
                "`{other}` has no exact integer form here"
            )));
        }
    })
}

/// `base` to the power `exponent` in wrapping 64-bit arithmetic (square and multiply), whose
/// low 32 bits are the wrapping 32-bit power too.
pub(super) fn wrapping_pow(base: i64, mut exponent: u64) -> i64 {
    let (mut result, mut square) = (1i64, base);
    while exponent > 0 {
        if exponent & 1 == 1 {
            result = result.wrapping_mul(square);
        }
        square = square.wrapping_mul(square);
        exponent >>= 1;
    }
    result
}

impl Importer<'_> {
    /// A node of the op table, held to ONNX's integer semantics: ONNX computes an integer op
    /// exactly in its input's type (Add wraps, Div truncates, ReduceSum of i32 is i32). Integer
    /// Div and Pow on constants are folded here exactly; any other node whose integer input
    /// gives a result of another dtype than ONNX's (a float `div`, an i64 `sum`) is refused,
    /// naming the node and the dtypes, rather than computing a value ONNX would not.
    pub(super) fn table_node(
        &mut self,
        node: &NodeProto,
        attrs: &HashMap<String, Attr>,
        out: &str,
    ) -> Imports<Vec<Val>> {
        let integer = self
            .input(node, 0)?
            .map(|v| v.dtype())
            .filter(|d| d.category() == crate::dtype::Category::Integer);
        let Some(dtype) = integer else {
            return Ok(self.mapped(node, attrs, out)?.outputs);
        };
        if let Some(v) = self.fold_integer(node, dtype)? {
            return Ok(vec![v]);
        }
        let Mapped { outputs, casts } = self.mapped(node, attrs, out)?;
        if let Some(y) = outputs.first()
            && !casts
            && y.dtype() != dtype
            && y.dtype() != DType::Bool
        {
            return Err(ImportError::Unsupported(format!(
                "ONNX computes {op} on {dtype} exactly, in {dtype}, but fusebox's form of it ({table}) gives {got}: refused rather than computing another value{folds}",
                op = node.op_type,
                table = self.table.file,
                got = y.dtype(),
                folds = if INTEGER_FOLDS.contains(&node.op_type.as_str()) {
                    format!(" (integer {} on constants is folded exactly)", node.op_type)
                } else {
                    String::new()
                },
            )));
        }
        Ok(outputs)
    }

    /// Integer `Div`, `Mod` or `Pow` with constant inputs, computed exactly ([`integer_op`]); `None`
    /// for anything else (a run-time input, a float exponent, a result too big to fold).
    pub(super) fn fold_integer(&self, node: &NodeProto, dtype: DType) -> Imports<Option<Val>> {
        if !INTEGER_FOLDS.contains(&node.op_type.as_str()) || node.input.len() != 2 {
            return Ok(None);
        }
        let (Some(a), Some(b)) = (self.input(node, 0)?, self.input(node, 1)?) else {
            return Ok(None);
        };
        let (Some(a), Some(b)) = (a.constant(), b.constant()) else {
            return Ok(None);
        };
        if b.dtype.category() != crate::dtype::Category::Integer {
            return Ok(None);
        }
        let shape = crate::shape::broadcast(a.shape(), b.shape())?;
        if !fits_folding(&shape) {
            return Ok(None);
        }
        let (a, b) = (a.ints(), b.ints());
        let dim = ndarray::IxDyn(&shape);
        let (a, b) = (
            a.broadcast(dim.clone())
                .ok_or(ImportError::Internal("the inputs do not broadcast"))?,
            b.broadcast(dim)
                .ok_or(ImportError::Internal("the inputs do not broadcast"))?,
        );
        let fmod = node.attribute.iter().any(|a| a.name == "fmod" && a.i != 0);
        let mut values = Vec::with_capacity(a.len());
        for (&x, &y) in a.iter().zip(b.iter()) {
            values.push(integer_op(&node.op_type, fmod, dtype, x, y)?);
        }
        let t = Tensor::from_ints(dtype, &shape, values)
            .ok_or(ImportError::Internal("the shape does not fit"))?;
        Ok(Some(Val::Const(Rc::new(t), None)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Folded Mod against Python's `%` (the divisor's sign) and C's `fmod` (the dividend's),
    /// at the i64 extremes too: `MIN mod -1` is 0 and `x mod 0` is 0.
    #[test]
    fn folded_mod_takes_the_sign_onnx_asks_for() {
        let cases: [(i64, i64, i64, i64); 7] = [
            (7, 3, 1, 1),
            (-7, 3, 2, -1),
            (7, -3, -2, 1),
            (-7, -3, -1, -1),
            (i64::MIN, -1, 0, 0),
            (i64::MIN, 7, 6, -1),
            (5, 0, 0, 0),
        ];
        for (x, y, python, c) in cases {
            assert_eq!(
                integer_op("Mod", false, DType::I64, x, y).unwrap(),
                python,
                "{x} % {y}"
            );
            assert_eq!(
                integer_op("Mod", true, DType::I64, x, y).unwrap(),
                c,
                "fmod({x}, {y})"
            );
        }
    }
}
