//! The store's one way to its metadata database, SQLite or PostgreSQL.
//!
//! **Why a thin layer with rusqlite's shape, not a second store.** The store's logic (some 4,000
//! lines of tree, upload, preview, purge and auth code) is written as SQL run in transactions
//! under one lock. It is kept once: the store calls this module's `Conn`, `Tx` and `Stmt`, whose
//! methods are the subset of rusqlite's API it used (`query_row`, `prepare_cached`, `exists`,
//! `optional`, savepoints), and each engine implements them. SQL is written once, in the
//! common subset of both dialects (`ON CONFLICT`, `IS DISTINCT FROM`, `CAST(.. AS BIGINT)`,
//! recursive CTEs); the few real differences are either translated here (`?N` parameters,
//! `LIMIT -1`, `temp.`) or asked for by name (`Conn::greatest`, `Conn::is_pg`). Values cross
//! as [`Value`]s, so the store never sees an engine's types.
//!
//! **Concurrency is SQLite's model on both engines**, so the store's reasoning holds unchanged:
//! a transaction takes the database's one write lock when it begins (SQLite: `BEGIN
//! IMMEDIATE`; PostgreSQL: `pg_advisory_xact_lock` of [`LOCK_KEY`] after `BEGIN`), and the
//! store's own lock ([`Db::lock`]), which keeps the blob namespace consistent with the rows
//! (a blob is placed and recorded, or unrecorded and removed, under it), spans every process
//! on PostgreSQL (a session-level advisory lock on the same key, held while the guard lives),
//! as the in-process mutex alone does on SQLite, where one process serves. Several `vaultfs
//! serve` processes on one database are therefore one store: names cannot race (each
//! check-then-insert runs alone), pins and tokens are rows, and no process removes bytes
//! another has just recorded. The price is one writer at a time across the cluster, as SQLite
//! has; reads of other processes' preview threads go on beside it.
//!
//! **PostgreSQL client.** sfackler's synchronous `postgres` crate (the store is synchronous;
//! no async stack or pool framework to build). Each connection is owned by a thread of its
//! own, and calls reach it over a channel: the client blocks on a runtime of its own, which
//! must never be entered from a thread of the server's runtime (tests and the local backend call
//! the store from async code); a channel round trip is a few microseconds beside the network's.
//! Statements are prepared once per connection (keyed by their SQL), as `prepare_cached` does.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::sync::{relock, try_relock};

/// How long [`Db::lock`] waits for a database that does not answer.
const LOCK_RETRY: Duration = Duration::from_secs(5);

/// How long a connection to PostgreSQL may take to be made (unless the address says).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The key of the advisory lock that stands for SQLite's write lock and the store's lock.
pub const LOCK_KEY: i64 = 0x7661_756c_7466_7331; // "vaultfs1"

