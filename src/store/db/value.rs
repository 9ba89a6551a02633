//! What crosses between the store and an engine: [`Value`]s, a statement's parameters
//! ([`Param`], [`Params`], `params!`), a result's [`Row`]s and columns read from them, and the
//! one error type ([`DbError`]), so the store never sees an engine's types.

/// A value crossing between the store and an engine.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

#[derive(Debug)]
pub enum DbError {
    Sqlite(rusqlite::Error),
    Pg(postgres::Error),
    /// `query_row` found no row (`optional` turns it into `None`).
    NoRows,
    /// A column's value is not of the type asked for.
    Other(String),
    /// The database cannot be reached (PostgreSQL down, the connection lost, the store's lock
    /// not taken in time): the request may succeed when tried again (503, `Retry-After`).
    Unavailable(String),
}

pub type Result<T, E = DbError> = std::result::Result<T, E>;

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Sqlite(e) => write!(f, "{e}"),
            DbError::Pg(e) => match e.as_db_error() {
                Some(d) => write!(f, "{}: {}", d.code().code(), d.message()),
                None => f.write_str(&with_causes(e)),
            },
            DbError::NoRows => f.write_str("query returned no rows"),
            DbError::Other(s) | DbError::Unavailable(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for DbError {}

/// `e` and its causes, `: `-separated. tokio-postgres's own text is only the kind ("error
/// performing TLS handshake", "error connecting to server"); the why (a certificate of an
/// unknown issuer, a refused connection) is in its source.
fn with_causes(e: &postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    text
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::QueryReturnedNoRows => DbError::NoRows,
            e => DbError::Sqlite(e),
        }
    }
}

impl From<postgres::Error> for DbError {
    fn from(e: postgres::Error) -> Self {
        // The connection closed, or the server going away (SQLSTATE class 08, connection
        // exceptions; 57P01-57P03, shut down or starting): nothing the statement did wrong.
        let gone = e.is_closed()
            || e.code().is_some_and(|c| {
                let c = c.code();
                c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03")
            });
        if gone {
            DbError::Unavailable(format!("PostgreSQL: {}", with_causes(&e)))
        } else {
            DbError::Pg(e)
        }
    }
}

impl DbError {
    /// A row refers to one that is not there (or no more: deleted by a transaction that
    /// committed first).
    pub fn is_missing_reference(&self) -> bool {
        match self {
            DbError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => {
                f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY
            }
            DbError::Pg(e) => e.code() == Some(&postgres::error::SqlState::FOREIGN_KEY_VIOLATION),
            _ => false,
        }
    }
}

impl From<DbError> for crate::api::Error {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Sqlite(e) => e.into(),
            DbError::Unavailable(detail) => {
                // The detail (addresses and the like) is for the operator's log.
                log::warn!("database unavailable: {detail}");
                crate::api::Error::new(
                    crate::api::ErrorKind::Unavailable,
                    "database_unavailable",
                    "the database does not answer at the moment; try again",
                )
            }
            other => crate::api::Error::internal(format!("database error: {other}")),
        }
    }
}

/// rusqlite's `OptionalExtension`: no row is `None`.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(DbError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// What a parameter is sent as.
pub trait Param {
    fn value(&self) -> Value;
}

macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn value(&self) -> Value {
                Value::Int(*self as i64)
            }
        }
    )*};
}
int_param!(i64, i32, u32, u8, usize);

