//! Named kernel parameters (`m=256,causal=true,dtype=bf16`) with declared defaults.

use std::collections::BTreeMap;
use std::fmt;

use kernel_ir::DType;

/// A parameter a library kernel takes.
#[derive(Clone, Copy, Debug)]
pub struct ParamDef {
    /// Name, as written on the command line.
    pub name: &'static str,
    /// Default value, as text.
    pub default: &'static str,
    /// What it means.
    pub help: &'static str,
}

/// A bad parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError(pub String);

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParamError {}

/// Parameter values, defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    values: BTreeMap<&'static str, String>,
}

impl Params {
    /// The defaults of `defs`, overridden by `key=value` pairs (comma-separated lists
    /// are accepted). Unknown keys are errors that list the known ones.
    pub fn parse(defs: &'static [ParamDef], overrides: &[String]) -> Result<Params, ParamError> {
        let mut values: BTreeMap<&'static str, String> = defs
            .iter()
            .map(|d| (d.name, d.default.to_string()))
            .collect();
        for item in overrides
            .iter()
            .flat_map(|o| o.split(','))
            .filter(|s| !s.is_empty())
        {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| ParamError(format!("`{item}` is not `name=value`")))?;
            let def = defs.iter().find(|d| d.name == k.trim()).ok_or_else(|| {
                let known: Vec<_> = defs.iter().map(|d| d.name).collect();
                ParamError(format!(
                    "unknown parameter `{k}`; known: {}",
                    known.join(", ")
                ))
            })?;
            values.insert(def.name, v.trim().to_string());
        }
        Ok(Params { values })
    }

    /// The defaults with some values replaced (for tests).
    pub fn with(defs: &'static [ParamDef], pairs: &[(&str, &str)]) -> Result<Params, ParamError> {
        let overrides: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        Params::parse(defs, &overrides)
    }

    /// The value of `name` as text, if it is a parameter.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Replaces the value of parameter `name` (which must exist).
    pub fn set(&mut self, name: &str, value: impl Into<String>) -> Result<(), ParamError> {
        match self.values.get_mut(name) {
            Some(v) => {
                *v = value.into();
                Ok(())
            }
            None => Err(ParamError(format!("unknown parameter `{name}`"))),
        }
    }

    /// `name=value,...` without the parameters in `skip`: what a tuned configuration
    /// is keyed by when `skip` are the tunable ones.
    pub fn without(&self, skip: &[&str]) -> String {
        let parts: Vec<String> = self
            .values
            .iter()
            .filter(|(k, _)| !skip.contains(k))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.join(",")
    }

    fn raw(&self, name: &str) -> Result<&str, ParamError> {
        self.values
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| ParamError(format!("missing parameter `{name}`")))
    }

    /// A positive integer.
    pub fn dim(&self, name: &str) -> Result<u64, ParamError> {
        let raw = self.raw(name)?;
        match raw.parse::<u64>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(ParamError(format!(
                "`{name}` must be a positive integer, got `{raw}`"
            ))),
        }
    }

    /// Attention's `heads` and `kv_heads` (GQA: the kv heads divide the query heads).
    pub fn heads(&self) -> Result<(u64, u64), ParamError> {
        let (heads, kv_heads) = (self.dim("heads")?, self.dim("kv_heads")?);
        if !heads.is_multiple_of(kv_heads) {
            return Err(ParamError(format!(
                "`heads` ({heads}) must be a multiple of `kv_heads` ({kv_heads})"
            )));
        }
        Ok((heads, kv_heads))
    }

    /// A boolean (`true`/`false`/`1`/`0`).
    pub fn flag(&self, name: &str) -> Result<bool, ParamError> {
        match self.raw(name)? {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(ParamError(format!(
                "`{name}` must be true or false, got `{other}`"
            ))),
        }
    }

    /// A non-negative integer (`none` gives `None`).
    pub fn count_opt(&self, name: &str) -> Result<Option<u64>, ParamError> {
        match self.raw(name)? {
            "none" | "" => Ok(None),
            raw => raw.parse::<u64>().map(Some).map_err(|_| {
                ParamError(format!(
                    "`{name}` must be a non-negative integer or none, got `{raw}`"
                ))
            }),
        }
    }

    /// A float (`none` gives `None`).
    pub fn float_opt(&self, name: &str) -> Result<Option<f64>, ParamError> {
        match self.raw(name)? {
            "none" | "" => Ok(None),
            raw => raw
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .map(Some)
                .ok_or_else(|| ParamError(format!("`{name}` must be a number, got `{raw}`"))),
        }
    }

    /// A float dtype (`f32`, `bf16`, `f16`), restricted to `allowed`.
    pub fn dtype(&self, name: &str, allowed: &[DType]) -> Result<DType, ParamError> {
        let raw = self.raw(name)?;
        DType::from_name(raw)
            .filter(|d| allowed.contains(d))
            .ok_or_else(|| {
                let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
                ParamError(format!(
                    "`{name}` must be one of {}, got `{raw}`",
                    names.join(", ")
                ))
            })
    }
}

impl fmt::Display for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        f.write_str(&parts.join(","))
    }
}
