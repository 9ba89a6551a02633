//! What WebDAV keeps beside the tree (issue 50, `server::dav`): the dead properties clients set
//! with PROPPATCH (Windows Explorer its Win32 times, macOS Finder its own, any client its
//! metadata), by node, so that they follow a node's moves and renames and go with it when it
//! is deleted for good (`ON DELETE CASCADE`). In the database, so every server of one
//! PostgreSQL sees them.

use super::db::params;
use super::nodes::resolve;
use super::{Scope, Store};
use crate::api::{Error, ErrorKind, NodePath, Result};

/// Dead properties one node may hold.
pub const MAX_PROPS_PER_NODE: i64 = 256;
/// The largest value of one (its XML).
pub const MAX_PROP_BYTES: usize = 64 * 1024;

/// A dead property: its name in its namespace (`""` for none), the prefix the client wrote, and
/// its value as XML (`None` when only names were asked for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadProp {
    pub namespace: String,
    pub name: String,
    pub prefix: Option<String>,
    pub xml: Option<Vec<u8>>,
}

impl Store {
    /// The dead properties of the node at `path`, by namespace and name.
    pub fn dead_props(&self, scope: Scope, path: &NodePath) -> Result<Vec<DeadProp>> {
        if path.is_root() {
            return Ok(Vec::new());
        }
        let conn = self.conn()?;
        let snapshot = conn.snapshot()?;
        let node = resolve(&snapshot, scope, path)?;
        let props = snapshot
            .prepare_cached(
                "SELECT namespace, name, prefix, xml FROM dav_props WHERE node_id = ?1
                 ORDER BY namespace, name",
            )?
            .query_map([node.id], |r| {
                Ok(DeadProp {
                    namespace: r.get(0)?,
                    name: r.get(1)?,
                    prefix: r.get(2)?,
                    xml: r.get(3)?,
                })
            })?
            .collect::<super::db::Result<Vec<_>>>()?;
        Ok(props)
    }

    /// Sets (`true`) and removes (`false`) dead properties of the node at `path`, all or none:
    /// 507 `too_many_properties` past [`MAX_PROPS_PER_NODE`], 413 past [`MAX_PROP_BYTES`].
    pub fn patch_dead_props(
        &self,
        scope: Scope,
        path: &NodePath,
        patch: &[(bool, DeadProp)],
    ) -> Result<()> {
        if path.is_root() {
            return Err(Error::new(
                ErrorKind::Forbidden,
                "forbidden",
                "the root has no properties to set",
            ));
        }
        if let Some((_, p)) = patch
            .iter()
            .find(|(_, p)| p.xml.as_ref().is_some_and(|x| x.len() > MAX_PROP_BYTES))
        {
            return Err(Error::new(
                ErrorKind::TooLarge,
                "property_too_large",
                format!(
                    "the value of property {} is over {MAX_PROP_BYTES} bytes",
                    p.name
                ),
            ));
        }
        let conn = self.conn()?;
        let tx = conn.transaction()?;
        let node = resolve(&tx, scope, path)?;
        for (set, p) in patch {
            if *set {
                tx.prepare_cached(
                    "INSERT INTO dav_props (node_id, namespace, name, prefix, xml)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (node_id, namespace, name)
                     DO UPDATE SET prefix = excluded.prefix, xml = excluded.xml",
                )?
                .execute(params![
                    node.id,
                    p.namespace,
                    p.name,
                    p.prefix,
                    p.xml
                ])?;
            } else {
                tx.prepare_cached(
                    "DELETE FROM dav_props WHERE node_id = ?1 AND namespace = ?2 AND name = ?3",
                )?
                .execute(params![node.id, p.namespace, p.name])?;
            }
        }
        let held: i64 = tx
            .prepare_cached("SELECT count(*) FROM dav_props WHERE node_id = ?1")?
            .query_row([node.id], |r| r.get(0))?;
        if held > MAX_PROPS_PER_NODE {
            // Dropped uncommitted: nothing of the patch is kept.
            return Err(Error::new(
                ErrorKind::InsufficientStorage,
                "too_many_properties",
                format!("{path} would hold more than {MAX_PROPS_PER_NODE} properties"),
            ));
        }
        tx.commit()?;
        Ok(())
    }
}
