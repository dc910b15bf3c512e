//! Parser for the text form printed by [`crate::print`]. Errors carry a line and column;
//! the parsed kernel is verified before it is returned.

use std::collections::HashMap;
use std::fmt;

use crate::ir::{
    BinaryOp, BlockDim, BlockSpec, CheckKind, CmpPred, DimSemantics, Index, IndexBinOp, IndexExpr,
    IndexMap, Kernel, Literal, MemorySpace, Op, OpKind, ReduceOp, RefDecl, RefId, RefKind, Region,
    Start, UnaryOp, Value,
};
use crate::types::{DType, TensorType};

/// A syntax error, or a name that cannot be resolved, at a position in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What was expected and what was found.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ParseError {}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Percent(String),
    At(String),
    Ident(String),
    Int(u64),
    Float(f64),
    Str(String),
    Punct(char),
    Arrow,
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Percent(s) => write!(f, "`%{s}`"),
            Tok::At(s) => write!(f, "`@{s}`"),
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Int(i) => write!(f, "`{i}`"),
            Tok::Float(x) => write!(f, "`{x:?}`"),
            Tok::Str(s) => write!(f, "`{}`", quote(s)),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::Arrow => f.write_str("`->`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

struct Lexed {
    tok: Tok,
    line: usize,
    column: usize,
}

fn lex(text: &str) -> Result<Vec<Lexed>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0, 1, 1);
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    while i < chars.len() {
        let c = chars[i];
        let (start_line, start_col) = (line, col);
        let mut advance = |n: usize, i: &mut usize| {
            for _ in 0..n {
                if chars[*i] == '\n' {
                    line += 1;
                    col = 1;
                } else {
                    col += 1;
                }
                *i += 1;
            }
        };
        if c.is_whitespace() {
            advance(1, &mut i);
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                advance(1, &mut i);
            }
            continue;
        }
        let err = |message: String| ParseError {
            line: start_line,
            column: start_col,
            message,
        };
        let tok = if c == '%' || c == '@' {
            let mut j = i + 1;
            while j < chars.len() && is_name(chars[j]) {
                j += 1;
            }
            if j == i + 1 {
                return Err(err(format!("`{c}` must be followed by a name")));
            }
            let name: String = chars[i + 1..j].iter().collect();
            advance(j - i, &mut i);
            if c == '%' {
                Tok::Percent(name)
            } else {
                Tok::At(name)
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut j = i;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            let name: String = chars[i..j].iter().collect();
            advance(j - i, &mut i);
            Tok::Ident(name)
        } else if c.is_ascii_digit() {
            let mut j = i;
            let mut is_float = false;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            if j < chars.len() && chars[j] == '.' {
                is_float = true;
                j += 1;
                while j < chars.len() && chars[j].is_ascii_digit() {
                    j += 1;
                }
            }
            if j < chars.len() && (chars[j] == 'e' || chars[j] == 'E') {
                let mut k = j + 1;
                if k < chars.len() && (chars[k] == '-' || chars[k] == '+') {
                    k += 1;
                }
                if k < chars.len() && chars[k].is_ascii_digit() {
                    is_float = true;
                    j = k;
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                }
            }
            let s: String = chars[i..j].iter().collect();
            advance(j - i, &mut i);
            if is_float {
                Tok::Float(s.parse().map_err(|_| err(format!("bad number `{s}`")))?)
            } else {
                Tok::Int(
                    s.parse()
                        .map_err(|_| err(format!("integer `{s}` is too large")))?,
                )
            }
        } else if c == '"' {
            let (text, len) = unquote(&chars[i..]).map_err(err)?;
            advance(len, &mut i);
            Tok::Str(text)
        } else if c == '-' && chars.get(i + 1) == Some(&'>') {
            advance(2, &mut i);
            Tok::Arrow
        } else if "()[]{},:=*+-".contains(c) {
            advance(1, &mut i);
            Tok::Punct(c)
        } else {
            return Err(err(format!("unexpected character `{c}`")));
        };
        out.push(Lexed {
            tok,
            line: start_line,
            column: start_col,
        });
    }
    out.push(Lexed {
        tok: Tok::Eof,
        line,
        column: col,
    });
    Ok(out)
}

