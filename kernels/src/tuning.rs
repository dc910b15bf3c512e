//! What the autotuner may choose: each kernel's block-size parameters and the values
//! worth trying for a problem ([`search_space`]). Timing and the persistent store live
//! with the runtime and the CLI (`tessera tune`).

use crate::{LibraryKernel, ParamError, Params};

/// A parameter the tuner may choose (a block size), with the values it tries.
#[derive(Clone, Copy, Debug)]
pub struct Tunable {
    /// The parameter's name.
    pub name: &'static str,
    /// Values to try, ascending.
    pub values: &'static [u64],
    /// The size parameter this block tiles, or several: the first set to a number is
    /// used (varlen's `total_k` defaults to `total_q`). Values past the first one that
    /// covers the whole size are skipped (they only add padding).
    pub tiles: &'static [&'static str],
}

impl Tunable {
    /// The values worth trying for `p`, ascending, always including `p`'s own value.
    pub fn candidates(&self, p: &Params) -> Vec<u64> {
        let size = self
            .tiles
            .iter()
            .find_map(|t| p.get(t).and_then(|v| v.as_int()));
        let mut out = Vec::new();
        for &v in self.values {
            out.push(v);
            if size.is_some_and(|s| v >= s) {
                break;
            }
        }
        if let Some(current) = p.get(self.name).and_then(|v| v.as_int()) {
            if !out.contains(&current) {
                out.push(current);
                out.sort_unstable();
            }
        }
        out
    }
}

/// One point of a search space: a value per tunable parameter.
pub type Candidate = Vec<(&'static str, u64)>;

/// Every combination of `k`'s tunable values for problem `p`, `p`'s own values first
/// (so the defaults are always measured), then in ascending order. Empty when the kernel
/// has nothing to tune.
pub fn search_space(k: &dyn LibraryKernel, p: &Params) -> Result<Vec<Candidate>, ParamError> {
    let tunables = k.tunables();
    if tunables.is_empty() {
        return Ok(Vec::new());
    }
    let mut space: Vec<Candidate> = vec![Vec::new()];
    for t in tunables {
        let values = t.candidates(p);
        space = space
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |&v| {
                    let mut c = c.clone();
                    c.push((t.name, v));
                    c
                })
            })
            .collect();
    }
    let current = current(k, p)?;
    space.retain(|c| *c != current);
    space.insert(0, current);
    Ok(space)
}

/// `p`'s values of `k`'s tunable parameters.
pub fn current(k: &dyn LibraryKernel, p: &Params) -> Result<Candidate, ParamError> {
    k.tunables()
        .iter()
        .map(|t| Ok((t.name, p.dim(t.name)?)))
        .collect()
}

/// The problem a configuration is tuned for: `p` without `k`'s tunable parameters.
pub fn problem(k: &dyn LibraryKernel, p: &Params) -> String {
    let names: Vec<&str> = k.tunables().iter().map(|t| t.name).collect();
    p.without(&names)
}

/// Sets the tuned `config` (`name=value` pairs) on `p`, except the parameters named in
/// `explicit` (the caller chose those). Returns the pairs applied; unknown or
/// non-tunable names are skipped.
pub fn apply(
    k: &dyn LibraryKernel,
    p: &mut Params,
    config: &[(String, String)],
    explicit: &[&str],
) -> Vec<(String, String)> {
    let mut applied = Vec::new();
    for (name, value) in config {
        let tunable = k.tunables().iter().any(|t| t.name == name);
        if tunable && !explicit.contains(&name.as_str()) && p.set(name, value).is_ok() {
            applied.push((name.clone(), value.clone()));
        }
    }
    applied
}

