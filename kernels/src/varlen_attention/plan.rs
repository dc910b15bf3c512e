//! The host's part of varlen attention: the offsets checked and turned into per-row key
//! spans and per-tile ranges (the kernels' SMEM tables).

use super::VarlenConfig;
use kernel_ir::Array;

use crate::BoxError;

/// What the kernels need to know of the offsets, computed on the host: per query row the
/// packed keys `[first, end)` it may see, and the tiles each program visits.
#[derive(Clone, Debug, PartialEq)]
pub struct VarlenPlan {
    /// First key each query row sees (`[total_q, 1]`).
    pub q_first: Vec<i32>,
    /// One past the last key each query row sees (`first == end`: none).
    pub q_end: Vec<i32>,
    /// Per query tile `(first, from, to, end)` key tiles (`[q tiles, 4]`): its rows see
    /// keys of tiles `first..end`, and every key of the full tiles `from..to`, which need
    /// no mask (`first <= from <= to <= end`).
    pub q_tiles: Vec<i32>,
    /// Per key tile `(first query tile, end query tile)` (`[key tiles, 2]`).
    pub k_tiles: Vec<i32>,
}

impl VarlenPlan {
    pub(super) fn new(c: &VarlenConfig, cu_q: &[i32], cu_k: &[i32]) -> Result<Self, String> {
        check_cu_seqlens("cu_seqlens_q", cu_q, c.batch, c.total_q)?;
        check_cu_seqlens("cu_seqlens_k", cu_k, c.batch, c.total_k)?;
        let mut q_first = Vec::with_capacity(c.total_q as usize);
        let mut q_end = Vec::with_capacity(c.total_q as usize);
        for b in 0..c.batch as usize {
            let (k_start, k_len) = (cu_k[b], cu_k[b + 1] - cu_k[b]);
            for pos in 0..cu_q[b + 1] - cu_q[b] {
                let seen = if c.causal { k_len.min(pos + 1) } else { k_len };
                q_first.push(k_start);
                q_end.push(k_start + seen);
            }
        }
        let (bq, bk) = (c.block_q as usize, c.block_k as i32);
        let full_tiles = (c.total_k / c.block_k) as i32;
        let mut q_tiles = Vec::with_capacity(4 * c.q_tiles() as usize);
        let mut k_tiles = vec![[i32::MAX, 0]; c.k_tiles() as usize];
        for (tile, rows) in q_first.chunks(bq).zip(q_end.chunks(bq)).enumerate() {
            // Spans are non-decreasing along the packed axis: the tile's keys run from
            // its first non-empty row's first key to its last row's end.
            let seen = rows.0.iter().zip(rows.1).filter(|(f, e)| e > f);
            let (lo, hi) = seen.fold((i32::MAX, 0), |(lo, hi), (&f, &e)| (lo.min(f), hi.max(e)));
            let (lo, hi) = if hi > 0 {
                (lo / bk, (hi + bk - 1) / bk)
            } else {
                (0, 0)
            };
            // Every row sees keys from the last row's first to the first row's end.
            let (last_first, first_end) = (rows.0[rows.0.len() - 1], rows.1[0]);
            let from = ((last_first + bk - 1) / bk).min(full_tiles).clamp(lo, hi);
            let to = (first_end / bk).min(full_tiles).clamp(from, hi);
            q_tiles.extend([lo, from, to, hi]);
            for k in &mut k_tiles[lo as usize..hi as usize] {
                *k = [k[0].min(tile as i32), tile as i32 + 1];
            }
        }
        let k_tiles = k_tiles
            .into_iter()
            .flat_map(|[lo, hi]| if hi > 0 { [lo, hi] } else { [0, 0] })
            .collect();
        Ok(VarlenPlan {
            q_first,
            q_end,
            q_tiles,
            k_tiles,
        })
    }

    /// The plan as kernel inputs: the query spans, the query tile table and the key tile
    /// table (`[q_first, q_end, q_tiles, k_tiles]`).
    pub(super) fn arrays(self, c: &VarlenConfig) -> Result<[Array; 4], BoxError> {
        Ok([
            Array::from_i32([c.total_q, 1], self.q_first)?,
            Array::from_i32([c.total_q, 1], self.q_end)?,
            Array::from_i32([c.q_tiles(), 4], self.q_tiles)?,
            Array::from_i32([c.k_tiles(), 2], self.k_tiles)?,
        ])
    }
}

