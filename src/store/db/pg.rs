//! PostgreSQL's side: values sent and read by their column types, the statements as PostgreSQL
//! spells them ([`pg_sql`]), and the connection ([`PgConn`]; see the parent module's comment).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::{DbError, Result, Row, Value};

/// How long a connection to PostgreSQL may take to be made (unless the address says).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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

struct PgState {
    url: String,
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
    /// A statement failed since the last `BEGIN` or `ROLLBACK [TO]`: the transaction, if one is
    /// open, is aborted.
    failed: bool,
}

impl PgState {
    /// Runs a statement, noting whether it failed.
    fn noted<T>(&mut self, f: impl FnOnce(&mut PgState) -> Result<T>) -> Result<T> {
        let r = f(self);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

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
    let (address, tls) = super::tls::split_options(url)?;
    let mut config: postgres::Config = address
        .parse()
        .map_err(|e| DbError::Other(format!("bad database address: {e}")))?;
    // A host that does not answer at all fails a request in bounded time, as a down one does.
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    // A local socket has no TLS (the server refuses it there), as libpq skips it.
    let socket_only = config
        .get_hosts()
        .iter()
        .all(|h| matches!(h, postgres::config::Host::Unix(_)));
    let mut client = match super::tls::connector(&tls)? {
        Some(tls_connect) if !socket_only => {
            config.ssl_mode(if tls.mode == super::tls::SslMode::Prefer {
                postgres::config::SslMode::Prefer
            } else {
                postgres::config::SslMode::Require
            });
            config.connect(tls_connect)?
        }
        _ => config.connect(postgres::NoTls)?,
    };
    // Times and names are compared as bytes, as SQLite does; no statement waits forever on a
    // lock a dead peer held (its session ends with its socket).
    client.batch_execute("SET client_min_messages = warning")?;
    // Commits not flushed one by one, as SQLite's synchronous=NORMAL; the durable ones say so
    // (`schema::Durable`).
    client.batch_execute("SET synchronous_commit = off")?;
    Ok(client)
}

/// A PostgreSQL connection, used by one thread at a time (the pool's or the store's lock hands
/// it out): each call runs on the calling thread.
pub struct PgConn {
    /// Boxed: a connection of either engine is passed around by value.
    state: Box<Mutex<PgState>>,
}

/// Runs `f`, which blocks on the client's own runtime, where that is allowed: on a plain thread
/// or a blocking-pool thread as it is (the server's requests: a statement is one socket round
/// trip, no thread hand-off); on a worker of a multi-thread runtime after telling it
/// (`block_in_place`); on a current-thread runtime (a test's), whose thread may be inside its
/// own `block_on`, on a scoped thread.
fn on_blocking_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Err(_) => f(),
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| {
            s.spawn(f)
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        }),
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        // Closing the client blocks on its runtime too (and drops it).
        let client = crate::sync::relock(&self.state).client.take();
        on_blocking_thread(move || drop(client));
    }
}

impl PgConn {
    pub fn open(url: &str) -> Result<PgConn> {
        let mut state = PgState {
            client: None,
            statements: HashMap::new(),
            url: url.to_string(),
            failed: false,
        };
        on_blocking_thread(|| state.client().map(drop))?;
        Ok(PgConn {
            state: Box::new(Mutex::new(state)),
        })
    }

    fn call<T: Send>(&self, f: impl FnOnce(&mut PgState) -> T + Send) -> T {
        let mut state = crate::sync::relock(&self.state);
        let state: &mut PgState = &mut state;
        on_blocking_thread(|| f(state))
    }

    pub(super) fn query(&self, sql: &str, params: Vec<Value>) -> Result<Vec<Row>> {
        self.call(|s| s.noted(|s| s.query(sql, &params)))
    }

    pub(super) fn execute(&self, sql: &str, params: Vec<Value>) -> Result<usize> {
        self.call(|s| s.noted(|s| s.execute(sql, &params)))
    }

    pub(super) fn batch(&self, sql: &str) -> Result<()> {
        let sql = pg_sql(sql);
        self.call(|s| {
            if sql.starts_with("BEGIN") || sql.starts_with("ROLLBACK") {
                s.failed = false;
            } else if sql == "COMMIT" && s.failed {
                // PostgreSQL answers a COMMIT of a transaction a statement failed in with a
                // rollback, not an error: it must not pass for a commit.
                s.failed = false;
                s.client()?.batch_execute("ROLLBACK")?;
                return Err(DbError::Other(
                    "a statement of the transaction failed: it was rolled back".into(),
                ));
            }
            s.noted(|s| Ok(s.client()?.batch_execute(&sql)?))
        })
    }
}

/// A connection of its own that `LISTEN`s on `channel` (the change feed's: one per server,
/// held by a thread that waits on nothing else).
pub struct PgListener(postgres::Client);

impl PgListener {
    pub fn open(url: &str, channel: &str) -> Result<PgListener> {
        let mut client = connect(url)?;
        client.batch_execute(&format!("LISTEN {channel}"))?;
        Ok(PgListener(client))
    }

    /// The payloads of the notifications that come within `timeout` (waits for the first, then
    /// takes what is there); an error once the connection is lost.
    pub fn wait(&mut self, timeout: Duration) -> Result<Vec<String>> {
        use postgres::fallible_iterator::FallibleIterator;
        let mut got = Vec::new();
        let mut notes = self.0.notifications();
        let first = notes.timeout_iter(timeout).next()?;
        if let Some(n) = first {
            got.push(n.payload().to_string());
            let mut rest = notes.iter();
            while let Some(n) = rest.next()? {
                got.push(n.payload().to_string());
            }
        }
        drop(notes);
        if self.0.is_closed() {
            return Err(DbError::Unavailable(
                "the listening connection was closed".into(),
            ));
        }
        Ok(got)
    }
}