// ----- values -----

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
                None => write!(f, "{e}"),
            },
            DbError::NoRows => f.write_str("query returned no rows"),
            DbError::Other(s) | DbError::Unavailable(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for DbError {}

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
            DbError::Unavailable(format!("PostgreSQL: {e}"))
        } else {
            DbError::Pg(e)
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
    values: Vec<Value>,
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

// ----- SQLite -----

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn lite_row(r: &rusqlite::Row) -> rusqlite::Result<Row> {
    use rusqlite::types::ValueRef;
    let n = r.as_ref().column_count();
    let mut values = Vec::with_capacity(n);
    for i in 0..n {
        values.push(match r.get_ref(i)? {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Int(i),
            ValueRef::Real(f) => Value::Real(f),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        });
    }
    Ok(Row { values })
}

// ----- PostgreSQL -----

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // The server infers each parameter's type from the statement; the value is sent as
        // that type (an integer where text is inferred, as SQLite would take it).
        match (self, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Int(i), &Type::INT8) => i.to_sql(ty, out),
            (Value::Int(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (Value::Int(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (Value::Int(i), &Type::BOOL) => (*i != 0).to_sql(ty, out),
            (Value::Int(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (Value::Int(i), &Type::TEXT | &Type::VARCHAR) => i.to_string().to_sql(ty, out),
            (Value::Real(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (Value::Real(f), &Type::FLOAT4) => (*f as f32).to_sql(ty, out),
            (Value::Text(s), &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR | &Type::NAME) => {
                s.as_str().to_sql(ty, out)
            }
            (Value::Text(s), &Type::BYTEA) => s.as_bytes().to_sql(ty, out),
            (Value::Blob(b), &Type::BYTEA) => b.as_slice().to_sql(ty, out),
            (v, ty) => Err(format!("cannot send {v:?} as {ty}").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn pg_value(row: &postgres::Row, i: usize) -> Result<Value> {
    let ty = row.columns()[i].type_();
    let v = match *ty {
        Type::INT8 => row.try_get::<_, Option<i64>>(i)?.map(Value::Int),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)?
            .map(|v| Value::Int(v.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(i)?
            .map(|v| Value::Int(v.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)?
            .map(|v| Value::Int(v.into())),
        Type::FLOAT8 => row.try_get::<_, Option<f64>>(i)?.map(Value::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(i)?
            .map(|v| Value::Real(v.into())),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            row.try_get::<_, Option<String>>(i)?.map(Value::Text)
        }
        Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob),
        ref other => {
            return Err(DbError::Other(format!(
                "column {} is of type {other}: cast it in the SQL",
                row.columns()[i].name()
            )));
        }
    };
    Ok(v.unwrap_or(Value::Null))
}

/// The statement as PostgreSQL spells it: `$N` for `?N`, and the few SQLite-only phrases.
pub fn pg_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut quoted = false;
    let mut prev = ' ';
    for (i, c) in sql.char_indices() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => out.push('$'),
            // SQLite's schema of temporary tables (`temp.t`, not `x_temp.t`).
            't' if !(quoted || prev.is_alphanumeric() || prev == '_')
                && sql[i..].starts_with("temp.") =>
            {
                out.push_str("pg_t")
            }
            c => out.push(c),
        }
        prev = c;
    }
    out.replace("LIMIT -1", "LIMIT ALL")
}

type Job = Box<dyn FnOnce(&mut PgState) + Send>;

struct PgState {
    url: String,
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
}

impl PgState {
    fn client(&mut self) -> Result<&mut postgres::Client> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            log::warn!("the connection to PostgreSQL was lost: connecting again");
            self.client = None;
            self.statements.clear();
        }
        if self.client.is_none() {
            self.client =
                Some(connect(&self.url).map_err(|e| {
                    DbError::Unavailable(format!("cannot connect to PostgreSQL: {e}"))
                })?);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    fn statement(&mut self, sql: &str) -> Result<postgres::Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client()?.prepare(&pg_sql(sql))?;
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        let stmt = self.statement(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let rows = self.client()?.query(&stmt, &refs)?;
        rows.iter()
            .map(|r| {
                let values = (0..r.len())
                    .map(|i| pg_value(r, i))
                    .collect::<Result<_>>()?;
                Ok(Row { values })
            })
            .collect()
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<usize> {
        let stmt = self.statement(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        Ok(self.client()?.execute(&stmt, &refs)? as usize)
    }
}

fn connect(url: &str) -> Result<postgres::Client> {
    let mut config: postgres::Config = url
        .parse()
        .map_err(|e| DbError::Other(format!("bad database address: {e}")))?;
    // A host that does not answer at all fails a request in bounded time, as a down one does.
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    let mut client = config.connect(postgres::NoTls)?;
    // Times and names are compared as bytes, as SQLite does; no statement waits forever on a
    // lock a dead peer held (its session ends with its socket).
    client.batch_execute("SET client_min_messages = warning")?;
    Ok(client)
}

/// A PostgreSQL connection, owned by its thread.
pub struct PgConn {
    jobs: mpsc::Sender<Job>,
}

impl PgConn {
    pub fn open(url: &str) -> Result<PgConn> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let url = url.to_string();
        std::thread::Builder::new()
            .name("postgres".into())
            .spawn(move || {
                let mut state = PgState {
                    client: None,
                    statements: HashMap::new(),
                    url,
                };
                let first = state.client().map(drop);
                let failed = first.is_err();
                let _ = ready_tx.send(first);
                if failed {
                    return;
                }
                // Ends when the connection is dropped (its sender with it).
                while let Ok(job) = rx.recv() {
                    job(&mut state);
                }
            })
            .map_err(|e| DbError::Other(format!("cannot start a thread: {e}")))?;
        ready_rx
            .recv()
            .map_err(|_| DbError::Other("the PostgreSQL thread died".into()))??;
        Ok(PgConn { jobs })
    }

    fn call<T>(&self, f: impl FnOnce(&mut PgState) -> T + Send + 'static) -> T
    where
        T: From<DbError> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        let sent = self.jobs.send(Box::new(move |s: &mut PgState| {
            let _ = tx.send(f(s));
        }));
        if sent.is_err() {
            return DbError::Other("the PostgreSQL thread is gone".into()).into();
        }
        rx.recv()
            .unwrap_or_else(|_| DbError::Other("the PostgreSQL thread died".into()).into())
    }

    fn query(&self, sql: &str, params: Vec<Value>) -> Result<Vec<Row>> {
        let sql = sql.to_string();
        self.call(move |s| Wrap(s.query(&sql, &params))).0
    }

    fn execute(&self, sql: &str, params: Vec<Value>) -> Result<usize> {
        let sql = sql.to_string();
        self.call(move |s| Wrap(s.execute(&sql, &params))).0
    }

    fn batch(&self, sql: &str) -> Result<()> {
        let sql = pg_sql(sql);
        self.call(move |s| Wrap(s.client().and_then(|c| Ok(c.batch_execute(&sql)?))))
            .0
    }
}

/// A result that an error converts into (for [`PgConn::call`]).
struct Wrap<T>(Result<T>);

impl<T> From<DbError> for Wrap<T> {
    fn from(e: DbError) -> Self {
        Wrap(Err(e))
    }
}

// ----- connections -----

/// Where the metadata lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// `vault.db` at this path.
    Sqlite(std::path::PathBuf),
    /// A `postgres://` address.
    Postgres(String),
}

impl Engine {
    /// A new connection (the preview threads have their own).
    pub fn connect(&self) -> Result<Conn> {
        match self {
            Engine::Sqlite(path) => {
                let c = rusqlite::Connection::open(path)?;
                c.busy_timeout(std::time::Duration::from_secs(30))?;
                Ok(Conn::Sqlite {
                    conn: c,
                    immediate: false,
                })
            }
            Engine::Postgres(url) => Ok(Conn::Pg(PgConn::open(url)?)),
        }
    }

    pub fn is_pg(&self) -> bool {
        matches!(self, Engine::Postgres(_))
    }
}

/// One connection to the metadata database.
pub enum Conn {
    Sqlite {
        conn: rusqlite::Connection,
        /// Transactions begin `IMMEDIATE` (take the write lock at once).
        immediate: bool,
    },
    Pg(PgConn),
}

/// rusqlite's `TransactionBehavior`, for [`Conn::transaction_with_behavior`].
#[derive(Debug, Clone, Copy)]
pub enum TransactionBehavior {
    Immediate,
}

impl Conn {
    /// The SQLite connection, prepared by `schema::prepare` (its transactions immediate).
    pub fn sqlite(conn: rusqlite::Connection) -> Conn {
        Conn::Sqlite {
            conn,
            immediate: true,
        }
    }

    pub fn is_pg(&self) -> bool {
        matches!(self, Conn::Pg(_))
    }

    /// The scalar maximum of two values (`MAX(a, b)` in SQLite, `GREATEST` in PostgreSQL).
    pub fn greatest(&self) -> &'static str {
        if self.is_pg() { "GREATEST" } else { "MAX" }
    }

    /// The SQLite connection itself (pragmas, the schema's migrations).
    pub fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match self {
            Conn::Sqlite { conn, .. } => Some(conn),
            Conn::Pg(_) => None,
        }
    }

    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        match self {
            Conn::Sqlite { conn, .. } => {
                let v = params.values();
                Ok(conn.execute(sql, rusqlite::params_from_iter(v.iter()))?)
            }
            Conn::Pg(pg) => pg.execute(sql, params.values()),
        }
    }

    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match self {
            Conn::Sqlite { conn, .. } => Ok(conn.execute_batch(sql)?),
            Conn::Pg(pg) => pg.batch(sql),
        }
    }

    pub fn query_row<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        self.prepare(sql)?.query_row(params, f)
    }

    pub fn prepare(&self, sql: &str) -> Result<Stmt<'_>> {
        Ok(match self {
            Conn::Sqlite { conn, .. } => Stmt::Sqlite(Lite::Plain(conn.prepare(sql)?)),
            Conn::Pg(pg) => Stmt::Pg(pg, sql.to_string()),
        })
    }

    pub fn prepare_cached(&self, sql: &str) -> Result<Stmt<'_>> {
        Ok(match self {
            Conn::Sqlite { conn, .. } => Stmt::Sqlite(Lite::Cached(conn.prepare_cached(sql)?)),
            Conn::Pg(pg) => Stmt::Pg(pg, sql.to_string()),
        })
    }

    /// The ID the last insert gave its row.
    pub fn last_insert_rowid(&self) -> Result<i64> {
        match self {
            Conn::Sqlite { conn, .. } => Ok(conn.last_insert_rowid()),
            Conn::Pg(pg) => pg
                .query("SELECT lastval()", Vec::new())?
                .first()
                .ok_or(DbError::NoRows)?
                .get(0),
        }
    }

    /// Begins a transaction, which holds the write lock (see the module's comment).
    pub fn transaction(&self) -> Result<Tx<'_>> {
        let begin = match self {
            Conn::Sqlite {
                immediate: true, ..
            } => "BEGIN IMMEDIATE",
            Conn::Sqlite { .. } => "BEGIN DEFERRED",
            Conn::Pg(_) => "BEGIN; SELECT pg_advisory_xact_lock(8530228277886219057)",
        };
        self.execute_batch(begin)?;
        Ok(Tx {
            conn: self,
            savepoint: None,
            done: false,
        })
    }

    /// rusqlite's name for a transaction begun through a shared reference.
    pub fn unchecked_transaction(&self) -> Result<Tx<'_>> {
        self.transaction()
    }

    pub fn transaction_with_behavior(&self, _: TransactionBehavior) -> Result<Tx<'_>> {
        match self {
            Conn::Sqlite { conn, .. } => {
                conn.execute_batch("BEGIN IMMEDIATE")?;
                Ok(Tx {
                    conn: self,
                    savepoint: None,
                    done: false,
                })
            }
            Conn::Pg(_) => self.transaction(),
        }
    }

    /// Takes (true) or releases (false) the store's lock across processes (PostgreSQL only).
    fn session_lock(&self, take: bool) -> Result<()> {
        if let Conn::Pg(pg) = self {
            let sql = if take {
                "SELECT pg_advisory_lock(8530228277886219057)"
            } else {
                "SELECT pg_advisory_unlock(8530228277886219057)"
            };
            pg.batch(sql)?;
        }
        Ok(())
    }
}

