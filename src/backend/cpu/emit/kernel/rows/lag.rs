//! A last pass that runs one row late ([`Lag`]): the pass before it stores the pending row
//! as it goes, so that a row's store traffic overlaps the next row's arithmetic.
use super::{CKernelWriter, Lag, Out};
use crate::backend::cpu::emit::expr::C;
use crate::backend::cpu::emit::vector;
use crate::backend::spelling::Spelling;
use crate::lower::ir::{Instr, Prec, RowKept};

impl CKernelWriter<'_> {
    /// The [`Lag`] of this kernel, if its last pass can run one row late: the kernel runs
    /// vector loops, carries values in a row scratch, has at least two passes, and its last
    /// pass stores every element, reduces nothing and needs no load (only carried values, row
    /// constants and literals).
    pub(super) fn lag(&self, carried: &[RowKept]) -> Option<Lag> {
        let ir = self.ir;
        let passes = ir.passes();
        if !self.vector || carried.is_empty() || passes < 2 {
            return None;
        }
        let pass = self.plan(passes - 1);
        if !pass.reducing.is_empty() || pass.looped.is_empty() {
            return None;
        }
        // The pending row is stored by the steps of the pass before the last, which must
        // have a loop to run them in.
        if self.plan(passes - 2).reads.is_empty() {
            return None;
        }
        let lp = self.pass_loop(&pass, carried, true);
        // (A select along the rows names its element from the row's start, which a pending
        // row stored after the thread's rows does not have: such a last pass does not lag.)
        let loads = lp.needed.iter().any(|&id| {
            !lp.stop[id]
                && matches!(
                    ir.body[id],
                    Instr::Load { .. }
                        | Instr::RangeLoad { .. }
                        | Instr::GatherLoad { .. }
                        | Instr::Select { .. }
                )
        });
        if loads {
            return None;
        }
        let reciprocals = self.ir.row_constant_divisors();
        let mut names = Vec::new();
        for &id in &lp.needed {
            if let Instr::RowReduce { dtype, .. } = ir.body[id] {
                names.push((C.value_type(Prec::of(dtype)), format!("r{id}")));
            }
            if reciprocals[id].is_some() {
                names.push(("float", format!("rc{id}")));
                names.push(("int", format!("rk{id}")));
            }
        }
        for &k in &pass.looped {
            names.push(("int64_t", format!("b{}", self.ir.store_arg(k))));
            if self.outer_guard(k).is_some() {
                names.push(("int", format!("ok{k}")));
            }
        }
        drop(lp);
        Some(Lag {
            pass,
            carried: carried.to_vec(),
            names,
            shared: carried
                .iter()
                .filter(|k| k.read_in.contains(&(passes - 1)))
                .all(|k| k.saved_in + 2 == passes),
        })
    }

    /// The pending row's names in a new scope: its row constants, bases and guards, and its
    /// scratch row `pc{id}` as `c{id}`.
    pub(super) fn rebind(&self, out: &mut Out, lag: &Lag) {
        for (ty, name) in &lag.names {
            out.line(format!("const {ty} {name} = l_{name};"));
        }
        for id in lag.carried.iter().map(|k| k.value) {
            out.line(format!("const {} *c{id} = pc{id};", self.value_type(id)));
        }
    }

    /// The last pass's place in a lagging row with a scratch row: the row becomes the pending
    /// one, and the thread's next row takes the other scratch row.
    pub(super) fn hand_over(&self, out: &mut Out, lag: &Lag) {
        for (_, name) in &lag.names {
            out.line(format!("l_{name} = {name};"));
        }
        out.line("#if defined(FB_AVX512)");
        out.open("");
        self.destinations(out, &lag.pass.looped, true);
        out.line("l_st = st;");
        out.close();
        out.line("#endif");
        out.line("pend = 1;");
        if lag.shared {
            return;
        }
        for id in lag.carried.iter().map(|k| k.value) {
            let ty = self.value_type(id);
            out.line(format!(
                "{{ {ty} *t = c{id}; c{id} = pc{id}; pc{id} = t; }}"
            ));
        }
    }

    /// Inside a vector loop at `j`: the pending row's vector at `j`, if there is one.
    pub(super) fn flush_step(&self, out: &mut Out, flush: Option<&Lag>) {
        let Some(lag) = flush else { return };
        out.open("if (pend)");
        self.flush_vector(out, lag);
        out.close();
    }

    /// The last pass's vector step at `j` for the pending row.
    pub(super) fn flush_vector(&self, out: &mut Out, lag: &Lag) {
        self.rebind(out, lag);
        for &k in &lag.pass.looped {
            let arg = self.ir.store_arg(k);
            out.line(format!(
                "{} *d{k} = p{arg} + b{arg};",
                C.storage_type(self.ir.stores[k].view.dtype)
            ));
        }
        out.line("const int st = l_st;");
        let lp = self.pass_loop(&lag.pass, &lag.carried, true);
        self.vector_step(out, &lp, &[], 0);
    }

    /// The pending row's elements from `jv` to its end (all of them without AVX-512), then
    /// the fence of its streaming stores.
    pub(super) fn flush_tail(&self, out: &mut Out, lag: &Lag) {
        out.open("");
        self.rebind(out, lag);
        let lp = self.pass_loop(&lag.pass, &lag.carried, true);
        self.scalar_loop(out, &lp, "jv");
        out.close();
        out.line("#if defined(FB_AVX512)");
        out.line("if (l_st) _mm_sfence();");
        out.line("#endif");
    }

    /// After a thread's rows: its last pending row, whole.
    pub(super) fn flush_last(&self, out: &mut Out, lag: &Lag) {
        out.open("if (pend)");
        out.line("const int64_t len = inner;");
        out.line("#if defined(FB_AVX512)");
        out.line(format!("const int64_t jv = len - len % {};", vector::LANES));
        out.open(format!(
            "for (int64_t j = 0; j < jv; j += {})",
            vector::LANES
        ));
        self.flush_vector(out, lag);
        out.close();
        out.line("#else");
        out.line("const int64_t jv = 0;");
        out.line("#endif");
        self.flush_tail(out, lag);
        out.close();
    }
}