/// Applies the tuned configuration that `stored` finds for `k`'s problem, except the
/// parameters named in `explicit`. `stored` gets the parameters before tuning and the
/// [`problem`]; it is not called for a kernel with nothing to tune. Returns the pairs
/// applied. The store itself lives in the runtime (`runtime::tune::stored_config`); the CLI,
/// the torch ops and graph mode all apply it through here.
pub fn apply_stored(
    k: &dyn LibraryKernel,
    p: &mut Params,
    explicit: &[&str],
    stored: impl FnOnce(&Params, &str) -> Option<Vec<(String, String)>>,
) -> Vec<(String, String)> {
    if k.tunables().is_empty() {
        return Vec::new();
    }
    match stored(p, &problem(k, p)) {
        Some(config) => apply(k, p, &config, explicit),
        None => Vec::new(),
    }
}

/// Names set by `name=value` overrides (comma-separated lists accepted).
pub fn named_in(overrides: &[String]) -> Vec<&str> {
    overrides
        .iter()
        .flat_map(|o| o.split(','))
        .filter_map(|item| item.split_once('=').map(|(k, _)| k.trim()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{find, FlashAttention, Op, ParamValue};

    #[test]
    fn candidates_stop_at_the_first_block_covering_the_size() {
        let p = Params::with(
            FlashAttention::PARAMS,
            &[("q_len", "100"), ("kv_len", "700")],
        )
        .unwrap();
        let t = FlashAttention::TUNABLE;
        assert_eq!(t[0].candidates(&p), vec![32, 64, 128]);
        assert_eq!(t[1].candidates(&p), vec![32, 64, 128, 256, 512]);
    }

    #[test]
    fn a_block_tiles_the_first_size_that_is_set() {
        let k = find("varlen_attention").unwrap();
        let block_k = &k.tunables()[1];
        let same = Params::with(k.params(), &[("total_q", "40"), ("block_k", "32")]).unwrap();
        assert_eq!(
            block_k.candidates(&same),
            vec![32, 64],
            "total_k defaults to total_q"
        );
        let longer = Params::with(
            k.params(),
            &[("total_q", "40"), ("total_k", "200"), ("block_k", "32")],
        )
        .unwrap();
        assert_eq!(block_k.candidates(&longer), vec![32, 64, 128, 256]);
    }

    #[test]
    fn the_current_values_come_first_and_once() {
        let k = find("softmax").unwrap();
        let p = Params::with(k.params(), &[("rows", "4"), ("block_rows", "3")]).unwrap();
        let space = search_space(k, &p).unwrap();
        assert_eq!(space[0], vec![("block_rows", 3)]);
        let values: Vec<u64> = space.iter().map(|c| c[0].1).collect();
        assert_eq!(values, vec![3, 1, 2, 4]);
    }

    #[test]
    fn the_space_is_the_product_of_the_tunables() {
        let k = find("matmul").unwrap();
        let p = Params::with(k.params(), &[("m", "64"), ("k", "64"), ("n", "64")]).unwrap();
        let space = search_space(k, &p).unwrap();
        let per: Vec<usize> = k
            .tunables()
            .iter()
            .map(|t| t.candidates(&p).len())
            .collect();
        assert_eq!(space.len(), per.iter().product::<usize>());
        assert!(search_space(find("paged_attention").unwrap(), &p)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn explicit_parameters_keep_their_values() {
        let k = find("flash_attention").unwrap();
        let mut p = Params::with(k.params(), &[("block_q", "32")]).unwrap();
        let config = vec![
            ("block_q".to_string(), "64".to_string()),
            ("block_k".to_string(), "256".to_string()),
            ("causal".to_string(), "true".to_string()),
        ];
        let applied = apply(k, &mut p, &config, &named_in(&["block_q=32".into()]));
        assert_eq!(applied, vec![("block_k".to_string(), "256".to_string())]);
        assert_eq!(
            (p.get("block_q"), p.get("block_k")),
            (Some(ParamValue::Int(32)), Some(ParamValue::Int(256)))
        );
        assert_eq!(
            p.get("causal"),
            Some(ParamValue::Flag(false)),
            "only tunable parameters are applied"
        );
        assert!(!problem(k, &p).contains("block_"));
    }
}