enum Lite<'c> {
    Plain(rusqlite::Statement<'c>),
    Cached(rusqlite::CachedStatement<'c>),
}

impl<'c> std::ops::Deref for Lite<'c> {
    type Target = rusqlite::Statement<'c>;
    fn deref(&self) -> &Self::Target {
        match self {
            Lite::Plain(s) => s,
            Lite::Cached(s) => s,
        }
    }
}

impl std::ops::DerefMut for Lite<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Lite::Plain(s) => s,
            Lite::Cached(s) => s,
        }
    }
}

/// A statement (prepared once per connection on both engines).
pub enum Stmt<'c> {
    #[allow(private_interfaces)]
    Sqlite(Lite<'c>),
    Pg(&'c PgConn, String),
}

impl Stmt<'_> {
    fn rows<P: Params>(&mut self, params: P) -> Result<Vec<Row>> {
        let v = params.values();
        match self {
            Stmt::Sqlite(s) => {
                let mut rows = s.query(rusqlite::params_from_iter(v.iter()))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(lite_row(r)?);
                }
                Ok(out)
            }
            Stmt::Pg(pg, sql) => pg.query(sql, v),
        }
    }

    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        let v = params.values();
        match self {
            Stmt::Sqlite(s) => Ok(s.execute(rusqlite::params_from_iter(v.iter()))?),
            Stmt::Pg(pg, sql) => pg.execute(sql, v),
        }
    }

    pub fn query_row<T, P: Params>(
        &mut self,
        params: P,
        f: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        match self {
            Stmt::Sqlite(s) => {
                let v = params.values();
                let mut rows = s.query(rusqlite::params_from_iter(v.iter()))?;
                match rows.next()? {
                    Some(r) => f(&lite_row(r)?),
                    None => Err(DbError::NoRows),
                }
            }
            Stmt::Pg(..) => f(self.rows(params)?.first().ok_or(DbError::NoRows)?),
        }
    }

    pub fn exists<P: Params>(&mut self, params: P) -> Result<bool> {
        match self {
            Stmt::Sqlite(s) => {
                let v = params.values();
                Ok(s.exists(rusqlite::params_from_iter(v.iter()))?)
            }
            Stmt::Pg(..) => Ok(!self.rows(params)?.is_empty()),
        }
    }

    /// Every row mapped (collected: results are pages, lists of hashes and the like).
    pub fn query_map<T, P: Params>(
        &mut self,
        params: P,
        mut f: impl FnMut(&Row) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let rows = self.rows(params)?;
        Ok(rows.iter().map(&mut f).collect::<Vec<_>>().into_iter())
    }
}