/// A string in the text form: in double quotes, with `\\`, `\"` and `\n` escaped.
pub(crate) fn quote(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("\"{escaped}\"")
}

/// The string that starts `chars` (at its opening quote) and how many chars it spans.
fn unquote(chars: &[char]) -> Result<(String, usize), String> {
    let mut out = String::new();
    let mut i = 1;
    loop {
        match chars.get(i) {
            None | Some('\n') => return Err("unterminated string".into()),
            Some('"') => return Ok((out, i + 1)),
            Some('\\') => {
                out.push(match chars.get(i + 1) {
                    Some('\\') => '\\',
                    Some('"') => '"',
                    Some('n') => '\n',
                    other => {
                        let got = other.map_or("end of input".into(), |c| format!("`\\{c}`"));
                        return Err(format!("bad escape {got} (use \\\\, \\\" or \\n)"));
                    }
                });
                i += 2;
            }
            Some(&c) => {
                out.push(c);
                i += 1;
            }
        }
    }
}

/// Parses and verifies a kernel. Syntax errors come back as [`crate::Error::Parse`],
/// rule violations as [`crate::Error::Verify`].
pub fn parse_kernel(text: &str) -> Result<Kernel, crate::Error> {
    let toks = lex(text)?;
    let mut p = Parser {
        toks,
        pos: 0,
        value_types: Vec::new(),
        scopes: vec![HashMap::new()],
        refs: Vec::new(),
        grid_rank: 0,
    };
    let kernel = p.kernel()?;
    crate::verify::verify(&kernel)?;
    Ok(kernel)
}

struct Parser {
    toks: Vec<Lexed>,
    pos: usize,
    value_types: Vec<TensorType>,
    scopes: Vec<HashMap<String, Value>>,
    refs: Vec<RefDecl>,
    grid_rank: usize,
}

