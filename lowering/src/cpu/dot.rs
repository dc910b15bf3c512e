//! `dot`: operands read in place or packed (8x8 register transposes for transposed
//! ones), then register tiles of FMAs.

use super::*;

impl<'k> Emitter<'k> {
    /// `[M, K] x [K, N]`: operands read in place when their rows are dense (else copied
    /// row-major), then register tiles over the whole K of 6 rows x 16 columns (12 AVX2
    /// accumulators) or 8 x 32 (16 AVX-512 ones), with narrower tiles for the edges.
    pub(super) fn dot(
        &mut self,
        lhs: Value,
        rhs: Value,
        transpose_lhs: bool,
        transpose_rhs: bool,
    ) -> Val {
        let (lt, rt) = (self.ty(lhs).clone(), self.ty(rhs).clone());
        let swap = |v: Val| match v {
            Val::View(v) => Val::View(View {
                dims: v.dims.iter().map(|d| d.map(|d| 1 - d)).collect(),
                ..v
            }),
            Val::Iota(d) => Val::Iota(1 - d),
            other => other,
        };
        let (mut a, mut b) = (self.stored_val(lhs), self.stored_val(rhs));
        let (mut ashape, mut bshape) = (lt.shape.clone(), rt.shape.clone());
        if transpose_lhs {
            a = swap(a);
            ashape.reverse();
        }
        if transpose_rhs {
            b = swap(b);
            bshape.reverse();
        }
        let (m, k, n) = (ashape[0], ashape[1], bshape[1]);
        let a = match a {
            // The micro-kernel reads single elements of A: a view of dense rows will do,
            // and so will a transposed view of dense rows (its tile's rows for one k are
            // then adjacent in the buffer). 2-byte refs are widened into a copy once.
            Val::View(view)
                if !view.narrow() && (dense_rows(&view, k) || dense_transposed(&view, m)) =>
            {
                view
            }
            other => self.pack(&other, &TensorType::new(lt.dtype, ashape)),
        };
        let b = self.dot_rhs(b, &TensorType::new(rt.dtype, bshape));
        let float = lt.dtype.is_float();
        let out_dtype = if float { DType::F32 } else { DType::I32 };
        let c = self.alloc(&[m, n], out_dtype);
        let (tile_rows, lanes) = (self.registers.tile_rows(), self.registers.lanes());
        let rows_main = m / tile_rows * tile_rows;
        let cols_main = n / (lanes * TILE_VECTORS) * lanes * TILE_VECTORS;
        // (rows, cols, tile rows, vectors per tile row, lanes per vector)
        let mut tiles = vec![
            (
                (0, rows_main),
                (0, cols_main),
                tile_rows,
                TILE_VECTORS,
                lanes,
            ),
            (
                (rows_main, m),
                (0, cols_main),
                m - rows_main,
                TILE_VECTORS,
                lanes,
            ),
        ];
        // The right edge: columns of one register, then of 8 lanes, then scalars.
        let mut done = cols_main;
        for width in [lanes, LANES, 1] {
            let end = n / width * width;
            if end > done {
                tiles.push(((0, m), (done, end), 1, 1, width));
                done = end;
            }
        }
        for ((r0, r1), (c0, c1), rows, vectors, width) in tiles {
            if r0 < r1 && c0 < c1 {
                self.dot_tiles(
                    (r0, r1),
                    (c0, c1),
                    (rows, vectors, width),
                    k,
                    &a,
                    &b,
                    &c,
                    float,
                );
            }
        }
        Val::View(c)
    }

    /// The dot's right operand as a view whose rows are contiguous f32 (the micro-kernel
    /// loads 8 consecutive elements of a row): read in place, transposed by 8x8 register
    /// blocks, or copied (2-byte refs always: the copy widens them).
    fn dot_rhs(&mut self, b: Val, ty: &TensorType) -> View {
        match b {
            Val::View(view) if view.narrow() => self.pack(&Val::View(view), ty),
            Val::View(view) if dense_rows(&view, ty.shape[1]) => view,
            Val::View(view) if transposed_2d(&view) && ty.shape.iter().all(|d| d % LANES == 0) => {
                self.pack_transposed(&view, ty)
            }
            other => self.pack(&other, ty),
        }
    }