/// Checks `batch + 1` offsets into `total` packed tokens: they start at 0, never
/// decrease and end at `total`. The error names the first bad entry.
pub fn check_cu_seqlens(name: &str, cu: &[i32], batch: u64, total: u64) -> Result<(), String> {
    if cu.len() as u64 != batch + 1 {
        return Err(format!(
            "{name} has {} entries: expected batch + 1 = {}",
            cu.len(),
            batch + 1
        ));
    }
    if cu[0] != 0 {
        return Err(format!(
            "{name}[0] = {}: the offsets must start at 0",
            cu[0]
        ));
    }
    if let Some(i) = (1..cu.len()).find(|&i| cu[i] < cu[i - 1]) {
        return Err(format!(
            "{name}[{i}] = {} is below {name}[{}] = {}: the offsets must not decrease",
            cu[i],
            i - 1,
            cu[i - 1]
        ));
    }
    let last = cu[cu.len() - 1];
    if last as i64 != total as i64 {
        return Err(format!(
            "{name}[{}] = {last}: the last offset must be the {total} packed tokens",
            cu.len() - 1
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::super::{for_each_query, offsets, PARAMS};
    use super::*;
    use crate::Params;

    /// On random offsets, every key a row sees lies in its tile's range, and every key of
    /// the tiles said to need no mask is seen by every row of the tile.
    #[test]
    fn plans_cover_what_rows_see_and_skip_masks_only_where_all_see_all() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..300 {
            let batch = rng.gen_range(1..=5u64);
            let total_q = rng.gen_range(1..=60u64);
            let total_k = rng.gen_range(1..=60u64);
            let pairs = [
                ("batch", batch.to_string()),
                ("total_q", total_q.to_string()),
                ("total_k", total_k.to_string()),
                ("block_q", rng.gen_range(1..=16u64).to_string()),
                ("block_k", rng.gen_range(1..=16u64).to_string()),
                ("causal", (case % 2 == 0).to_string()),
            ];
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let c = VarlenConfig::from_params(&Params::with(PARAMS, &pairs).unwrap()).unwrap();
            let inputs = c.qkv_and_offsets(case).unwrap();
            let (cu_q, cu_k) = offsets(&inputs).unwrap();
            let plan = c.plan(cu_q, cu_k).unwrap();
            let (bq, bk) = (c.block_q as usize, c.block_k as usize);
            let full_tiles = c.total_k as usize / bk;
            let mut sees = vec![Vec::new(); c.total_q as usize];
            for_each_query(&c, cu_q, cu_k, |i, _, keys| sees[i] = keys.collect());
            for (tile, t) in plan.q_tiles.chunks(4).enumerate() {
                let [lo, from, to, hi] = [t[0], t[1], t[2], t[3]].map(|x| x as usize);
                assert!(
                    lo <= from && from <= to && to <= hi && to <= full_tiles,
                    "{pairs:?} {t:?}"
                );
                let rows = tile * bq..((tile + 1) * bq).min(c.total_q as usize);
                for i in rows.clone() {
                    let span: Vec<usize> = (plan.q_first[i]..plan.q_end[i])
                        .map(|j| j as usize)
                        .collect();
                    assert_eq!(span, sees[i], "{pairs:?} row {i}");
                    assert!(
                        sees[i].iter().all(|&j| (lo * bk..hi * bk).contains(&j)),
                        "{pairs:?}"
                    );
                    assert!(
                        (from * bk..to * bk).all(|j| sees[i].contains(&j)),
                        "{pairs:?} {t:?} row {i}"
                    );
                    // The backward's key tiles list this query tile for every key it sees.
                    for &j in &sees[i] {
                        let k = &plan.k_tiles[2 * (j / bk)..][..2];
                        assert!(
                            (k[0] as usize..k[1] as usize).contains(&tile),
                            "{pairs:?} key {j}"
                        );
                    }
                }
            }
        }
    }
}