type PResult<T> = Result<T, ParseError>;

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn error_here(&self, message: impl Into<String>) -> ParseError {
        let t = &self.toks[self.pos];
        ParseError {
            line: t.line,
            column: t.column,
            message: message.into(),
        }
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].tok.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn expected(&self, what: &str) -> ParseError {
        self.error_here(format!("expected {what}, found {}", self.peek()))
    }

    fn punct(&mut self, c: char) -> PResult<()> {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            Ok(())
        } else {
            Err(self.expected(&format!("`{c}`")))
        }
    }

    /// A quoted string (a `debug_print`'s or a `check`'s message).
    fn message(&mut self) -> PResult<String> {
        match self.next() {
            Tok::Str(s) => Ok(s),
            _ => {
                self.pos -= 1;
                Err(self.expected("a quoted message"))
            }
        }
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }

    fn keyword(&mut self, kw: &str) -> PResult<()> {
        if self.eat_keyword(kw) {
            Ok(())
        } else {
            Err(self.expected(&format!("`{kw}`")))
        }
    }

    fn eat_keyword(&mut self, kw: &str) -> bool {
        if matches!(self.peek(), Tok::Ident(s) if s == kw) {
            self.next();
            true
        } else {
            false
        }
    }

    fn ident(&mut self, what: &str) -> PResult<String> {
        match self.peek().clone() {
            Tok::Ident(s) => {
                self.next();
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn percent_name(&mut self, what: &str) -> PResult<String> {
        match self.peek().clone() {
            Tok::Percent(s) => {
                self.next();
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn uint(&mut self, what: &str) -> PResult<u64> {
        match self.peek().clone() {
            Tok::Int(i) => {
                self.next();
                Ok(i)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn usize_(&mut self, what: &str) -> PResult<usize> {
        let at = self.error_here("");
        let v = self.uint(what)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v < 1 << 20)
            .ok_or(ParseError {
                message: format!("{what} {v} is too large"),
                ..at
            })
    }

    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> PResult<T>) -> PResult<Vec<T>> {
        self.punct('[')?;
        let mut out = Vec::new();
        if self.eat_punct(']') {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            if self.eat_punct(']') {
                return Ok(out);
            }
            self.punct(',')?;
        }
    }

    fn dtype(&mut self) -> PResult<DType> {
        let name = self.ident("a dtype (f32, bf16, f16, i32, bool)")?;
        DType::from_name(&name).ok_or_else(|| {
            let mut e = self.error_here(format!(
                "unknown dtype `{name}`, expected f32, bf16, f16, i32 or bool"
            ));
            e.column = e.column.saturating_sub(name.len() + 1).max(1);
            e
        })
    }

    fn tensor_type(&mut self) -> PResult<TensorType> {
        let dtype = self.dtype()?;
        let shape = if *self.peek() == Tok::Punct('[') {
            self.list(|p| p.uint("a dimension size"))?
        } else {
            vec![]
        };
        Ok(TensorType::new(dtype, shape))
    }

    fn kernel(&mut self) -> PResult<Kernel> {
        self.keyword("kernel")?;
        let name = match self.next() {
            Tok::At(s) => s,
            _ => {
                self.pos -= 1;
                return Err(self.expected("a kernel name like `@matmul`"));
            }
        };
        self.keyword("grid")?;
        let grid = self.list(|p| p.uint("a grid size"))?;
        self.grid_rank = grid.len();
        self.keyword("semantics")?;
        let dimension_semantics =
            self.list(|p| match p.ident("`parallel` or `arbitrary`")?.as_str() {
                "parallel" => Ok(DimSemantics::Parallel),
                "arbitrary" => Ok(DimSemantics::Arbitrary),
                other => Err(p.error_here(format!(
                    "unknown dimension semantics `{other}`, expected `parallel` or `arbitrary`"
                ))),
            })?;
        self.punct('{')?;
        while !self.eat_keyword("body") {
            let decl = self.ref_decl()?;
            self.refs.push(decl);
        }
        self.punct('{')?;
        let body = self.ops_until_close()?;
        self.punct('}')?;
        if *self.peek() != Tok::Eof {
            return Err(self.expected("end of input after the kernel"));
        }
        Ok(Kernel {
            name,
            grid,
            dimension_semantics,
            refs: std::mem::take(&mut self.refs),
            body: Region {
                args: vec![],
                ops: body,
            },
            value_types: std::mem::take(&mut self.value_types),
        })
    }

    fn memory_space(&mut self) -> PResult<MemorySpace> {
        match self.ident("a memory space (vmem, smem, any)")?.as_str() {
            "vmem" => Ok(MemorySpace::Vmem),
            "smem" => Ok(MemorySpace::Smem),
            "any" => Ok(MemorySpace::Any),
            other => Err(self.error_here(format!(
                "unknown memory space `{other}`, expected vmem, smem or any"
            ))),
        }
    }

    fn ref_decl(&mut self) -> PResult<RefDecl> {
        let kind = match self.ident("`in`, `out`, `scratch` or `body`")?.as_str() {
            "in" => RefKind::Input,
            "out" => RefKind::Output,
            "scratch" => RefKind::Scratch,
            other => {
                return Err(self.error_here(format!(
                    "expected `in`, `out`, `scratch` or `body`, found `{other}`"
                )))
            }
        };
        let name = self.percent_name("a ref name like `%x`")?;
        if self.refs.iter().any(|r| r.name == name) {
            return Err(self.error_here(format!("ref %{name} is declared twice")));
        }
        self.punct(':')?;
        let ty = self.tensor_type()?;
        if kind == RefKind::Scratch {
            let memory_space = self.memory_space()?;
            return Ok(RefDecl {
                name,
                kind,
                ty,
                block: None,
                memory_space,
            });
        }
        self.keyword("block")?;
        let block_shape = self.list(|p| {
            if p.eat_keyword("None") {
                Ok(BlockDim::Squeezed)
            } else {
                Ok(BlockDim::Size(p.uint("a block size or `None`")?))
            }
        })?;
        self.keyword("map")?;
        self.punct('(')?;
        let mut params = Vec::new();
        if !self.eat_punct(')') {
            loop {
                params.push(self.ident("a program-id parameter name")?);
                if self.eat_punct(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        if params.len() != self.grid_rank {
            return Err(self.error_here(format!(
                "the index map takes {} parameters but the grid has rank {}",
                params.len(),
                self.grid_rank
            )));
        }
        if *self.peek() != Tok::Arrow {
            return Err(self.expected("`->`"));
        }
        self.next();
        self.punct('(')?;
        let mut exprs = Vec::new();
        if !self.eat_punct(')') {
            loop {
                exprs.push(self.index_expr(&params)?);
                if self.eat_punct(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let memory_space = self.memory_space()?;
        Ok(RefDecl {
            name,
            kind,
            ty,
            block: Some(BlockSpec {
                block_shape,
                index_map: IndexMap { exprs },
                memory_space,
            }),
            memory_space,
        })
    }

    fn index_expr(&mut self, params: &[String]) -> PResult<IndexExpr> {
        let mut lhs = self.index_term(params)?;
        loop {
            let op = match self.peek() {
                Tok::Punct('+') => IndexBinOp::Add,
                Tok::Punct('-') => IndexBinOp::Sub,
                _ => return Ok(lhs),
            };
            self.next();
            let rhs = self.index_term(params)?;
            lhs = lhs.bin(op, rhs);
        }
    }

    fn index_term(&mut self, params: &[String]) -> PResult<IndexExpr> {
        let mut lhs = self.index_factor(params)?;
        loop {
            let op = match self.peek() {
                Tok::Punct('*') => IndexBinOp::Mul,
                Tok::Ident(s) if s == "floordiv" => IndexBinOp::FloorDiv,
                Tok::Ident(s) if s == "mod" => IndexBinOp::Rem,
                _ => return Ok(lhs),
            };
            self.next();
            let rhs = self.index_factor(params)?;
            lhs = lhs.bin(op, rhs);
        }
    }

    fn index_factor(&mut self, params: &[String]) -> PResult<IndexExpr> {
        match self.peek().clone() {
            Tok::Int(i) => {
                self.next();
                i64::try_from(i)
                    .map(IndexExpr::Const)
                    .map_err(|_| self.error_here("index constant is too large"))
            }
            Tok::Punct('-') => {
                self.next();
                let i = self.uint("an integer after `-`")?;
                i64::try_from(i)
                    .map(|i| IndexExpr::Const(-i))
                    .map_err(|_| self.error_here("index constant is too large"))
            }
            Tok::Punct('(') => {
                self.next();
                let e = self.index_expr(params)?;
                self.punct(')')?;
                Ok(e)
            }
            Tok::Ident(s) if s == "min" || s == "max" => {
                self.next();
                let op = if s == "min" {
                    IndexBinOp::Min
                } else {
                    IndexBinOp::Max
                };
                self.punct('(')?;
                let a = self.index_expr(params)?;
                self.punct(',')?;
                let b = self.index_expr(params)?;
                self.punct(')')?;
                Ok(a.bin(op, b))
            }
            Tok::Percent(name) => {
                self.next();
                // Scalar-prefetch operands are leading inputs, so declared already.
                let Some(r) = self.refs.iter().position(|r| r.name == name) else {
                    return Err(self.error_here(format!(
                        "index maps read scalar-prefetch operands declared before them; \
                         %{name} is not"
                    )));
                };
                self.punct('[')?;
                let mut index = Vec::new();
                if !self.eat_punct(']') {
                    loop {
                        index.push(self.index_expr(params)?);
                        if self.eat_punct(']') {
                            break;
                        }
                        self.punct(',')?;
                    }
                }
                Ok(IndexExpr::Scalar(RefId(r as u32), index))
            }
            Tok::Ident(s) => match params.iter().position(|p| *p == s) {
                Some(axis) => {
                    self.next();
                    Ok(IndexExpr::ProgramId(axis))
                }
                None => Err(self.error_here(format!(
                    "`{s}` is not a parameter of this index map ({})",
                    params.join(", ")
                ))),
            },
            _ => Err(self.expected("an index expression")),
        }
    }

    // ---- body ----

    fn define(&mut self, name: &str, ty: TensorType) -> PResult<Value> {
        if self.scopes.iter().any(|s| s.contains_key(name)) {
            return Err(self.error_here(format!("value %{name} is defined twice")));
        }
        self.value_types.push(ty);
        let v = Value(self.value_types.len() as u32 - 1);
        self.scopes
            .last_mut()
            .expect("a scope is always open")
            .insert(name.to_string(), v);
        Ok(v)
    }

    fn use_value(&mut self) -> PResult<Value> {
        let name = self.percent_name("a value like `%3`")?;
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.get(&name).copied())
            .ok_or_else(|| {
                let mut e = self.error_here(format!("value %{name} is not defined here"));
                e.column = e.column.saturating_sub(name.len() + 1).max(1);
                e
            })
    }

    fn ref_use(&mut self) -> PResult<RefId> {
        let name = self.percent_name("a ref like `%x`")?;
        self.refs
            .iter()
            .position(|r| r.name == name)
            .map(|i| RefId(i as u32))
            .ok_or_else(|| self.error_here(format!("ref %{name} is not declared")))
    }

    fn ops_until_close(&mut self) -> PResult<Vec<Op>> {
        let mut ops = Vec::new();
        while !self.eat_punct('}') {
            if *self.peek() == Tok::Eof {
                return Err(self.expected("`}`"));
            }
            ops.push(self.op()?);
        }
        Ok(ops)
    }

    fn index(&mut self) -> PResult<Vec<Index>> {
        self.list(|p| {
            if p.eat_punct(':') {
                return Ok(Index::Full);
            }
            if p.eat_keyword("ds") {
                p.punct('(')?;
                let start = if matches!(p.peek(), Tok::Int(_)) {
                    Start::Static(p.uint("a start")?)
                } else {
                    Start::Dynamic(p.use_value()?)
                };
                p.punct(',')?;
                let size = p.uint("a slice size")?;
                p.punct(')')?;
                return Ok(Index::Slice { start, size });
            }
            Ok(Index::At(p.use_value()?))
        })
    }

    fn usize_list(&mut self, what: &str) -> PResult<Vec<usize>> {
        self.list(|p| p.usize_(what))
    }

    fn literal(&mut self) -> PResult<Literal> {
        let negative = self.eat_punct('-');
        let sign = if negative { -1.0 } else { 1.0 };
        match self.next() {
            Tok::Int(i) => {
                let i = i64::try_from(i)
                    .map_err(|_| self.error_here("integer literal is too large"))?;
                Ok(Literal::Int(if negative { -i } else { i }))
            }
            Tok::Float(f) => Ok(Literal::Float(sign * f)),
            Tok::Ident(s) if s == "inf" => Ok(Literal::Float(sign * f64::INFINITY)),
            Tok::Ident(s) if s == "nan" && !negative => Ok(Literal::Float(f64::NAN)),
            Tok::Ident(s) if (s == "true" || s == "false") && !negative => {
                Ok(Literal::Bool(s == "true"))
            }
            _ => {
                self.pos -= 1;
                Err(self.expected("a literal (number, inf, nan, true or false)"))
            }
        }
    }

    fn colon_type(&mut self) -> PResult<TensorType> {
        self.punct(':')?;
        self.tensor_type()
    }

    fn op(&mut self) -> PResult<Op> {
        let start = self.pos;
        let mut names = Vec::new();
        if matches!(self.peek(), Tok::Percent(_)) {
            loop {
                names.push(self.percent_name("a result name")?);
                if self.eat_punct('=') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let mnemonic = self.ident("an op name")?;
        let (kind, types) = self.op_body(&mnemonic)?;
        if types.len() != names.len() {
            let t = &self.toks[start];
            return Err(ParseError {
                line: t.line,
                column: t.column,
                message: format!(
                    "`{mnemonic}` defines {} results but {} names are given",
                    types.len(),
                    names.len()
                ),
            });
        }
        let mut results = Vec::new();
        for (name, ty) in names.iter().zip(types) {
            results.push(self.define(name, ty)?);
        }
        Ok(Op { results, kind })
    }

    /// Parses what follows the mnemonic; returns the op and its result types.
    fn op_body(&mut self, m: &str) -> PResult<(OpKind, Vec<TensorType>)> {
        let one = |kind: OpKind, t: TensorType| Ok((kind, vec![t]));
        match m {
            "program_id" | "num_programs" => {
                let axis = self.usize_("a grid axis")?;
                let t = self.colon_type()?;
                let kind = if m == "program_id" {
                    OpKind::ProgramId { axis }
                } else {
                    OpKind::NumPrograms { axis }
                };
                one(kind, t)
            }
            "const" => {
                let value = self.literal()?;
                one(OpKind::Constant { value }, self.colon_type()?)
            }
            "iota" => {
                let dim = self.usize_("a dimension")?;
                one(OpKind::Iota { dim }, self.colon_type()?)
            }
            "load" => {
                let src = self.ref_use()?;
                let index = self.index()?;
                let mask = if self.eat_keyword("mask") {
                    Some(self.use_value()?)
                } else {
                    None
                };
                let other = if self.eat_keyword("other") {
                    Some(self.use_value()?)
                } else {
                    None
                };
                let t = self.colon_type()?;
                one(
                    OpKind::Load {
                        src,
                        index,
                        mask,
                        other,
                    },
                    t,
                )
            }
            "store" => {
                let dst = self.ref_use()?;
                let index = self.index()?;
                self.punct(',')?;
                let value = self.use_value()?;
                let mask = if self.eat_keyword("mask") {
                    Some(self.use_value()?)
                } else {
                    None
                };
                Ok((
                    OpKind::Store {
                        dst,
                        index,
                        value,
                        mask,
                    },
                    vec![],
                ))
            }
            "debug_print" => {
                let message = self.message()?;
                let values = self.list(|p| p.use_value())?;
                Ok((OpKind::DebugPrint { message, values }, vec![]))
            }
            "check" | "check_index" => {
                let kind = if m == "check" {
                    CheckKind::Value
                } else {
                    CheckKind::Index
                };
                let cond = self.use_value()?;
                self.punct(',')?;
                let message = self.message()?;
                let values = self.list(|p| p.use_value())?;
                Ok((
                    OpKind::Check {
                        kind,
                        cond,
                        message,
                        values,
                    },
                    vec![],
                ))
            }
            "broadcast" => {
                let x = self.use_value()?;
                self.keyword("dims")?;
                let dims = self.usize_list("a dimension")?;
                one(OpKind::Broadcast { x, dims }, self.colon_type()?)
            }
            "transpose" => {
                let x = self.use_value()?;
                self.keyword("perm")?;
                let perm = self.usize_list("a dimension")?;
                one(OpKind::Transpose { x, perm }, self.colon_type()?)
            }
            "gather" => {
                let x = self.use_value()?;
                self.punct(',')?;
                let indices = self.use_value()?;
                self.keyword("axis")?;
                let axis = self.usize_("a dimension")?;
                one(OpKind::Gather { x, indices, axis }, self.colon_type()?)
            }
            "reshape" | "cast" => {
                let x = self.use_value()?;
                let kind = if m == "reshape" {
                    OpKind::Reshape { x }
                } else {
                    OpKind::Cast { x }
                };
                one(kind, self.colon_type()?)
            }
            "cmp" => {
                let p = self.ident("a predicate (eq, ne, lt, le, gt, ge)")?;
                let pred = CmpPred::from_name(&p)
                    .ok_or_else(|| self.error_here(format!("unknown predicate `{p}`")))?;
                let lhs = self.use_value()?;
                self.punct(',')?;
                let rhs = self.use_value()?;
                one(OpKind::Compare { pred, lhs, rhs }, self.colon_type()?)
            }
            "select" => {
                let cond = self.use_value()?;
                self.punct(',')?;
                let on_true = self.use_value()?;
                self.punct(',')?;
                let on_false = self.use_value()?;
                one(
                    OpKind::Select {
                        cond,
                        on_true,
                        on_false,
                    },
                    self.colon_type()?,
                )
            }
            "dot" => {
                let lhs = self.use_value()?;
                self.punct(',')?;
                let rhs = self.use_value()?;
                let transpose_lhs = self.eat_keyword("transpose_lhs");
                let transpose_rhs = self.eat_keyword("transpose_rhs");
                one(
                    OpKind::Dot {
                        lhs,
                        rhs,
                        transpose_lhs,
                        transpose_rhs,
                    },
                    self.colon_type()?,
                )
            }
            "for" => self.for_op(),
            "if" => self.if_op(),
            "yield" => {
                let mut values = Vec::new();
                if matches!(self.peek(), Tok::Percent(_)) {
                    values.push(self.use_value()?);
                    while self.eat_punct(',') {
                        values.push(self.use_value()?);
                    }
                }
                Ok((OpKind::Yield { values }, vec![]))
            }
            _ => {
                if let Some(op) = UnaryOp::from_name(m) {
                    let x = self.use_value()?;
                    return one(OpKind::Unary { op, x }, self.colon_type()?);
                }
                if let Some(op) = BinaryOp::from_name(m) {
                    let lhs = self.use_value()?;
                    self.punct(',')?;
                    let rhs = self.use_value()?;
                    return one(OpKind::Binary { op, lhs, rhs }, self.colon_type()?);
                }
                if let Some(op) = ReduceOp::from_name(m) {
                    let x = self.use_value()?;
                    self.keyword("axes")?;
                    let axes = self.usize_list("an axis")?;
                    return one(OpKind::Reduce { op, x, axes }, self.colon_type()?);
                }
                self.pos -= 1;
                Err(self.error_here(format!("unknown op `{m}`")))
            }
        }
    }

    fn for_op(&mut self) -> PResult<(OpKind, Vec<TensorType>)> {
        let iv_name = self.percent_name("the induction variable")?;
        self.punct('=')?;
        let lower = self.use_value()?;
        self.keyword("to")?;
        let upper = self.use_value()?;
        self.keyword("step")?;
        let step = self.use_value()?;
        let mut carried = Vec::new();
        let mut inits = Vec::new();
        if self.eat_keyword("iter") {
            self.punct('(')?;
            loop {
                carried.push(self.percent_name("a carried value name")?);
                self.punct('=')?;
                inits.push(self.use_value()?);
                if self.eat_punct(')') {
                    break;
                }
                self.punct(',')?;
            }
            self.punct(':')?;
            let mut types = vec![self.tensor_type()?];
            while self.eat_punct(',') {
                types.push(self.tensor_type()?);
            }
            if types.len() != inits.len() {
                return Err(self.error_here(format!(
                    "{} carried values but {} types",
                    inits.len(),
                    types.len()
                )));
            }
        }
        self.punct('{')?;
        self.scopes.push(HashMap::new());
        let mut args = vec![self.define(&iv_name, TensorType::scalar(DType::I32))?];
        for (name, &init) in carried.iter().zip(&inits) {
            let t = self.value_types[init.0 as usize].clone();
            args.push(self.define(name, t)?);
        }
        let ops = self.ops_until_close()?;
        self.scopes.pop();
        let types = inits
            .iter()
            .map(|v| self.value_types[v.0 as usize].clone())
            .collect();
        Ok((
            OpKind::For {
                lower,
                upper,
                step,
                inits,
                body: Region { args, ops },
            },
            types,
        ))
    }

    fn if_op(&mut self) -> PResult<(OpKind, Vec<TensorType>)> {
        let cond = self.use_value()?;
        let mut types = Vec::new();
        if self.eat_punct(':') {
            types.push(self.tensor_type()?);
            while self.eat_punct(',') {
                types.push(self.tensor_type()?);
            }
        }
        let region = |p: &mut Self| -> PResult<Region> {
            p.punct('{')?;
            p.scopes.push(HashMap::new());
            let ops = p.ops_until_close();
            p.scopes.pop();
            Ok(Region {
                args: vec![],
                ops: ops?,
            })
        };
        let then_region = region(self)?;
        self.keyword("else")?;
        let else_region = region(self)?;
        Ok((
            OpKind::If {
                cond,
                then_region,
                else_region,
            },
            types,
        ))
    }
}