    /// Copies a 2-D view that reads its buffer transposed into a fresh row-major buffer,
    /// 8x8 blocks at a time: 8 row loads, a register transpose (unpack, shuffle, lane
    /// swap: 24 shuffles), 8 row stores. Both dims are multiples of 8.
    fn pack_transposed(&mut self, src: &View, ty: &TensorType) -> View {
        let out = self.alloc(&ty.shape, ty.dtype);
        let t = lanes_of(storage(ty.dtype), LANES);
        let (zero, step) = (self.index(0), self.index(LANES));
        let (rows, cols) = (self.index(ty.shape[0]), self.index(ty.shape[1]));
        let a0 = self.open_for(&zero, &rows, &step);
        let b0 = self.open_for(&zero, &cols, &step);
        // Source row `r` holds R[a0..a0+8, b0+r].
        let mut v: Vec<String> = (0..LANES)
            .map(|r| {
                let o = self.index(r);
                let b = self.add_index(&b0, &o);
                let lane = Lane {
                    idx: vec![a0.clone(), b],
                    width: LANES,
                };
                let ix = self.view_indices(src, &lane, 0).join(", ");
                self.assign(&format!(
                    "vector.load {}[{ix}] : {}, {t}",
                    src.mem, src.mem_type
                ))
            })
            .collect();
        let stages: [TransposeStage; 3] = [
            (
                &[(0, 1), (2, 3), (4, 5), (6, 7)],
                [0, 8, 1, 9, 4, 12, 5, 13],
                [2, 10, 3, 11, 6, 14, 7, 15],
            ),
            (
                &[(0, 2), (1, 3), (4, 6), (5, 7)],
                [0, 1, 8, 9, 4, 5, 12, 13],
                [2, 3, 10, 11, 6, 7, 14, 15],
            ),
            (
                &[(0, 4), (1, 5), (2, 6), (3, 7)],
                [0, 1, 2, 3, 8, 9, 10, 11],
                [4, 5, 6, 7, 12, 13, 14, 15],
            ),
        ];
        // Stages 1 and 2 put pair k's results in slots 2k, 2k+1; stage 3 puts pair
        // (x, y)'s in x and y, leaving column i of the block in slot i.
        for (stage, (pairs, lo, hi)) in stages.iter().enumerate() {
            let mut next = v.clone();
            for (k, &(x, y)) in pairs.iter().enumerate() {
                let list =
                    |m: &[u64; 8]| m.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
                let l = self.assign(&format!(
                    "vector.shuffle {}, {} [{}] : {t}, {t}",
                    v[x],
                    v[y],
                    list(lo)
                ));
                let h = self.assign(&format!(
                    "vector.shuffle {}, {} [{}] : {t}, {t}",
                    v[x],
                    v[y],
                    list(hi)
                ));
                let (dl, dh) = if stage < 2 {
                    (2 * k, 2 * k + 1)
                } else {
                    (x, y)
                };
                next[dl] = l;
                next[dh] = h;
            }
            v = next;
        }
        for (i, row) in v.iter().enumerate() {
            let o = self.index(i as u64);
            let a = self.add_index(&a0, &o);
            self.line(&format!(
                "vector.store {row}, {}[{a}, {b0}] : {}, {t}",
                out.mem, out.mem_type
            ));
        }
        self.close();
        self.close();
        out
    }

