//! SQLite's side of [`Value`] and [`Row`]: values sent to rusqlite and rows read back.

use super::{Row, Value};

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

pub(super) fn lite_row(r: &rusqlite::Row) -> rusqlite::Result<Row> {
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