impl Param for u64 {
    fn value(&self) -> Value {
        Value::Int(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}

impl Param for bool {
    fn value(&self) -> Value {
        Value::Int(*self as i64)
    }
}

impl Param for f64 {
    fn value(&self) -> Value {
        Value::Real(*self)
    }
}

impl Param for str {
    fn value(&self) -> Value {
        Value::Text(self.to_string())
    }
}

impl Param for String {
    fn value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl Param for [u8] {
    fn value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl Param for Vec<u8> {
    fn value(&self) -> Value {
        Value::Blob(self.clone())
    }
}

impl<const N: usize> Param for [u8; N] {
    fn value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl Param for Value {
    fn value(&self) -> Value {
        self.clone()
    }
}

impl<T: Param> Param for Option<T> {
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::Null, Param::value)
    }
}

impl<T: Param + ?Sized> Param for &T {
    fn value(&self) -> Value {
        (**self).value()
    }
}

/// The parameters of a statement: `[a]`, `[a, b]` of one type, `params![..]`, or `[]`.
pub trait Params {
    fn values(self) -> Vec<Value>;
}

impl Params for &[&dyn Param] {
    fn values(self) -> Vec<Value> {
        self.iter().map(|p| p.value()).collect()
    }
}

impl Params for [&dyn Param; 0] {
    fn values(self) -> Vec<Value> {
        Vec::new()
    }
}

macro_rules! array_params {
    ($($n:literal),*) => {$(
        impl<T: Param> Params for [T; $n] {
            fn values(self) -> Vec<Value> {
                self.iter().map(Param::value).collect()
            }
        }
    )*};
}
array_params!(1, 2, 3, 4);

/// rusqlite's `params!`, for this module's [`Params`].
macro_rules! db_params {
    ($($p:expr),* $(,)?) => {
        &[$(&$p as &dyn $crate::store::db::Param),*] as &[&dyn $crate::store::db::Param]
    };
}
pub(crate) use db_params as params;

/// A value read from a column.
pub trait Column: Sized {
    fn from_value(v: Value) -> Result<Self>;
}

fn wrong(v: &Value, want: &str) -> DbError {
    DbError::Other(format!("column holds {v:?}, not {want}"))
}

impl Column for i64 {
    fn from_value(v: Value) -> Result<Self> {
        match v {
            Value::Int(i) => Ok(i),
            v => Err(wrong(&v, "an integer")),
        }
    }
}

macro_rules! int_column {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn from_value(v: Value) -> Result<Self> {
                let i = i64::from_value(v)?;
                <$t>::try_from(i).map_err(|_| DbError::Other(format!("{i} out of range")))
            }
        }
    )*};
}
int_column!(i32, u32, u64, usize);

impl Column for bool {
    fn from_value(v: Value) -> Result<Self> {
        Ok(i64::from_value(v)? != 0)
    }
}

impl Column for f64 {
    fn from_value(v: Value) -> Result<Self> {
        match v {
            Value::Real(f) => Ok(f),
            Value::Int(i) => Ok(i as f64),
            v => Err(wrong(&v, "a number")),
        }
    }
}

impl Column for String {
    fn from_value(v: Value) -> Result<Self> {
        match v {
            Value::Text(s) => Ok(s),
            v => Err(wrong(&v, "text")),
        }
    }
}

impl Column for Vec<u8> {
    fn from_value(v: Value) -> Result<Self> {
        match v {
            Value::Blob(b) => Ok(b),
            Value::Text(s) => Ok(s.into_bytes()),
            v => Err(wrong(&v, "bytes")),
        }
    }
}

impl Column for Value {
    fn from_value(v: Value) -> Result<Self> {
        Ok(v)
    }
}

impl<T: Column> Column for Option<T> {
    fn from_value(v: Value) -> Result<Self> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// A column's position (rusqlite's `RowIndex`: a literal `0` is a `usize`).
pub trait RowIndex {
    fn idx(self) -> usize;
}

impl RowIndex for usize {
    fn idx(self) -> usize {
        self
    }
}

/// One row of a result.
pub struct Row {
    pub(super) values: Vec<Value>,
}

impl Row {
    /// Column `i` (from 0) as `T` (`get::<_, T>` as with rusqlite).
    pub fn get<I: RowIndex, T: Column>(&self, i: I) -> Result<T> {
        let i = i.idx();
        let v = self
            .values
            .get(i)
            .cloned()
            .ok_or_else(|| DbError::Other(format!("no column {i}")))?;
        T::from_value(v)
    }
}