    /// Register tiles of `rows x (vectors * width)` over `rows x cols` of `c = a b`.
    #[allow(clippy::too_many_arguments)]
    fn dot_tiles(
        &mut self,
        (r0, r1): (u64, u64),
        (c0, c1): (u64, u64),
        (rows, vectors, width): (u64, u64, u64),
        k: u64,
        a: &View,
        b: &View,
        c: &View,
        float: bool,
    ) {
        let elem = if float { "f32" } else { "i32" };
        let t = lanes_of(elem, width);
        let (lo, hi, step) = (self.index(r0), self.index(r1), self.index(rows));
        let i = self.open_for(&lo, &hi, &step);
        let (lo, hi, step) = (self.index(c0), self.index(c1), self.index(vectors * width));
        let j = self.open_for(&lo, &hi, &step);
        let row: Vec<String> = (0..rows)
            .map(|r| {
                let o = self.index(r);
                self.add_index(&i, &o)
            })
            .collect();
        let col: Vec<String> = (0..vectors)
            .map(|v| {
                let o = self.index(v * width);
                self.add_index(&j, &o)
            })
            .collect();
        let zero = self.literal(if float { DType::F32 } else { DType::I32 }, 0.0, width);
        let count = (rows * vectors) as usize;
        let accs: Vec<String> = (0..count).map(|_| self.w.fresh()).collect();
        let res = self.w.fresh();
        let (k0, k1, one) = (self.index(0), self.index(k), self.index(1));
        let kv = self.w.fresh();
        let iter_args = accs
            .iter()
            .map(|a| format!("{a} = {zero}"))
            .collect::<Vec<_>>()
            .join(", ");
        let types = vec![t.clone(); count].join(", ");
        self.line(&format!(
            "{res}:{count} = scf.for {kv} = {k0} to {k1} step {one} iter_args({iter_args}) -> ({types}) {{"
        ));
        self.w.indent += 1;
        let bvec: Vec<String> = col
            .iter()
            .map(|cj| {
                let lane = Lane {
                    idx: vec![kv.clone(), cj.clone()],
                    width,
                };
                let ix = self.view_indices(b, &lane, 0).join(", ");
                if width == 1 {
                    self.assign(&format!("memref.load {}[{ix}] : {}", b.mem, b.mem_type))
                } else {
                    self.assign(&format!(
                        "vector.load {}[{ix}] : {}, {t}",
                        b.mem, b.mem_type
                    ))
                }
            })
            .collect();
        let mut next = Vec::new();
        for (r, ri) in row.iter().enumerate() {
            let lane = Lane {
                idx: vec![ri.clone(), kv.clone()],
                width: 1,
            };
            let ix = self.view_indices(a, &lane, 0).join(", ");
            let s = self.assign(&format!("memref.load {}[{ix}] : {}", a.mem, a.mem_type));
            let av = if width == 1 {
                s
            } else {
                self.assign(&format!("vector.broadcast {s} : {elem} to {t}"))
            };
            for (v, bv) in bvec.iter().enumerate() {
                let acc = &accs[r * vectors as usize + v];
                next.push(if float {
                    self.assign(&format!("math.fma {av}, {bv}, {acc} : {t}"))
                } else {
                    let p = self.assign(&format!("arith.muli {av}, {bv} : {t}"));
                    self.assign(&format!("arith.addi {acc}, {p} : {t}"))
                });
            }
        }
        self.line(&format!("scf.yield {} : {types}", next.join(", ")));
        self.close();
        for (r, ri) in row.iter().enumerate() {
            for (v, cj) in col.iter().enumerate() {
                let acc = format!("{res}#{}", r * vectors as usize + v);
                if width == 1 {
                    self.line(&format!(
                        "memref.store {acc}, {}[{ri}, {cj}] : {}",
                        c.mem, c.mem_type
                    ));
                } else {
                    self.line(&format!(
                        "vector.store {acc}, {}[{ri}, {cj}] : {}, {t}",
                        c.mem, c.mem_type
                    ));
                }
            }
        }
        self.close();
        self.close();
    }
}

/// One stage of the 8x8 transpose: the register pairs it combines and the shuffle masks
/// of the two results of each pair.
type TransposeStage = (&'static [(usize, usize)], [u64; 8], [u64; 8]);

/// Whether a 2-D view's rows are `cols` consecutive elements of its buffer, one
/// buffer row each: the micro-kernel reads it in place. A window of a wider array is
/// copied instead (rows a page apart thrash the L1 sets and the TLB).
fn dense_rows(v: &View, cols: u64) -> bool {
    v.dims.last() == Some(&Some(1)) && v.shape.last() == Some(&cols)
}

/// Whether a 2-D view reads a buffer of `rows`-element rows transposed (its value is
/// `[rows, ...]`, each buffer row one column of it).
fn dense_transposed(v: &View, rows: u64) -> bool {
    transposed_2d(v) && v.shape.last() == Some(&rows)
}

/// Whether a 2-D value reads its buffer transposed: the buffer's last dim is the value's
/// first, the one before it the value's second, and no other buffer dim moves.
fn transposed_2d(v: &View) -> bool {
    let n = v.dims.len();
    n >= 2
        && v.dims[n - 1] == Some(0)
        && v.dims[n - 2] == Some(1)
        && v.dims[..n - 2].iter().all(Option::is_none)
}
