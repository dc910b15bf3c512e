//! Named kernel parameters (`m=256,causal=true,dtype=bf16`) with declared kinds and
//! defaults. A value is checked against its parameter's [`Kind`] where it enters (text
//! from the command line, a custom call or the tuning store; a typed [`ParamValue`] from an
//! op's plan) and kept typed; text is only its way in and out.

use std::collections::BTreeMap;
use std::fmt;

use kernel_ir::DType;

/// A parameter a library kernel takes.
#[derive(Clone, Copy, Debug)]
pub struct ParamDef {
    /// Name, as written on the command line.
    pub name: &'static str,
    /// What its values are.
    pub kind: Kind,
    /// Default value, as text.
    pub default: &'static str,
    /// What it means.
    pub help: &'static str,
}

/// What a parameter's values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A positive integer: a size or a block.
    Dim,
    /// A non-negative integer, or `none`.
    CountOpt,
    /// A finite number, or `none`.
    FloatOpt,
    /// `true` or `false` (`1` and `0` read as them).
    Flag,
    /// A dtype's name (`f32`, `bf16`, ...).
    DType,
    /// One of these words.
    OneOf(&'static [&'static str]),
}

/// A parameter's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamValue {
    /// An integer ([`Kind::Dim`], [`Kind::CountOpt`]).
    Int(u64),
    /// A number ([`Kind::FloatOpt`]).
    Float(f64),
    /// A flag.
    Flag(bool),
    /// A dtype.
    DType(DType),
    /// One of a [`Kind::OneOf`]'s words.
    Word(&'static str),
    /// `none` ([`Kind::CountOpt`], [`Kind::FloatOpt`]).
    Unset,
}

impl Kind {
    /// `raw` as a value of this kind; `name` is the parameter's, for the error. What a
    /// value may be is [`Kind::admits`]'s rule.
    pub fn parse(self, name: &str, raw: &str) -> Result<ParamValue, ParamError> {
        let unset = matches!(raw, "none" | "");
        let value = match self {
            Kind::CountOpt | Kind::FloatOpt if unset => Some(ParamValue::Unset),
            Kind::Dim | Kind::CountOpt => raw.parse().ok().map(ParamValue::Int),
            Kind::FloatOpt => raw.parse().ok().map(ParamValue::Float),
            Kind::Flag => match raw {
                "true" | "1" => Some(ParamValue::Flag(true)),
                "false" | "0" => Some(ParamValue::Flag(false)),
                _ => None,
            },
            Kind::DType => DType::from_name(raw).map(ParamValue::DType),
            Kind::OneOf(words) => words
                .iter()
                .find(|w| **w == raw)
                .map(|w| ParamValue::Word(w)),
        };
        value.filter(|v| self.admits(v)).ok_or_else(|| {
            let what = match self {
                Kind::Dim => "a positive integer".to_string(),
                Kind::CountOpt => "a non-negative integer or none".to_string(),
                Kind::FloatOpt => "a number".to_string(),
                Kind::Flag => "true or false".to_string(),
                Kind::DType => "a dtype (f32, bf16, f16, ...)".to_string(),
                Kind::OneOf(words) => format!("one of {}", words.join(", ")),
            };
            ParamError(format!("`{name}` must be {what}, got `{raw}`"))
        })
    }

    /// Whether `value` is one of this kind's values.
    pub fn admits(self, value: &ParamValue) -> bool {
        match (self, value) {
            (Kind::Dim, ParamValue::Int(v)) => *v > 0,
            (Kind::CountOpt, ParamValue::Int(_) | ParamValue::Unset) => true,
            (Kind::FloatOpt, ParamValue::Float(v)) => v.is_finite(),
            (Kind::FloatOpt, ParamValue::Unset) => true,
            (Kind::Flag, ParamValue::Flag(_)) | (Kind::DType, ParamValue::DType(_)) => true,
            (Kind::OneOf(words), ParamValue::Word(w)) => words.contains(w),
            _ => false,
        }
    }
}

impl ParamValue {
    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<u64> {
        match self {
            ParamValue::Int(v) => Some(*v),
            _ => None,
        }
    }
}