/// A transaction or a savepoint in one; rolled back when dropped uncommitted.
pub struct Tx<'c> {
    conn: &'c Conn,
    savepoint: Option<String>,
    done: bool,
}

impl std::ops::Deref for Tx<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn
    }
}

impl<'c> Tx<'c> {
    /// A savepoint inside this transaction.
    pub fn savepoint(&mut self) -> Result<Tx<'c>> {
        let name = format!(
            "sp{}",
            self.savepoint.as_ref().map_or(0, |s| s.len()) // nested ones get longer names
        );
        self.conn.execute_batch(&format!("SAVEPOINT {name}"))?;
        Ok(Tx {
            conn: self.conn,
            savepoint: Some(name),
            done: false,
        })
    }

    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        match &self.savepoint {
            None => self.conn.execute_batch("COMMIT"),
            Some(sp) => self.conn.execute_batch(&format!("RELEASE {sp}")),
        }
    }

    pub fn rollback(mut self) -> Result<()> {
        self.done = true;
        self.undo()
    }

    fn undo(&self) -> Result<()> {
        match &self.savepoint {
            None => self.conn.execute_batch("ROLLBACK"),
            Some(sp) => self
                .conn
                .execute_batch(&format!("ROLLBACK TO {sp}; RELEASE {sp}")),
        }
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.undo() {
                log::warn!("rollback failed: {e}");
            }
        }
    }
}

