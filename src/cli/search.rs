//! `vaultfs search [DIR] QUERY`: full-text search of the built-in store or of a server logged
//! in with `vaultfs login` (`GET /search`); the public service has none, and says so. DIR, a
//! folder in a running mount, searches under it in that mount's store.

use std::path::Path;
use std::sync::Arc;

use clap::Args;

use super::{DataDir, control};
use crate::api::NodePath;
use crate::backend::Backend;
use crate::backend::local::LocalBackend;
use crate::backend::remote::RemoteBackend;
use crate::fs::status::StoreAt;
use crate::store::Store;

#[derive(Args)]
pub struct SearchArgs {
    /// [DIR] QUERY: the words to find (all of them; `word*` for a prefix), after a folder to
    /// search under: a folder in a running mount (`~/Vault/docs`: that mount's store is
    /// searched, and hits are shown as paths in the mount), or a vault path
    /// (`/Account/Vault/folder`)
    #[arg(value_name = "DIR_OR_WORD", required = true)]
    words: Vec<String>,
    #[command(flatten)]
    data: DataDir,
    /// Search a server instead of the built-in store (log in first with `vaultfs login`)
    #[arg(long, value_name = "URL", conflicts_with = "data_dir")]
    server: Option<String>,
    /// At most this many files
    #[arg(long, default_value_t = crate::api::search::DEFAULT_LIMIT, value_name = "N")]
    limit: u64,
    /// One JSON document (`hits`: `id`, `uri`, `context`; `more`) instead of lines
    #[arg(long)]
    json: bool,
}

/// The folder argument as a vault path.
fn vault_path(dir: &str) -> Result<NodePath, String> {
    if dir.starts_with("/nodes/pth") {
        return NodePath::parse_uri(dir).map_err(|e| e.to_string());
    }
    NodePath::from_segments(dir.split('/').filter(|s| !s.is_empty())).map_err(|e| e.to_string())
}

/// A folder on this machine inside a running mount (`~/Vault/docs`, `.` in the mount).
struct Mounted {
    /// The vault path it shows.
    dir: NodePath,
    store: StoreAt,
    /// What the mount point shows, and where it is.
    root: NodePath,
    mountpoint: std::path::PathBuf,
}

impl Mounted {
    /// A hit's path in the mount (the vault path where it is outside what the mount shows).
    fn local(&self, uri: &str) -> String {
        let Ok(p) = NodePath::parse_uri(uri) else {
            return uri.to_string();
        };
        if !self.root.contains(&p) && self.root != p {
            return uri.strip_prefix("/nodes/pth").unwrap_or(uri).to_string();
        }
        let rel = &p.segments()[self.root.segments().len()..];
        let mut local = self.mountpoint.clone();
        local.extend(rel);
        local.display().to_string()
    }
}

/// `dir` as a folder in a running mount: None for anything else; an error for a mount that
/// does not answer.
fn in_a_mount(dir: &str) -> Result<Option<Mounted>, String> {
    let local = Path::new(dir);
    if !local.is_dir() {
        return Ok(None);
    }
    let local = control::canonical(local);
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
            "the mount at {} does not say where its store is (a daemon of an older vaultfs: \
             give the vault path and --server or --data-dir)",
            mountpoint.display()
        )
    })?;
    let root = NodePath::parse_uri(&status.root).map_err(|e| e.to_string())?;
    let mut path = root.clone();
    let rel = local.strip_prefix(&mountpoint).unwrap_or(Path::new(""));
    for seg in rel.iter() {
        let seg = seg
            .to_str()
            .ok_or_else(|| format!("{}: not UTF-8", local.display()))?;
        path = path.child(seg).map_err(|e| e.to_string())?;
    }
    Ok(Some(Mounted {
        dir: path,
        store,
        root,
        mountpoint,
    }))
}

pub fn search(args: SearchArgs) -> Result<(), Box<dyn std::error::Error>> {
    // With more than one argument, the first is the folder when it is a path: a folder in a
    // mount, or a vault path.
    let mut words = args.words;
    let mut store = match &args.server {
        Some(url) => StoreAt::Server(url.clone()),
        None => StoreAt::DataDir(args.data.path()),
    };
    let mut dir = NodePath::root();
    let mut mounted = None;
    if words.len() > 1 {
        if let Some(m) = in_a_mount(&words[0])? {
            words.remove(0);
            (dir, store) = (m.dir.clone(), m.store.clone());
            mounted = Some(m);
        } else if words[0].starts_with('/') {
            dir = vault_path(&words.remove(0))?;
        }
    }
    let query = words.join(" ");
    let rt = tokio::runtime::Runtime::new()?;
    let found = match &store {
        StoreAt::Server(url) => {
            let creds = super::login::credentials_for(url)?;
            let backend = RemoteBackend::new(creds.remote_config())?;
            rt.block_on(backend.search(&dir, &query, args.limit))
        }
        StoreAt::DataDir(data_dir) => {
            // A search never makes a store where there is none.
            if !Store::is_in(data_dir) {
                return Err(format!(
                    "no built-in store in {}: give a folder in a mount, --data-dir of a store, \
                     or --server",
                    data_dir.display()
                )
                .into());
            }
            let store = Store::open_local(data_dir)
                .map_err(|e| format!("cannot open the store in {}: {e}", data_dir.display()))?;
            let store = Arc::new(store);
            let found = LocalBackend::new(store.clone());
            let found = rt.block_on(found.search(&dir, &query, args.limit));
            // Only a mount or `vaultfs serve` of the store makes the index (in idle time).
            if let Ok(n @ 1..) = store.search_backlog() {
                eprintln!(
                    "({n} file(s) not indexed yet: a mount or `vaultfs serve` of this store \
                     indexes them while it is idle)"
                );
            }
            found
        }
    }?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&found)?);
        return Ok(());
    }
    for hit in &found.hits {
        let path = match &mounted {
            Some(m) => m.local(&hit.uri),
            None => hit
                .uri
                .strip_prefix("/nodes/pth")
                .unwrap_or(&hit.uri)
                .to_string(),
        };
        println!("{path}\n    {}", hit.context);
    }
    if found.more && (found.hits.len() as u64) < args.limit.min(crate::store::MAX_SEARCH_LIMIT) {
        // Fewer than asked for, and more: the search stopped at its time bound.
        eprintln!(
            "(the search stopped at its time limit: more files may match; narrow it with more words or a folder)"
        );
    } else if found.more {
        eprintln!("(more files match: --limit {})", args.limit * 2);
    }
    Ok(())
}