/// The text a value parses back from (numbers in their shortest round-trip form).
impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Float(v) => write!(f, "{v:?}"),
            ParamValue::Flag(v) => write!(f, "{v}"),
            ParamValue::DType(d) => f.write_str(d.name()),
            ParamValue::Word(w) => f.write_str(w),
            ParamValue::Unset => f.write_str("none"),
        }
    }
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
#[derive(Clone, Debug)]
pub struct Params {
    defs: &'static [ParamDef],
    values: BTreeMap<&'static str, ParamValue>,
}

/// Equal values (of the same kernel's parameters).
impl PartialEq for Params {
    fn eq(&self, other: &Params) -> bool {
        self.values == other.values
    }
}

impl Params {
    /// The defaults of `defs`, overridden by `key=value` pairs (comma-separated lists
    /// are accepted). Unknown keys and values not of their parameter's kind are errors
    /// that name them.
    pub fn parse(defs: &'static [ParamDef], overrides: &[String]) -> Result<Params, ParamError> {
        let mut p = Params::defaults(defs)?;
        for item in overrides
            .iter()
            .flat_map(|o| o.split(','))
            .filter(|s| !s.is_empty())
        {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| ParamError(format!("`{item}` is not `name=value`")))?;
            p.set(k.trim(), v.trim())?;
        }
        Ok(p)
    }

    /// The defaults of `defs`, overridden by typed `values` (an op's plan).
    pub fn from_values(
        defs: &'static [ParamDef],
        values: &[(&'static str, ParamValue)],
    ) -> Result<Params, ParamError> {
        let mut p = Params::defaults(defs)?;
        for &(name, value) in values {
            p.set_value(name, value)?;
        }
        Ok(p)
    }

    /// The defaults with some values replaced (for tests).
    pub fn with(defs: &'static [ParamDef], pairs: &[(&str, &str)]) -> Result<Params, ParamError> {
        let overrides: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        Params::parse(defs, &overrides)
    }

    fn defaults(defs: &'static [ParamDef]) -> Result<Params, ParamError> {
        let values = defs
            .iter()
            .map(|d| {
                let value = d.kind.parse(d.name, d.default);
                Ok((
                    d.name,
                    value.map_err(|e| ParamError(format!("default: {e}")))?,
                ))
            })
            .collect::<Result<_, ParamError>>()?;
        Ok(Params { defs, values })
    }

    fn def(&self, name: &str) -> Result<&'static ParamDef, ParamError> {
        self.defs.iter().find(|d| d.name == name).ok_or_else(|| {
            let known: Vec<_> = self.defs.iter().map(|d| d.name).collect();
            ParamError(format!(
                "unknown parameter `{name}`; known: {}",
                known.join(", ")
            ))
        })
    }

    /// The value of `name`, if it is a parameter.
    pub fn get(&self, name: &str) -> Option<ParamValue> {
        self.values.get(name).copied()
    }

    /// Replaces the value of parameter `name` by `raw` read as its kind.
    pub fn set(&mut self, name: &str, raw: &str) -> Result<(), ParamError> {
        let def = self.def(name)?;
        self.values.insert(def.name, def.kind.parse(def.name, raw)?);
        Ok(())
    }

    /// Replaces the value of parameter `name` by `value`, which must be of its kind.
    pub fn set_value(&mut self, name: &str, value: ParamValue) -> Result<(), ParamError> {
        let def = self.def(name)?;
        if !def.kind.admits(&value) {
            return Err(ParamError(format!(
                "`{name}` must be a value of kind {:?}, got `{value}`",
                def.kind
            )));
        }
        self.values.insert(def.name, value);
        Ok(())
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

    fn value(&self, name: &str) -> Result<ParamValue, ParamError> {
        self.get(name)
            .ok_or_else(|| ParamError(format!("missing parameter `{name}`")))
    }

    fn mismatch(name: &str, want: &str, got: ParamValue) -> ParamError {
        ParamError(format!("`{name}` is not {want} (it holds `{got}`)"))
    }

    /// A positive integer.
    pub fn dim(&self, name: &str) -> Result<u64, ParamError> {
        match self.value(name)? {
            ParamValue::Int(v) if v > 0 => Ok(v),
            other => Err(Params::mismatch(name, "a positive integer", other)),
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

    /// A flag.
    pub fn flag(&self, name: &str) -> Result<bool, ParamError> {
        match self.value(name)? {
            ParamValue::Flag(v) => Ok(v),
            other => Err(Params::mismatch(name, "a flag", other)),
        }
    }

    /// A non-negative integer, or `None` for `none`.
    pub fn count_opt(&self, name: &str) -> Result<Option<u64>, ParamError> {
        match self.value(name)? {
            ParamValue::Int(v) => Ok(Some(v)),
            ParamValue::Unset => Ok(None),
            other => Err(Params::mismatch(name, "an integer or none", other)),
        }
    }

    /// A number, or `None` for `none`.
    pub fn float_opt(&self, name: &str) -> Result<Option<f64>, ParamError> {
        match self.value(name)? {
            ParamValue::Float(v) => Ok(Some(v)),
            ParamValue::Unset => Ok(None),
            other => Err(Params::mismatch(name, "a number or none", other)),
        }
    }

    /// One of a [`Kind::OneOf`]'s words.
    pub fn word(&self, name: &str) -> Result<&'static str, ParamError> {
        match self.value(name)? {
            ParamValue::Word(w) => Ok(w),
            other => Err(Params::mismatch(name, "a word", other)),
        }
    }

    /// A dtype, restricted to `allowed`.
    pub fn dtype(&self, name: &str, allowed: &[DType]) -> Result<DType, ParamError> {
        match self.value(name)? {
            ParamValue::DType(d) if allowed.contains(&d) => Ok(d),
            other => {
                let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
                Err(ParamError(format!(
                    "`{name}` must be one of {}, got `{other}`",
                    names.join(", ")
                )))
            }
        }
    }
}

impl fmt::Display for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.without(&[]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFS: &[ParamDef] = &[
        ParamDef {
            name: "rows",
            kind: Kind::Dim,
            default: "8",
            help: "",
        },
        ParamDef {
            name: "scale",
            kind: Kind::FloatOpt,
            default: "none",
            help: "",
        },
        ParamDef {
            name: "causal",
            kind: Kind::Flag,
            default: "false",
            help: "",
        },
        ParamDef {
            name: "mask",
            kind: Kind::OneOf(&["none", "batch"]),
            default: "none",
            help: "",
        },
    ];

    #[test]
    fn values_are_typed_where_they_are_parsed_and_print_back_as_they_parse() {
        let p = Params::parse(DEFS, &["rows=3,scale=0.125".into(), "causal=1".into()]).unwrap();
        assert_eq!(p.dim("rows"), Ok(3));
        assert_eq!(p.float_opt("scale"), Ok(Some(0.125)));
        assert_eq!(p.flag("causal"), Ok(true));
        assert_eq!(p.word("mask"), Ok("none"));
        let text = p.to_string();
        assert_eq!(text, "causal=true,mask=none,rows=3,scale=0.125");
        assert_eq!(Params::parse(DEFS, &[text]).unwrap(), p);
        // A typed read of another kind names the parameter.
        assert!(p
            .flag("rows")
            .unwrap_err()
            .0
            .contains("`rows` is not a flag"));
    }

    #[test]
    fn bad_values_and_names_are_refused_naming_them() {
        for (item, message) in [
            ("rows=0", "`rows` must be a positive integer, got `0`"),
            ("scale=inf", "`scale` must be a number, got `inf`"),
            ("causal=yes", "`causal` must be true or false, got `yes`"),
            ("mask=head", "`mask` must be one of none, batch, got `head`"),
            (
                "cols=4",
                "unknown parameter `cols`; known: rows, scale, causal, mask",
            ),
            ("rows", "`rows` is not `name=value`"),
        ] {
            let e = Params::parse(DEFS, &[item.into()]).unwrap_err();
            assert_eq!(e.0, message, "{item}");
        }
    }

    #[test]
    fn typed_values_are_checked_against_their_kinds() {
        let p = Params::from_values(
            DEFS,
            &[
                ("rows", ParamValue::Int(5)),
                ("scale", ParamValue::Float(0.5)),
            ],
        );
        assert_eq!(
            p.unwrap().to_string(),
            "causal=false,mask=none,rows=5,scale=0.5"
        );
        for bad in [
            ("rows", ParamValue::Int(0)),
            ("rows", ParamValue::Flag(true)),
            ("scale", ParamValue::Float(f64::NAN)),
            ("mask", ParamValue::Word("head")),
        ] {
            let e = Params::from_values(DEFS, &[bad]).unwrap_err();
            assert!(
                e.0.starts_with(&format!("`{}` must be a value of kind", bad.0)),
                "{e}"
            );
        }
    }
}