// ----- the store's lock -----

/// The store's connection behind its lock (see the module's comment: on PostgreSQL the lock
/// spans every process of the store).
pub struct Db {
    conn: Mutex<Conn>,
    engine: Engine,
    /// When [`Db::lock`] last gave up (the database down): the callers queued behind it try
    /// once each instead of waiting [`LOCK_RETRY`] one after another.
    gave_up: Mutex<Option<std::time::Instant>>,
}

/// The connection, locked.
pub struct Guard<'a> {
    conn: MutexGuard<'a, Conn>,
}

impl std::ops::Deref for Guard<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.conn.session_lock(false) {
            log::warn!("could not release the store's lock: {e}");
        }
    }
}

impl Db {
    pub fn new(conn: Conn, engine: Engine) -> Db {
        Db {
            conn: Mutex::new(conn),
            engine,
            gave_up: Mutex::new(None),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn is_pg(&self) -> bool {
        self.engine.is_pg()
    }

    /// Locks the store (see the module's comment). Fails only on PostgreSQL, when the lock
    /// cannot be taken within [`LOCK_RETRY`] (the database down): [`DbError::Unavailable`].
    pub fn lock(&self) -> Result<Guard<'_>> {
        // A panic while holding the lock cannot leave a transaction half-applied (it rolls back
        // on drop), so the connection is still good.
        let conn = relock(&self.conn);
        let gave_up = || relock(&self.gave_up);
        let last = *gave_up();
        let down = last.is_some_and(|t| t.elapsed() < LOCK_RETRY);
        let deadline = std::time::Instant::now() + if down { Duration::ZERO } else { LOCK_RETRY };
        loop {
            match conn.session_lock(true) {
                Ok(()) => {
                    if last.is_some() {
                        log::info!("the database answers again");
                    }
                    *gave_up() = None;
                    return Ok(Guard { conn });
                }
                // The database gone for a moment (the connection is made again on the next
                // call): wait a little, but never go on without the lock, which keeps other
                // servers from removing bytes this one records. Then the caller fails (a
                // request with 503; a background thread tries again later).
                Err(e) if std::time::Instant::now() < deadline => {
                    log::debug!("could not take the store's lock: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    *gave_up() = Some(std::time::Instant::now());
                    return Err(DbError::Unavailable(format!(
                        "the store's lock not taken in {LOCK_RETRY:?}: {e}"
                    )));
                }
            }
        }
    }

    /// The connection if nobody holds it (SQLite only: a cheap look that must never wait).
    pub fn try_lock_sqlite(&self) -> Option<MutexGuard<'_, Conn>> {
        if self.is_pg() {
            return None;
        }
        try_relock(&self.conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_and_phrases_are_spelled_for_postgres() {
        assert_eq!(
            pg_sql("SELECT '?' FROM temp.doomed WHERE a = ?1 AND b = ?12 LIMIT -1 OFFSET ?2"),
            "SELECT '?' FROM pg_temp.doomed WHERE a = $1 AND b = $12 LIMIT ALL OFFSET $2"
        );
        assert_eq!(pg_sql("pg_temp.x attempt.y"), "pg_temp.x attempt.y");
        // The advisory lock's key as the SQL spells it.
        assert_eq!(LOCK_KEY, 8530228277886219057);
    }

    #[test]
    fn values_read_back_as_their_types() {
        let c = Conn::sqlite(rusqlite::Connection::open_in_memory().unwrap());
        let (i, s, n, b): (i64, String, Option<i64>, Vec<u8>) = c
            .query_row(
                "SELECT ?1, ?2, ?3, ?4",
                params![7i64, "x", None::<i64>, vec![1u8, 2]],
                |r| Ok((r.get(0)?, r.get(1usize)?, r.get(2usize)?, r.get(3usize)?)),
            )
            .unwrap();
        assert_eq!((i, s.as_str(), n, b), (7, "x", None, vec![1, 2]));
        assert!(matches!(
            c.query_row("SELECT 1 WHERE 0", [], |r| r.get::<_, i64>(0)),
            Err(DbError::NoRows)
        ));
    }
}
