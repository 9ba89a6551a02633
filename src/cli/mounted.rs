//! A path on this machine inside a running mount, and that mount's store: what `vaultfs search
//! ~/Vault/docs WORD` and `vaultfs restore ~/Vault/old-folder` reach. The daemon's status says
//! what the mount shows (`root`) and where its store is (`store`: a server logged in with
//! `vaultfs login`, or the built-in store's data dir); the command asks that store itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::control;
use crate::api::{DeletedFile, Node, NodePath, Result};
use crate::backend::Backend;
use crate::backend::local::LocalBackend;
use crate::backend::remote::RemoteBackend;
use crate::fs::status::StoreAt;
use crate::store::Store;

/// A folder (or a name in one) inside a running mount.
pub struct Mounted {
    /// The vault path it is.
    pub path: NodePath,
    pub store: StoreAt,
    /// What the mount point shows, and where it is.
    root: NodePath,
    mountpoint: PathBuf,
}

impl Mounted {
    /// `local` as a path in a running mount: None where no vaultfs mount holds it; an error
    /// for a mount that does not answer. `local` itself need not exist (a removed folder's
    /// path): its parent does.
    pub fn of(local: &Path) -> std::result::Result<Option<Mounted>, String> {
        let (dir, name) = match local.is_dir() {
            true => (local, None),
            false => match (local.parent(), local.file_name()) {
                (Some(p), Some(n)) if p.as_os_str().is_empty() => (Path::new("."), Some(n)),
                (Some(p), Some(n)) => (p, Some(n)),
                _ => return Ok(None),
            },
        };
        if !dir.is_dir() {
            return Ok(None);
        }
        let mut local = control::canonical(dir);
        if let Some(n) = name {
            local.push(n);
        }
        let Some(mountpoint) = control::mount_of(&local) else {
            return Ok(None);
        };
        let status = match control::status(&mountpoint) {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(format!("the mount at {}: {e}", mountpoint.display())),
            None => {
                return Err(format!(
                    "no vaultfs daemon answers for the mount at {}",
                    mountpoint.display()
                ));
            }
        };
        let store = status.store.ok_or_else(|| {
            format!(
                "the mount at {} does not say where its store is (a daemon of an older \
                 vaultfs: remount it)",
                mountpoint.display()
            )
        })?;
        let root = NodePath::parse_uri(&status.root).map_err(|e| e.to_string())?;
        let mut path = root.clone();
        for seg in local.strip_prefix(&mountpoint).unwrap_or(Path::new("")) {
            let seg = seg
                .to_str()
                .ok_or_else(|| format!("{}: not UTF-8", local.display()))?;
            path = path.child(seg).map_err(|e| e.to_string())?;
        }
        Ok(Some(Mounted {
            path,
            store,
            root,
            mountpoint,
        }))
    }

    /// A node's path in the mount (the vault path where it is outside what the mount shows).
    pub fn local(&self, uri: &str) -> String {
        let Ok(p) = NodePath::parse_uri(uri) else {
            return uri.to_string();
        };
        if !self.root.contains(&p) && self.root != p {
            return uri.strip_prefix("/nodes/pth").unwrap_or(uri).to_string();
        }
        let mut local = self.mountpoint.clone();
        local.extend(&p.segments()[self.root.segments().len()..]);
        local.display().to_string()
    }
}

/// A store a command talks to directly.
pub enum Client {
    Local(LocalBackend, Arc<Store>),
    Remote(RemoteBackend),
}

impl Client {
    /// The store at `at`; never makes one (a data dir without a store is an error).
    pub fn open(at: &StoreAt) -> std::result::Result<Client, String> {
        match at {
            StoreAt::Server(url) => {
                let creds = super::login::credentials_for(url)?;
                let backend =
                    RemoteBackend::new(creds.remote_config()).map_err(|e| e.to_string())?;
                Ok(Client::Remote(backend))
            }
            StoreAt::DataDir(dir) => {
                if !Store::is_in(dir) {
                    return Err(format!(
                        "no built-in store in {}: give a folder in a mount, --data-dir of a \
                         store, or --server",
                        dir.display()
                    ));
                }
                let store = Store::open_local(dir)
                    .map_err(|e| format!("cannot open the store in {}: {e}", dir.display()))?;
                let store = Arc::new(store);
                Ok(Client::Local(LocalBackend::new(store.clone()), store))
            }
        }
    }

    /// The files and folders deleted from the folder `path`, kept restorable.
    pub async fn deleted_files(&self, path: &NodePath) -> Result<Vec<DeletedFile>> {
        match self {
            Client::Local(b, _) => b.deleted_files(path).await,
            Client::Remote(b) => b.deleted_files(path).await,
        }
    }

    /// Brings the deleted file or folder `id` back.
    pub async fn restore_deleted(&self, id: &str) -> Result<Node> {
        match self {
            Client::Local(b, _) => b.restore_deleted(id).await,
            Client::Remote(b) => b.restore_deleted(id).await,
        }
    }
}
